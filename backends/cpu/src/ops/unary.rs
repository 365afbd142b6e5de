//! Every unary table row through one kernel, monomorphised per op.

use crate::{fill_strided, map_strided, Cpu};
use forma_core::ops::unary::{UnaryKernel, UnaryOp};
use forma_core::{Float, Layout, Result};

impl<E: Float> UnaryKernel<E> for Cpu {
    fn unary<Op: UnaryOp>(&self, op: Op, x: &Vec<E>, layout: &Layout) -> Result<Vec<E>> {
        let mut out = vec![E::default(); layout.numel()];
        fill_strided(&mut out, layout, |o| E::from_acc(op.f(x[o].to_acc())));
        Ok(out)
    }

    fn unary_backward<Op: UnaryOp>(
        &self,
        op: Op,
        x: &Vec<E>,
        lx: &Layout,
        y: &Vec<E>,
        ly: &Layout,
        g: &Vec<E>,
        lg: &Layout,
    ) -> Result<Vec<E>> {
        let mut out = vec![E::default(); lx.numel()];
        map_strided(&mut out, [lx, ly, lg], |[i, j, k]| {
            E::from_acc(g[k].to_acc() * op.df(x[i].to_acc(), y[j].to_acc()))
        });
        Ok(out)
    }
}
