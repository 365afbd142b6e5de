//! Every binary table row through one kernel, monomorphised per op; slice
//! loops when both operands are dense, one is a scalar, or they broadcast by
//! rows.

use crate::dense::{broadcast_scalar, dense_slices, map, Elementwise};
use crate::rows::Rows;
use crate::{collect_strided, map_strided, Cpu};
use forma_core::ops::binary::{BinaryKernel, BinaryOp};
use forma_core::{Float, Layout, Result};

/// Fills `out` with `f(a[i], b[i])` over two views of the output's sizes.
pub(crate) fn zip_strided<A: Copy + Sync, B: Copy + Sync, T: Copy + Send>(
    out: &mut [T],
    a: &[A],
    la: &Layout,
    b: &[B],
    lb: &Layout,
    f: impl Fn(A, B) -> T + Sync,
) {
    map_strided(out, [la, lb], |[i, j]| f(a[i], b[j]));
}

/// `op(a, b)`, computed in the accumulation type.
struct Forward<Op>(Op);

impl<E: Float, Op: BinaryOp> Elementwise<E, 2> for Forward<Op> {
    type Out = E;
    #[inline(always)]
    fn at(&self, [a, b]: [E; 2]) -> E {
        E::from_acc(self.0.f(a.to_acc(), b.to_acc()))
    }
}

/// `op(a, b)` with one operand a fixed scalar (`x * 0.9`, as optimizers
/// do): the right one when `right`, else the left.
struct WithScalar<Op, E> {
    op: Op,
    value: E,
    right: bool,
}

impl<E: Float, Op: BinaryOp> Elementwise<E, 1> for WithScalar<Op, E> {
    type Out = E;
    #[inline(always)]
    fn at(&self, [x]: [E; 1]) -> E {
        let (a, b) = if self.right {
            (x, self.value)
        } else {
            (self.value, x)
        };
        E::from_acc(self.op.f(a.to_acc(), b.to_acc()))
    }
}

/// One operand's gradient, `g * d op / d a` (`SECOND` false) or
/// `g * d op / d b` (true).
struct Grad<Op, const SECOND: bool>(Op);

impl<E: Float, Op: BinaryOp, const SECOND: bool> Elementwise<E, 3> for Grad<Op, SECOND> {
    type Out = E;
    #[inline(always)]
    fn at(&self, [a, b, g]: [E; 3]) -> E {
        let (da, db) = self.0.df(a.to_acc(), b.to_acc());
        E::from_acc(g.to_acc() * if SECOND { db } else { da })
    }
}

impl<E: Float> BinaryKernel<E> for Cpu {
    fn binary<Op: BinaryOp>(
        &self,
        op: Op,
        a: &Vec<E>,
        la: &Layout,
        b: &Vec<E>,
        lb: &Layout,
    ) -> Result<Vec<E>> {
        if let Some(dense) = dense_slices([a, b], [la, lb]) {
            return Ok(map(dense, Forward(op)));
        }
        if let (Some(dense), Some(value)) = (dense_slices([a], [la]), broadcast_scalar(b, lb)) {
            let right = true;
            return Ok(map(dense, WithScalar { op, value, right }));
        }
        if let (Some(value), Some(dense)) = (broadcast_scalar(a, la), dense_slices([b], [lb])) {
            let right = false;
            return Ok(map(dense, WithScalar { op, value, right }));
        }
        if let Some(rows) = Rows::plan([la, lb]) {
            return Ok(rows.map([a, b], Forward(op)));
        }
        Ok(collect_strided([la, lb], |[i, j]| {
            Forward(op).at([a[i], b[j]])
        }))
    }

    fn binary_backward<Op: BinaryOp>(
        &self,
        op: Op,
        a: &Vec<E>,
        la: &Layout,
        b: &Vec<E>,
        lb: &Layout,
        g: &Vec<E>,
        lg: &Layout,
    ) -> Result<(Vec<E>, Vec<E>)> {
        let (da, db) = (Grad::<Op, false>(op), Grad::<Op, true>(op));
        if let Some(dense) = dense_slices([a, b, g], [la, lb, lg]) {
            return Ok((map(dense, da), map(dense, db)));
        }
        let layouts = [la, lb, lg];
        if let Some(rows) = Rows::plan(layouts) {
            return Ok((rows.map([a, b, g], da), rows.map([a, b, g], db)));
        }
        let ga = collect_strided(layouts, |[i, j, k]| da.at([a[i], b[j], g[k]]));
        let gb = collect_strided(layouts, |[i, j, k]| db.at([a[i], b[j], g[k]]));
        Ok((ga, gb))
    }
}
