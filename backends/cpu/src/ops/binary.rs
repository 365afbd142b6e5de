//! Every binary table row through one kernel, monomorphised per op; a fast
//! path when both operands are dense and unbroadcast.

use crate::{map_strided, Cpu};
use forma_core::ops::binary::{BinaryKernel, BinaryOp};
use forma_core::{Float, Layout, Result};

/// Fills `out` with `f(a[i], b[i])` over two views of the output's sizes.
pub(crate) fn zip_strided<A: Copy + Sync, B: Copy + Sync, T: Send>(
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
        let mut out = vec![E::default(); la.numel()];
        zip_strided(&mut out, a, la, b, lb, |x: E, y: E| {
            E::from_acc(op.f(x.to_acc(), y.to_acc()))
        });
        Ok(out)
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
        let n = lg.numel();
        let (mut ga, mut gb) = (vec![E::default(); n], vec![E::default(); n]);
        let d = |[i, j, k]: [usize; 3]| (a[i].to_acc(), b[j].to_acc(), g[k].to_acc());
        map_strided(&mut ga, [la, lb, lg], |o| {
            let (x, y, gv) = d(o);
            E::from_acc(gv * op.df(x, y).0)
        });
        map_strided(&mut gb, [la, lb, lg], |o| {
            let (x, y, gv) = d(o);
            E::from_acc(gv * op.df(x, y).1)
        });
        Ok((ga, gb))
    }
}
