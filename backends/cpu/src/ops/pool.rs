//! Pooling.

use crate::Cpu;
use forma_core::ops::pool::{Pool2dParams, PoolKernel};
use forma_core::{Error, Float, Layout, Result};

impl<E: Float> PoolKernel<E> for Cpu {
    fn max_pool2d(
        &self,
        _x: &Vec<E>,
        _lx: &Layout,
        _p: &Pool2dParams,
        _out: [usize; 2],
    ) -> Result<Vec<E>> {
        Err(Error::invalid(
            "max_pool2d",
            "not yet implemented on the CPU",
        ))
    }
    fn avg_pool2d(
        &self,
        _x: &Vec<E>,
        _lx: &Layout,
        _p: &Pool2dParams,
        _out: [usize; 2],
    ) -> Result<Vec<E>> {
        Err(Error::invalid(
            "avg_pool2d",
            "not yet implemented on the CPU",
        ))
    }
}
