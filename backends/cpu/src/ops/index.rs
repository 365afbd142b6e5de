//! Index kernels.

use crate::Cpu;
use forma_core::ops::index::IndexKernel;
use forma_core::{Error, Float, Layout, Result};

impl<E: Float> IndexKernel<E> for Cpu {
    fn index_select(
        &self,
        _x: &Vec<E>,
        _lx: &Layout,
        _axis: usize,
        _idx: &Vec<i64>,
        _li: &Layout,
    ) -> Result<Vec<E>> {
        Err(Error::invalid(
            "index_select",
            "not yet implemented on the CPU",
        ))
    }
    fn gather(
        &self,
        _x: &Vec<E>,
        _lx: &Layout,
        _axis: usize,
        _idx: &Vec<i64>,
        _li: &Layout,
    ) -> Result<Vec<E>> {
        Err(Error::invalid("gather", "not yet implemented on the CPU"))
    }
    fn scatter_add(
        &self,
        _x: &Vec<E>,
        _lx: &Layout,
        _axis: usize,
        _idx: &Vec<i64>,
        _li: &Layout,
        _src: &Vec<E>,
        _ls: &Layout,
    ) -> Result<Vec<E>> {
        Err(Error::invalid(
            "scatter_add",
            "not yet implemented on the CPU",
        ))
    }
}
