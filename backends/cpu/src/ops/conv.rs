//! Convolution.

use crate::Cpu;
use forma_core::ops::conv::{Conv2dParams, ConvKernel};
use forma_core::{Error, Float, Layout, Result};

impl<E: Float> ConvKernel<E> for Cpu {
    fn conv2d(
        &self,
        _x: &Vec<E>,
        _lx: &Layout,
        _w: &Vec<E>,
        _lw: &Layout,
        _p: &Conv2dParams,
    ) -> Result<Vec<E>> {
        Err(Error::invalid("conv2d", "not yet implemented on the CPU"))
    }
}
