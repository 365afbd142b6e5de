//! Every binary table row through one kernel, monomorphised per op; a fast
//! path when both operands are dense and unbroadcast.

use crate::dense::{broadcast_scalar, dense_slices, map1, map2, map3};
use crate::rows::{zip2, zip3, Rows};
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

impl<E: Float> BinaryKernel<E> for Cpu {
    fn binary<Op: BinaryOp>(
        &self,
        op: Op,
        a: &Vec<E>,
        la: &Layout,
        b: &Vec<E>,
        lb: &Layout,
    ) -> Result<Vec<E>> {
        let f = |x: E, y: E| E::from_acc(op.f(x.to_acc(), y.to_acc()));
        if let Some([a, b]) = dense_slices([a, b], [la, lb]) {
            return Ok(map2(a, b, f));
        }
        // A tensor with a scalar (`x * 0.9`, as optimizers do): one slice loop.
        if let (Some([a]), Some(y)) = (dense_slices([a], [la]), broadcast_scalar(b, lb)) {
            return Ok(map1(a, |x| f(x, y)));
        }
        if let (Some(x), Some([b])) = (broadcast_scalar(a, la), dense_slices([b], [lb])) {
            return Ok(map1(b, |y| f(x, y)));
        }
        if let Some(rows) = Rows::plan([la, lb]) {
            return Ok(rows.build(|[ia, ib], out| zip2(out, (a, ia), (b, ib), f)));
        }
        Ok(collect_strided([la, lb], |[i, j]| f(a[i], b[j])))
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
        let da = |x: E, y: E, g: E| E::from_acc(g.to_acc() * op.df(x.to_acc(), y.to_acc()).0);
        let db = |x: E, y: E, g: E| E::from_acc(g.to_acc() * op.df(x.to_acc(), y.to_acc()).1);
        if let Some([a, b, g]) = dense_slices([a, b, g], [la, lb, lg]) {
            return Ok((map3(a, b, g, da), map3(a, b, g, db)));
        }
        let layouts = [la, lb, lg];
        if let Some(rows) = Rows::plan(layouts) {
            let ga = rows.build(|[ia, ib, ig], out| zip3(out, (a, ia), (b, ib), (g, ig), da));
            let gb = rows.build(|[ia, ib, ig], out| zip3(out, (a, ia), (b, ib), (g, ig), db));
            return Ok((ga, gb));
        }
        let ga = collect_strided(layouts, |[i, j, k]| da(a[i], b[j], g[k]));
        let gb = collect_strided(layouts, |[i, j, k]| db(a[i], b[j], g[k]));
        Ok((ga, gb))
    }
}
