//! Reductions along one axis.

use crate::Cpu;
use forma_core::ops::reduce::{ArgReduceOp, ReduceKernel, ReduceOp};
use forma_core::{Error, Float, Layout, Result};

impl<E: Float> ReduceKernel<E> for Cpu {
    fn reduce(&self, _op: ReduceOp, _x: &Vec<E>, _layout: &Layout, _axis: usize) -> Result<Vec<E>> {
        Err(Error::invalid("reduce", "not yet implemented on the CPU"))
    }
    fn arg_reduce(
        &self,
        _op: ArgReduceOp,
        _x: &Vec<E>,
        _layout: &Layout,
        _axis: usize,
    ) -> Result<Vec<i64>> {
        Err(Error::invalid(
            "arg_reduce",
            "not yet implemented on the CPU",
        ))
    }
}
