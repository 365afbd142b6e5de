//! Every unary table row through one kernel, monomorphised per op; a
//! vectorisable slice loop when the operands are dense or broadcast by rows.

use crate::dense::{dense_slices, map, Elementwise};
use crate::rows::Rows;
use crate::{collect_strided, Cpu};
use forma_core::ops::unary::{UnaryKernel, UnaryOp};
use forma_core::{Float, Layout, Result};

/// `op(x)`, computed in the accumulation type.
struct Forward<Op>(Op);

impl<E: Float, Op: UnaryOp> Elementwise<E, 1> for Forward<Op> {
    type Out = E;
    #[inline(always)]
    fn at(&self, [x]: [E; 1]) -> E {
        E::from_acc(self.0.f(x.to_acc()))
    }
}

/// `g * op'(x, y)`: the input's gradient from the output gradient `g`.
struct Backward<Op>(Op);

impl<E: Float, Op: UnaryOp> Elementwise<E, 3> for Backward<Op> {
    type Out = E;
    #[inline(always)]
    fn at(&self, [x, y, g]: [E; 3]) -> E {
        E::from_acc(g.to_acc() * self.0.df(x.to_acc(), y.to_acc()))
    }
}

impl<E: Float> UnaryKernel<E> for Cpu {
    fn unary<Op: UnaryOp>(&self, op: Op, x: &Vec<E>, layout: &Layout) -> Result<Vec<E>> {
        if let Some(dense) = dense_slices([x], [layout]) {
            return Ok(map(dense, Forward(op)));
        }
        if let Some(rows) = Rows::plan([layout]) {
            return Ok(rows.map([x], Forward(op)));
        }
        Ok(collect_strided([layout], |[o]| Forward(op).at([x[o]])))
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
        if let Some(dense) = dense_slices([x, y, g], [lx, ly, lg]) {
            return Ok(map(dense, Backward(op)));
        }
        if let Some(rows) = Rows::plan([lx, ly, lg]) {
            return Ok(rows.map([x, y, g], Backward(op)));
        }
        Ok(collect_strided([lx, ly, lg], |[i, j, k]| {
            Backward(op).at([x[i], y[j], g[k]])
        }))
    }
}
