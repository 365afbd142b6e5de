//! Fused expressions chosen at run time (a compiled graph's chains of
//! elementwise nodes): each row becomes its monomorphised block loop once
//! per call, and the expression runs block by block, every intermediate a
//! block of [`LANES`] values that stays in L1, so memory is read once per
//! input and written once.

use crate::simd::Vectorized;
use forma_core::graph::Elem;
use forma_core::ops::binary::BinaryOp;
use forma_core::ops::fused::{visit_row, RowVisitor};
use forma_core::ops::unary::UnaryOp;
use forma_core::shape::MAX_RANK;
use forma_core::{Error, Float, Layout, Result};
use std::marker::PhantomData;
use std::mem::MaybeUninit;

/// Values per block: every step's block of f32 takes 2 KiB, so an
/// expression of a dozen steps keeps its blocks in L1.
const LANES: usize = 512;

type UnaryFn<E> = Box<dyn Fn(&[E], &mut [E]) + Send + Sync>;
type BinaryFn<E> = Box<dyn Fn(&[E], &[E], &mut [E]) + Send + Sync>;

/// One node of the expression, ready to run on a block.
enum Step<E> {
    /// Loads input `i`'s block.
    Arg(usize),
    /// A unary row on step `x`'s block.
    Unary(UnaryFn<E>, usize),
    /// A binary row on steps `a` and `b`.
    Binary(BinaryFn<E>, usize, usize),
}

/// Makes a row's block loop.
struct Kernel<E>(PhantomData<E>);

enum RowFn<E> {
    Unary(UnaryFn<E>),
    Binary(BinaryFn<E>),
}

impl<E: Float> RowVisitor for Kernel<E> {
    type Out = RowFn<E>;
    fn unary<Op: UnaryOp>(self, op: Op) -> RowFn<E> {
        RowFn::Unary(Box::new(move |x, out| {
            crate::simd::run(UnaryBlock { op, x, out })
        }))
    }
    fn binary<Op: BinaryOp>(self, op: Op) -> RowFn<E> {
        RowFn::Binary(Box::new(move |a, b, out| {
            crate::simd::run(BinaryBlock { op, a, b, out })
        }))
    }
}

/// `op` over a block, rounding to `E` as the op's own kernel does.
struct UnaryBlock<'a, Op, E> {
    op: Op,
    x: &'a [E],
    out: &'a mut [E],
}

impl<Op: UnaryOp, E: Float> Vectorized for UnaryBlock<'_, Op, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        for (o, &v) in self.out.iter_mut().zip(self.x) {
            *o = E::from_acc(self.op.f(v.to_acc()));
        }
    }
}

/// `op` over two blocks.
struct BinaryBlock<'a, Op, E> {
    op: Op,
    a: &'a [E],
    b: &'a [E],
    out: &'a mut [E],
}

impl<Op: BinaryOp, E: Float> Vectorized for BinaryBlock<'_, Op, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        for ((o, &x), &y) in self.out.iter_mut().zip(self.a).zip(self.b) {
            *o = E::from_acc(self.op.f(x.to_acc(), y.to_acc()));
        }
    }
}

/// An input's view with its axes merged where memory allows (a dense view
/// becomes one run, a per-channel broadcast a few), so blocks load in long
/// runs of one stride.
struct Runs {
    offset: usize,
    dims: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
    rank: usize,
}

impl Runs {
    fn new(l: &Layout) -> Self {
        let mut dims = [1; MAX_RANK];
        let mut strides = [0; MAX_RANK];
        let mut rank = 0;
        for d in 0..l.rank() {
            let (n, s) = (l.dims[d], l.strides[d]);
            if n == 1 {
                continue;
            }
            if rank > 0 && strides[rank - 1] == s * n {
                dims[rank - 1] *= n;
                strides[rank - 1] = s;
            } else {
                dims[rank] = n;
                strides[rank] = s;
                rank += 1;
            }
        }
        Runs {
            offset: l.offset,
            dims,
            strides,
            rank,
        }
    }

    /// Elements `start..start + buf.len()` (row-major) into `buf`.
    #[inline]
    fn load<E: Copy>(&self, data: &[E], start: usize, buf: &mut [E]) {
        if self.rank == 0 {
            buf.fill(data[self.offset]);
            return;
        }
        let r = self.rank;
        let (inner, s) = (self.dims[r - 1], self.strides[r - 1]);
        let (mut p, mut k) = (start, 0);
        while k < buf.len() {
            let (mut rest, col) = (p / inner, p % inner);
            let mut off = self.offset + col * s;
            for d in (0..r - 1).rev() {
                off += (rest % self.dims[d]) * self.strides[d];
                rest /= self.dims[d];
            }
            let len = (inner - col).min(buf.len() - k);
            let dst = &mut buf[k..k + len];
            match s {
                0 => dst.fill(data[off]),
                1 => dst.copy_from_slice(&data[off..off + len]),
                _ => {
                    for (j, v) in dst.iter_mut().enumerate() {
                        *v = data[off + j * s];
                    }
                }
            }
            k += len;
            p += len;
        }
    }
}

/// Runs `nodes` over `ins` (all of the output's sizes), `n` values.
pub(crate) fn run<E: Float>(nodes: &[Elem], ins: &[(&Vec<E>, &Layout)]) -> Result<Vec<E>> {
    let unknown = || Error::invalid("fused", "a node with no table row");
    let steps = nodes
        .iter()
        .map(|e| {
            Ok(match e {
                Elem::Arg(i) => Step::Arg(*i),
                Elem::Unary { x, .. } => match visit_row(e, Kernel(PhantomData)) {
                    Some(RowFn::Unary(f)) => Step::Unary(f, *x),
                    _ => return Err(unknown()),
                },
                Elem::Binary { a, b, .. } => match visit_row(e, Kernel(PhantomData)) {
                    Some(RowFn::Binary(f)) => Step::Binary(f, *a, *b),
                    _ => return Err(unknown()),
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let n = ins.first().map_or(0, |(_, l)| l.numel());
    let runs: Vec<Runs> = ins.iter().map(|(_, l)| Runs::new(l)).collect();
    let data: Vec<&[E]> = ins.iter().map(|(s, _)| &s[..]).collect();
    let chunk = |start: usize, out: &mut [MaybeUninit<E>]| {
        let mut regs = vec![vec![E::default(); LANES]; steps.len()];
        for (b, block) in out.chunks_mut(LANES).enumerate() {
            let (at, len) = (start + b * LANES, block.len());
            for (i, step) in steps.iter().enumerate() {
                let (done, rest) = regs.split_at_mut(i);
                let dst = &mut rest[0][..len];
                match step {
                    Step::Arg(a) => runs[*a].load(data[*a], at, dst),
                    Step::Unary(f, x) => f(&done[*x][..len], dst),
                    Step::Binary(f, x, y) => f(&done[*x][..len], &done[*y][..len], dst),
                }
            }
            let last = &regs[steps.len() - 1][..len];
            for (o, &v) in block.iter_mut().zip(last) {
                o.write(v);
            }
        }
    };
    crate::dense::tune_allocator();
    let mut out: Vec<E> = Vec::with_capacity(n);
    let spare = &mut out.spare_capacity_mut()[..n];
    if n >= 2 * crate::PAR_CHUNK {
        crate::par::chunks_mut(spare, crate::PAR_CHUNK, |c, piece| {
            chunk(c * crate::PAR_CHUNK, piece)
        });
    } else {
        chunk(0, spare);
    }
    // SAFETY: every block of every piece of the first `n` slots was written
    // from the last step's block (`E: Copy`: nothing to drop on a panic).
    unsafe { out.set_len(n) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cpu;

    #[test]
    fn runs_load_broadcast_and_strided_views() {
        // A per-channel vector [1, 3, 1, 2] broadcast over [2, 3, 2, 2]
        let data: Vec<f32> = vec![10.0, 20.0, 30.0];
        let l = Layout::contiguous(&[1, 3, 1, 1]).broadcast_to(&[2, 3, 2, 2]);
        let r = Runs::new(&l);
        let mut buf = vec![0.0; 24];
        r.load(&data, 0, &mut buf);
        let want: Vec<f32> = (0..24).map(|i| data[(i / 4) % 3]).collect();
        assert_eq!(buf, want);
        // From a position inside a run, a piece shorter than a row.
        let mut part = vec![0.0; 5];
        r.load(&data, 3, &mut part);
        assert_eq!(part, want[3..8]);
        // A transposed 3x4 view.
        let t: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let l = Layout::contiguous(&[4, 3]).swap(0, 1);
        let mut buf = vec![0.0; 12];
        Runs::new(&l).load(&t, 0, &mut buf);
        let want: Vec<f32> = (0..12).map(|i| t[(i % 4) * 3 + i / 4]).collect();
        assert_eq!(buf, want);
    }

    /// `exp(relu(x * w + b) - x)` over 7 x 100 x 100 values (parallel
    /// pieces, many blocks), `w` broadcast along rows, `b` a scalar, `x`
    /// read twice: bit for bit the composed ops.
    #[test]
    fn a_chain_gives_the_composed_ops_bits_in_parallel_pieces() {
        use forma_core::{Dyn, Tensor};
        type T3 = Tensor<(Dyn, Dyn, Dyn), f32, Cpu>;
        let n = 7 * 100 * 100;
        let x = T3::from_vec(
            (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
                .collect(),
            (Dyn(7), Dyn(100), Dyn(100)),
        )
        .unwrap();
        let w = T3::from_vec(
            (0..100).map(|i| i as f32 / 33.0 - 1.0).collect(),
            (Dyn(1), Dyn(100), Dyn(1)),
        )
        .unwrap();
        let b = T3::from_vec(vec![0.375], (Dyn(1), Dyn(1), Dyn(1))).unwrap();
        let want = (&(&(&x * &w) + &b).relu() - &x).exp().to_vec();
        let nodes = [
            Elem::Arg(0),
            Elem::Arg(1),
            Elem::Binary {
                name: "mul",
                a: 0,
                b: 1,
            },
            Elem::Arg(2),
            Elem::Binary {
                name: "add",
                a: 2,
                b: 3,
            },
            Elem::Unary {
                name: "relu",
                params: vec![],
                x: 4,
            },
            Elem::Binary {
                name: "sub",
                a: 5,
                b: 0,
            },
            Elem::Unary {
                name: "exp",
                params: vec![],
                x: 6,
            },
        ];
        let dims = [7, 100, 100];
        let (sx, sw, sb) = (x.storage(), w.storage(), b.storage());
        let ls = [
            x.layout().broadcast_to(&dims),
            w.layout().broadcast_to(&dims),
            b.layout().broadcast_to(&dims),
        ];
        let got = run(&nodes, &[(&*sx, &ls[0]), (&*sw, &ls[1]), (&*sb, &ls[2])]).unwrap();
        assert!(n >= 2 * crate::PAR_CHUNK);
        assert_eq!(got.len(), n);
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same);
        // A row no table has is an error, not a wrong value.
        let bad = [
            Elem::Arg(0),
            Elem::Unary {
                name: "nope",
                params: vec![],
                x: 0,
            },
        ];
        assert!(run(&bad, &[(&*sx, &ls[0])]).is_err());
    }
}
