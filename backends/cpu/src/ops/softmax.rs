//! Softmax along one axis.

use crate::Cpu;
use forma_core::ops::softmax::SoftmaxKernel;
use forma_core::{Error, Float, Layout, Result};

impl<E: Float> SoftmaxKernel<E> for Cpu {
    fn softmax(&self, _x: &Vec<E>, _layout: &Layout, _axis: usize, _log: bool) -> Result<Vec<E>> {
        Err(Error::invalid("softmax", "not yet implemented on the CPU"))
    }
}
