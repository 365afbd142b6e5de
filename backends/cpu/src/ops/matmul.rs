//! Matrix products.

use crate::Cpu;
use forma_core::ops::matmul::MatmulKernel;
use forma_core::{Error, Float, Layout, Result};

impl<E: Float> MatmulKernel<E> for Cpu {
    fn matmul(&self, _a: &Vec<E>, _la: &Layout, _b: &Vec<E>, _lb: &Layout) -> Result<Vec<E>> {
        Err(Error::invalid("matmul", "not yet implemented on the CPU"))
    }
}
