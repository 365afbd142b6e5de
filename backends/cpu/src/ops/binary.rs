//! Every binary table row through one kernel, monomorphised per op; a fast
//! path when both operands are dense and unbroadcast.

use crate::strided::StridedIter;
use crate::{Cpu, PAR_CHUNK};
use forma_core::ops::binary::{BinaryKernel, BinaryOp};
use forma_core::{Float, Layout, Result};
use rayon::prelude::*;

/// Fills `out` with `f(a[i], b[i])` over two views of the output's sizes.
pub(crate) fn zip_strided<A: Copy + Sync, B: Copy + Sync, T: Send>(
    out: &mut [T],
    a: &[A],
    la: &Layout,
    b: &[B],
    lb: &Layout,
    f: impl Fn(A, B) -> T + Sync,
) {
    if let (Some(ra), Some(rb)) = (la.contiguous_range(), lb.contiguous_range()) {
        let (a, b) = (&a[ra], &b[rb]);
        if out.len() >= 2 * PAR_CHUNK {
            out.par_chunks_mut(PAR_CHUNK)
                .zip(a.par_chunks(PAR_CHUNK).zip(b.par_chunks(PAR_CHUNK)))
                .for_each(|(o, (a, b))| {
                    for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
                        *o = f(a, b);
                    }
                });
        } else {
            for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
                *o = f(a, b);
            }
        }
        return;
    }
    let run = |start: usize, chunk: &mut [T]| {
        let mut ia = StridedIter::new(la, start);
        let mut ib = StridedIter::new(lb, start);
        for o in chunk.iter_mut() {
            *o = f(a[ia.next_offset()], b[ib.next_offset()]);
        }
    };
    if out.len() >= 2 * PAR_CHUNK {
        out.par_chunks_mut(PAR_CHUNK)
            .enumerate()
            .for_each(|(c, chunk)| run(c * PAR_CHUNK, chunk));
    } else {
        run(0, out);
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
        let (mut ia, mut ib, mut ig) = (
            StridedIter::new(la, 0),
            StridedIter::new(lb, 0),
            StridedIter::new(lg, 0),
        );
        let (mut ga, mut gb) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let (x, y, d) = (
                a[ia.next_offset()].to_acc(),
                b[ib.next_offset()].to_acc(),
                g[ig.next_offset()].to_acc(),
            );
            let (dx, dy) = op.df(x, y);
            ga.push(E::from_acc(d * dx));
            gb.push(E::from_acc(d * dy));
        }
        Ok((ga, gb))
    }
}
