//! Every unary table row through one kernel, monomorphised per op.

use crate::strided::StridedIter;
use crate::{fill_strided, Cpu};
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
        let n = lx.numel();
        let (mut ix, mut iy, mut ig) = (
            StridedIter::new(lx, 0),
            StridedIter::new(ly, 0),
            StridedIter::new(lg, 0),
        );
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let (a, b, d) = (
                x[ix.next_offset()].to_acc(),
                y[iy.next_offset()].to_acc(),
                g[ig.next_offset()].to_acc(),
            );
            out.push(E::from_acc(d * op.df(a, b)));
        }
        Ok(out)
    }
}
