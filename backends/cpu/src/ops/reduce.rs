//! Reductions along one axis.
//!
//! Every reduction works on *lanes*: the elements of the reduced axis for one
//! output position. A lane is a contiguous slice, either taken straight from
//! the storage (when the reduced axis has stride 1) or from a copy of the view
//! with that axis moved last. Lanes are reduced in parallel above
//! [`PAR_CHUNK`] elements, and long lanes are split pairwise (which is also
//! what keeps float sums accurate). The op is matched once, outside the lane
//! loop, so every lane loop is monomorphic.

use crate::strided::StridedIter;
use crate::{gather_vec, Cpu, PAR_CHUNK};
use forma_core::dtype::Real;
use forma_core::ops::reduce::{ArgReduceOp, ReduceKernel, ReduceOp};
use forma_core::{Dtype, Error, Float, Layout, Result};
use num_traits::Float as _;

/// Lanes at most this long are folded directly (eight running accumulators);
/// longer ones are split in halves, pairwise.
const LEAF: usize = 256;

/// Folds `map(v)` over `s` with the associative `comb` whose identity is `id`.
/// Splits pairwise above [`LEAF`] elements (in parallel above `2 * PAR_CHUNK`);
/// the split points depend only on the length, so results are deterministic.
#[inline]
pub(crate) fn tree_reduce<T, A, M, C>(s: &[T], id: A, map: &M, comb: &C) -> A
where
    T: Copy + Sync,
    A: Copy + Send + Sync,
    M: Fn(T) -> A + Sync,
    C: Fn(A, A) -> A + Sync,
{
    // The leaf is inlined here and the recursion kept out of line, so a
    // short lane's fold inlines into its caller's (vectorised) loop.
    if s.len() <= LEAF {
        leaf_reduce(s, id, map, comb)
    } else if s.len() <= 2 * LEAF {
        // `split_reduce`'s one split, inlined too (lanes of 257 to 512,
        // such as a hidden size of 384 or 512, fold in the caller's loop).
        let (a, b) = s.split_at(split_point(s.len()));
        comb(leaf_reduce(a, id, map, comb), leaf_reduce(b, id, map, comb))
    } else {
        split_reduce(s, id, map, comb)
    }
}

/// A lane of at most [`LEAF`] elements, with eight running accumulators.
#[inline(always)]
fn leaf_reduce<T, A, M, C>(s: &[T], id: A, map: &M, comb: &C) -> A
where
    T: Copy,
    A: Copy,
    M: Fn(T) -> A,
    C: Fn(A, A) -> A,
{
    let mut acc = [id; 8];
    let chunks = s.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = comb(*a, map(v));
        }
    }
    let mut tail = id;
    for &v in rest {
        tail = comb(tail, map(v));
    }
    let lo = comb(comb(acc[0], acc[1]), comb(acc[2], acc[3]));
    let hi = comb(comb(acc[4], acc[5]), comb(acc[6], acc[7]));
    comb(comb(lo, hi), tail)
}

/// Where [`tree_reduce`] splits a lane of `len`: about half, on a multiple
/// of 8 so the leaves stay unrolled.
#[inline(always)]
fn split_point(len: usize) -> usize {
    (len / 2).next_multiple_of(8).min(len)
}

/// A lane longer than [`LEAF`]: halves, pairwise.
fn split_reduce<T, A, M, C>(s: &[T], id: A, map: &M, comb: &C) -> A
where
    T: Copy + Sync,
    A: Copy + Send + Sync,
    M: Fn(T) -> A + Sync,
    C: Fn(A, A) -> A + Sync,
{
    let (a, b) = s.split_at(split_point(s.len()));
    let (ra, rb) = if s.len() >= 2 * PAR_CHUNK {
        crate::par::join(
            || tree_reduce(a, id, map, comb),
            || tree_reduce(b, id, map, comb),
        )
    } else {
        (tree_reduce(a, id, map, comb), tree_reduce(b, id, map, comb))
    };
    comb(ra, rb)
}

/// Pairwise sum of `map(v)` over the lane.
#[inline]
pub(crate) fn lane_sum<T: Copy + Sync, A: Real>(s: &[T], map: impl Fn(T) -> A + Sync) -> A {
    tree_reduce(s, A::zero(), &map, &|a: A, b: A| a + b)
}

/// The larger of `a` and `b`, or `a` when it is NaN (a NaN met first wins).
#[inline(always)]
pub(crate) fn nan_max<A: Real>(a: A, b: A) -> A {
    if a > b || a.is_nan() {
        a
    } else {
        b
    }
}

/// NaN-propagating maximum (`-inf` for an empty lane).
#[inline]
pub(crate) fn lane_max<E: Float>(s: &[E]) -> E::Acc {
    tree_reduce(s, E::Acc::neg_infinity(), &|v: E| v.to_acc(), &nan_max)
}

/// NaN-propagating minimum (`+inf` for an empty lane).
#[inline]
fn lane_min<E: Float>(s: &[E]) -> E::Acc {
    tree_reduce(
        s,
        E::Acc::infinity(),
        &|v: E| v.to_acc(),
        &|a: E::Acc, b: E::Acc| {
            if a < b || a.is_nan() {
                a
            } else {
                b
            }
        },
    )
}

/// Index of the first extreme (`better(v, best)` means `v` replaces `best`);
/// the first NaN wins outright. The lane is non-empty.
#[inline]
fn lane_arg<E: Float>(s: &[E], better: impl Fn(E::Acc, E::Acc) -> bool) -> i64 {
    let mut best = s[0].to_acc();
    if best.is_nan() {
        return 0;
    }
    let mut bi = 0;
    for (i, v) in s.iter().enumerate().skip(1) {
        let v = v.to_acc();
        if v.is_nan() {
            return i as i64;
        }
        if better(v, best) {
            best = v;
            bi = i;
        }
    }
    bi as i64
}

/// The axes of a rank-`rank` view with `axis` moved last, the others in order.
pub(crate) fn axis_last_perm(rank: usize, axis: usize) -> Vec<usize> {
    (0..rank).filter(|&d| d != axis).chain([axis]).collect()
}

/// Calls `f` on every lane of `axis` as a contiguous slice, returning the
/// results row-major over the other axes. Lanes come straight from `x` when
/// the axis has stride 1 (or size 1), else from a copy with the axis moved last.
pub(crate) fn map_lanes<E: Dtype, T: Dtype>(
    x: &[E],
    layout: &Layout,
    axis: usize,
    f: impl Fn(&[E]) -> T + Sync,
) -> Vec<T> {
    let n = layout.dims[axis];
    let outer = layout.remove_axis(axis);
    let m = outer.numel();
    if m == 0 {
        return Vec::new();
    }
    if n == 0 {
        return vec![f(&[]); m];
    }
    let mut out = vec![T::default(); m];
    let per_task = (PAR_CHUNK / n).max(1);
    let par = m > 1 && m * n >= 2 * PAR_CHUNK;
    if n == 1 || layout.strides[axis] == 1 {
        let run = |start: usize, chunk: &mut [T]| {
            crate::simd::run(Lanes {
                x,
                outer: &outer,
                start,
                chunk,
                n,
                f: &f,
            })
        };
        if par {
            crate::par::chunks_mut(&mut out, per_task, |c, chunk| run(c * per_task, chunk));
        } else {
            run(0, &mut out);
        }
    } else {
        let buf = gather_vec(x, &layout.permute(&axis_last_perm(layout.rank(), axis)));
        let run = |o: &mut [T], b: &[E]| {
            for (o, lane) in o.iter_mut().zip(b.chunks_exact(n)) {
                *o = f(lane);
            }
        };
        if par {
            crate::par::chunks_mut(&mut out, per_task, |c, o| {
                let b = &buf[c * per_task * n..];
                run(o, &b[..o.len() * n]);
            });
        } else {
            run(&mut out, &buf);
        }
    }
    out
}

/// The contiguous lanes of one chunk of [`map_lanes`]'s output, as a loop
/// compiled for the widest vectors the CPU has (`crate::simd`).
struct Lanes<'a, E, T, F> {
    x: &'a [E],
    outer: &'a Layout,
    start: usize,
    chunk: &'a mut [T],
    n: usize,
    f: &'a F,
}

impl<E, T, F: Fn(&[E]) -> T> crate::simd::Vectorized for Lanes<'_, E, T, F> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let mut it = StridedIter::new(self.outer, self.start);
        for o in self.chunk {
            let b = it.next_offset();
            *o = (self.f)(&self.x[b..b + self.n]);
        }
    }
}

/// The fewest columns [`column_sums`] takes (narrower outputs go lane by
/// lane).
const COLS: usize = 8;

/// Columns one task of [`column_sums`] sums side by side: 512 bytes of each
/// f32 row, read whole, so the walk down the rows streams cache lines
/// rather than touching each line once per column group.
const BLOCK: usize = 128;

/// Sums over an axis that is not the innermost when the innermost dim is
/// dense (a bias gradient: `[batch, n]` summed over the batch). Lanes are
/// then columns, and a strided copy would move the axis last; instead up
/// to [`BLOCK`] neighbouring columns are summed at once, each step adding a
/// row of them. The fold is [`lane_sum`]'s, with the same split points
/// (they depend only on the lane length) applied to whole rows, and its
/// leaf's eight running sums kept per column, so every column gets the
/// bits its own lane would. `None` when the layout is not of this kind.
fn column_sums<E: Float>(x: &[E], layout: &Layout, axis: usize) -> Option<Vec<E::Acc>> {
    let r = layout.rank();
    if r < 2 || axis + 1 == r || layout.strides[r - 1] != 1 || layout.dims[r - 1] < COLS {
        return None;
    }
    let n = layout.dims[axis];
    let step = layout.strides[axis];
    let outer = layout.remove_axis(axis);
    let width = outer.dims[r - 2];
    let rows = outer.remove_axis(r - 2);
    let zero = <E::Acc as num_traits::Zero>::zero();
    let m = rows.numel();
    let mut out = vec![zero; m * width];
    let tasks: Vec<(usize, usize, &mut [E::Acc])> = out
        .chunks_mut(width)
        .enumerate()
        .flat_map(|(row, o)| {
            o.chunks_mut(BLOCK)
                .enumerate()
                .map(move |(t, o)| (row, t * BLOCK, o))
        })
        .collect();
    let parallel = m * width * n >= 2 * PAR_CHUNK;
    // Few tasks for many rows: the halves of each fold run in parallel too.
    let split = parallel && tasks.len() < crate::par::threads();
    let run = |(row, c0, o): (usize, usize, &mut [E::Acc])| {
        let at = StridedIter::new(&rows, row).next_offset() + c0;
        crate::simd::run(Columns {
            x,
            at,
            step,
            rows: 0..n,
            out: o,
            split,
        });
    };
    if parallel {
        crate::par::each(tasks, run);
    } else {
        tasks.into_iter().for_each(run);
    }
    Some(out)
}

/// [`column_sums`]' fold of columns `at..at + out.len()` over `rows`
/// (row `i` starts at `at + i * step`), as [`tree_reduce`] folds a lane:
/// halves at the same split points above [`LEAF`] rows, in parallel with
/// `split` when they are long.
struct Columns<'a, E: Float> {
    x: &'a [E],
    at: usize,
    step: usize,
    rows: std::ops::Range<usize>,
    out: &'a mut [E::Acc],
    split: bool,
}

impl<E: Float> crate::simd::Vectorized for Columns<'_, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let Columns {
            x,
            at,
            step,
            rows,
            out,
            split,
        } = self;
        let len = rows.len();
        if len <= LEAF {
            return column_leaf(x, at, step, rows, out);
        }
        let mid = rows.start + split_point(len);
        let w = out.len();
        let mut other = vec![<E::Acc as num_traits::Zero>::zero(); w];
        let first = |o: &mut [E::Acc], rows| {
            crate::simd::run(Columns {
                x,
                at,
                step,
                rows,
                out: o,
                split,
            })
        };
        let (a, b) = (rows.start..mid, mid..rows.end);
        if split && len * w >= 2 * PAR_CHUNK {
            crate::par::join(|| first(out, a), || first(&mut other, b));
        } else {
            first(out, a);
            first(&mut other, b);
        }
        for (o, v) in out.iter_mut().zip(&other) {
            *o = *o + *v;
        }
    }
}

/// [`leaf_reduce`] of `+` for each column at once: eight running sums per
/// column (row `i` into sum `i % 8`), a tail for the rows past the last
/// whole eight, combined in the leaf's order.
#[inline(always)]
fn column_leaf<E: Float>(
    x: &[E],
    at: usize,
    step: usize,
    rows: std::ops::Range<usize>,
    out: &mut [E::Acc],
) {
    let w = out.len();
    debug_assert!(w <= BLOCK);
    let zero = <E::Acc as num_traits::Zero>::zero();
    let mut acc = [[zero; BLOCK]; 8];
    let mut tail = [zero; BLOCK];
    let row = |i: usize| &x[at + i * step..at + i * step + w];
    let whole = rows.start + rows.len() / 8 * 8;
    for i0 in (rows.start..whole).step_by(8) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (a, v) in a[..w].iter_mut().zip(row(i0 + j)) {
                *a = *a + v.to_acc();
            }
        }
    }
    for i in whole..rows.end {
        for (t, v) in tail[..w].iter_mut().zip(row(i)) {
            *t = *t + v.to_acc();
        }
    }
    for (c, o) in out.iter_mut().enumerate() {
        let lo = (acc[0][c] + acc[1][c]) + (acc[2][c] + acc[3][c]);
        let hi = (acc[4][c] + acc[5][c]) + (acc[6][c] + acc[7][c]);
        *o = (lo + hi) + tail[c];
    }
}

fn empty_axis(op: &'static str) -> Error {
    Error::invalid(op, "cannot reduce an empty axis")
}

impl<E: Float> ReduceKernel<E> for Cpu {
    fn reduce(&self, op: ReduceOp, x: &Vec<E>, layout: &Layout, axis: usize) -> Result<Vec<E>> {
        let n = layout.dims[axis];
        let nf = E::Acc::c(n as f64);
        if matches!(op, ReduceOp::Sum | ReduceOp::Mean) && n > 0 {
            if let Some(sums) = column_sums(x, layout, axis) {
                let mean = matches!(op, ReduceOp::Mean);
                return Ok(sums
                    .into_iter()
                    .map(|v| E::from_acc(if mean { v / nf } else { v }))
                    .collect());
            }
        }
        let out = match op {
            ReduceOp::Sum => map_lanes(x, layout, axis, |l| {
                E::from_acc(lane_sum(l, |v: E| v.to_acc()))
            }),
            ReduceOp::Mean => map_lanes(x, layout, axis, |l| {
                E::from_acc(lane_sum(l, |v: E| v.to_acc()) / nf)
            }),
            // Like PyTorch, an empty reduced axis is an error even when the
            // output is empty too (`amax(): Expected reduction dim to have
            // non-zero size`).
            ReduceOp::Max if n == 0 => return Err(empty_axis("max")),
            ReduceOp::Min if n == 0 => return Err(empty_axis("min")),
            ReduceOp::Max => map_lanes(x, layout, axis, |l| E::from_acc(lane_max(l))),
            ReduceOp::Min => map_lanes(x, layout, axis, |l| E::from_acc(lane_min(l))),
            ReduceOp::Prod => map_lanes(x, layout, axis, |l| {
                E::from_acc(tree_reduce(
                    l,
                    E::Acc::c(1.0),
                    &|v: E| v.to_acc(),
                    &|a: E::Acc, b: E::Acc| a * b,
                ))
            }),
            ReduceOp::LogSumExp => map_lanes(x, layout, axis, |l| {
                // PyTorch: shift by the max, except by 0 when the max is
                // infinite (all -inf gives -inf, any +inf gives +inf). An empty
                // lane has max -inf, so it gives ln(0) = -inf.
                let m = lane_max(l);
                let shift = if m.is_infinite() { E::Acc::c(0.0) } else { m };
                let s = lane_sum(l, |v: E| (v.to_acc() - shift).exp());
                E::from_acc(s.ln() + shift)
            }),
            ReduceOp::Var { ddof } => {
                // PyTorch divides by max(n - ddof, 0): 0/0 = NaN for a single
                // element (or an empty lane), x/0 = inf when ddof > n - 1.
                let div = E::Acc::c(n.saturating_sub(ddof) as f64);
                map_lanes(x, layout, axis, |l| {
                    let mean = lane_sum(l, |v: E| v.to_acc()) / nf;
                    let m2 = lane_sum(l, |v: E| {
                        let d = v.to_acc() - mean;
                        d * d
                    });
                    E::from_acc(m2 / div)
                })
            }
        };
        Ok(out)
    }

    fn arg_reduce(
        &self,
        op: ArgReduceOp,
        x: &Vec<E>,
        layout: &Layout,
        axis: usize,
    ) -> Result<Vec<i64>> {
        let name = match op {
            ArgReduceOp::ArgMax => "argmax",
            ArgReduceOp::ArgMin => "argmin",
        };
        if layout.dims[axis] == 0 {
            return Err(empty_axis(name));
        }
        Ok(match op {
            ArgReduceOp::ArgMax => map_lanes(x, layout, axis, |l| lane_arg(l, |v, b| v > b)),
            ArgReduceOp::ArgMin => map_lanes(x, layout, axis, |l| lane_arg(l, |v, b| v < b)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    fn iota(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32).collect()
    }

    /// Element of a view at a multi-index.
    fn at<E: Copy>(x: &[E], l: &Layout, idx: &[usize]) -> E {
        x[l.offset
            + idx
                .iter()
                .zip(l.strides.iter())
                .map(|(i, s)| i * s)
                .sum::<usize>()]
    }

    /// Row-major multi-index of `lin` over `dims`.
    fn unravel(mut lin: usize, dims: &[usize]) -> Vec<usize> {
        let mut idx = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            idx[d] = lin % dims[d];
            lin /= dims[d];
        }
        idx
    }

    /// The lanes of `axis` of a view, read element by element, in output order.
    fn naive_lanes(x: &[f32], l: &Layout, axis: usize) -> Vec<Vec<f64>> {
        let outer: Vec<usize> = l.remove_axis(axis).dims.to_vec();
        let m: usize = outer.iter().product();
        (0..m)
            .map(|o| {
                let mut idx = unravel(o, &outer);
                idx.insert(axis, 0);
                (0..l.dims[axis])
                    .map(|k| {
                        idx[axis] = k;
                        at(x, l, &idx) as f64
                    })
                    .collect()
            })
            .collect()
    }

    fn naive(op: ReduceOp, lane: &[f64]) -> f64 {
        let n = lane.len() as f64;
        match op {
            ReduceOp::Sum => lane.iter().sum(),
            ReduceOp::Mean => lane.iter().sum::<f64>() / n,
            ReduceOp::Max => lane.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::Min => lane.iter().cloned().fold(f64::INFINITY, f64::min),
            ReduceOp::Prod => lane.iter().product(),
            ReduceOp::LogSumExp => lane.iter().map(|v| v.exp()).sum::<f64>().ln(),
            ReduceOp::Var { ddof } => {
                let mean = lane.iter().sum::<f64>() / n;
                lane.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - ddof as f64)
            }
        }
    }

    const OPS: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Prod,
        ReduceOp::LogSumExp,
        ReduceOp::Var { ddof: 0 },
        ReduceOp::Var { ddof: 1 },
    ];

    /// Every op over every axis of the view, against an f64 reference.
    fn check_all(x: &[f32], l: &Layout) {
        check_ops(x, l, &OPS);
    }

    fn check_ops(x: &[f32], l: &Layout, ops: &[ReduceOp]) {
        for axis in 0..l.rank() {
            let lanes = naive_lanes(x, l, axis);
            for &op in ops {
                let got = Cpu.reduce(op, &x.to_vec(), l, axis).unwrap();
                assert_eq!(got.len(), lanes.len(), "{op:?} axis {axis}");
                for (g, lane) in got.iter().zip(&lanes) {
                    let want = naive(op, lane);
                    let tol = 1e-5 * want.abs().max(1.0);
                    assert!(
                        (*g as f64 - want).abs() <= tol,
                        "{op:?} axis {axis} of {l:?}: got {g}, want {want}"
                    );
                }
            }
            for (op, want) in [(ArgReduceOp::ArgMax, true), (ArgReduceOp::ArgMin, false)] {
                let got = Cpu.arg_reduce(op, &x.to_vec(), l, axis).unwrap();
                for (g, lane) in got.iter().zip(&lanes) {
                    let mut bi = 0;
                    for (i, v) in lane.iter().enumerate() {
                        if (want && *v > lane[bi]) || (!want && *v < lane[bi]) {
                            bi = i;
                        }
                    }
                    assert_eq!(*g, bi as i64, "{op:?} axis {axis} of {l:?}");
                }
            }
        }
    }

    #[test]
    fn sums_each_axis_by_hand() {
        let x = iota(24);
        let l = Layout::contiguous(&[2, 3, 4]);
        let s0 = Cpu.reduce(ReduceOp::Sum, &x, &l, 0).unwrap();
        assert_eq!(s0, (0..12).map(|i| (2 * i + 12) as f32).collect::<Vec<_>>());
        let s1 = Cpu.reduce(ReduceOp::Sum, &x, &l, 1).unwrap();
        assert_eq!(s1, vec![12., 15., 18., 21., 48., 51., 54., 57.]);
        let s2 = Cpu.reduce(ReduceOp::Sum, &x, &l, 2).unwrap();
        assert_eq!(s2, vec![6., 22., 38., 54., 70., 86.]);
        let m2 = Cpu.reduce(ReduceOp::Max, &x, &l, 2).unwrap();
        assert_eq!(m2, vec![3., 7., 11., 15., 19., 23.]);
        let a1 = Cpu.arg_reduce(ArgReduceOp::ArgMin, &x, &l, 1).unwrap();
        assert_eq!(a1, vec![0; 8]);
    }

    #[test]
    fn transposed_view_by_hand() {
        // View [4, 3, 2]: v[c][b][a] = x[a*12 + b*4 + c].
        let x = iota(24);
        let l = Layout::contiguous(&[2, 3, 4]).swap(0, 2);
        let s = Cpu.reduce(ReduceOp::Sum, &x, &l, 2).unwrap();
        let want: Vec<f32> = (0..4)
            .flat_map(|c| (0..3).map(move |b| (2 * (b * 4 + c) + 12) as f32))
            .collect();
        assert_eq!(s, want);
        let a = Cpu.arg_reduce(ArgReduceOp::ArgMax, &x, &l, 0).unwrap();
        assert_eq!(a, vec![3; 6]);
    }

    #[test]
    fn broadcast_view_by_hand() {
        // [3, 1] -> [2, 3, 4] with strides [0, 1, 0].
        let x = vec![1.0f32, 2., 3.];
        let l = Layout::contiguous(&[3, 1]).broadcast_to(&[2, 3, 4]);
        let s0 = Cpu.reduce(ReduceOp::Sum, &x, &l, 0).unwrap();
        let want: Vec<f32> = (1..=3).flat_map(|b| [2.0 * b as f32; 4]).collect();
        assert_eq!(s0, want);
        let s2 = Cpu.reduce(ReduceOp::Sum, &x, &l, 2).unwrap();
        assert_eq!(s2, vec![4., 8., 12., 4., 8., 12.]);
        let v = Cpu.reduce(ReduceOp::Var { ddof: 1 }, &x, &l, 2).unwrap();
        assert_eq!(v, vec![0.; 6]);
        // Ties: the first index wins.
        let a = Cpu.arg_reduce(ArgReduceOp::ArgMax, &x, &l, 2).unwrap();
        assert_eq!(a, vec![0; 6]);
    }

    #[test]
    fn every_op_every_axis_matches_reference() {
        let x: Vec<f32> = (0..24)
            .map(|i| ((i * 7) % 11) as f32 * 0.25 - 1.0)
            .collect();
        let c = Layout::contiguous(&[2, 3, 4]);
        check_all(&x, &c);
        check_all(&x, &c.swap(0, 2));
        check_all(&x, &c.permute(&[1, 2, 0]));
        check_all(&x, &c.narrow(2, 1, 2));
        check_all(&x, &c.narrow(1, 1, 2).swap(1, 2));
        check_all(&x, &c.slice_step(2, 0, 2, 2));
        check_all(
            &x[..3],
            &Layout::contiguous(&[3, 1]).broadcast_to(&[2, 3, 4]),
        );
        let mut off = Layout::contiguous(&[5]);
        off.offset = 7;
        check_all(&x, &off);
    }

    #[test]
    fn large_inputs_take_the_parallel_paths() {
        let x: Vec<f32> = (0..150_000)
            .map(|i| ((i % 97) as f32 - 48.0) / 16.0)
            .collect();
        // Many short lanes (both layouts), a few long lanes, one very long lane.
        // (Long products overflow f32 midway, so prod is left to the small cases.)
        let ops: Vec<ReduceOp> = OPS.into_iter().filter(|&o| o != ReduceOp::Prod).collect();
        for dims in [[3000, 50], [50, 3000], [2, 75_000]] {
            let l = Layout::contiguous(&dims);
            check_ops(&x, &l, &ops);
            check_ops(
                &x,
                &Layout::contiguous(&[dims[1], dims[0]]).swap(0, 1),
                &ops,
            );
        }
        let l = Layout::contiguous(&[150_000]);
        let s = Cpu.reduce(ReduceOp::Sum, &x, &l, 0).unwrap();
        let want: f64 = x.iter().map(|&v| v as f64).sum();
        assert!((s[0] as f64 - want).abs() < 1e-3, "{} vs {want}", s[0]);
    }

    /// The lane path's sum of a view (what `reduce` does without
    /// [`column_sums`]), to the bit.
    fn lane_sums<E: Float>(x: &[E], l: &Layout, axis: usize) -> Vec<f64> {
        map_lanes(x, l, axis, |lane| {
            acc_f64::<E>(lane_sum(lane, |v: E| v.to_acc()))
        })
    }

    /// An accumulation-type value exactly (f32 and f64 widen without loss).
    fn acc_f64<E: Float>(v: E::Acc) -> f64 {
        num_traits::ToPrimitive::to_f64(&v).expect("a float")
    }

    fn columns_match_lanes<E: Float>(x: &[E]) {
        // (view dims, strides, offset, axis): bias-gradient shapes, tails of
        // fewer than COLS columns, lanes past LEAF (split), rank 3 with the
        // axis in front or in the middle, a strided outer dim, and sizes
        // that take the parallel path, with short and long lanes.
        let cases: [(&[usize], Option<&[usize]>, usize, usize); 10] = [
            (&[128, 512], None, 0, 0),
            (&[7, 13], None, 0, 0),
            (&[300, 9], None, 3, 0),
            (&[600, 37], None, 1, 0),
            (&[1, 8], None, 0, 0),
            (&[4, 5, 11], None, 0, 1),
            (&[6, 4, 19], None, 2, 0),
            (&[3, 5, 10], Some(&[10, 60, 1]), 0, 1),
            (&[1030, 130], None, 0, 0),
            // Lanes longer than PAR_CHUNK (a broadcast view keeps it small).
            (&[40_000, 9], Some(&[0, 1]), 0, 0),
        ];
        for (dims, strides, offset, axis) in cases {
            let mut l = Layout::contiguous(dims);
            if let Some(st) = strides {
                l.strides = forma_core::shape::Dims::from_slice(st);
            }
            l.offset = offset;
            assert!(l.span() <= x.len());
            let want = lane_sums(x, &l, axis);
            let got = column_sums(x, &l, axis).expect("a column layout");
            let got: Vec<u64> = got.into_iter().map(|v| acc_f64::<E>(v).to_bits()).collect();
            let want: Vec<u64> = want.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{dims:?} axis {axis}");
        }
        // Not columns: the axis innermost, or a strided innermost dim.
        assert!(column_sums(x, &Layout::contiguous(&[4, 9]), 1).is_none());
        let t = Layout::contiguous(&[9, 12]).permute(&[1, 0]);
        assert!(column_sums(x, &t, 0).is_none());
    }

    #[test]
    fn column_sums_give_the_lane_bits() {
        let n = 140_000;
        let f = |i: usize| ((i * 37) % 101) as f64 / 7.0 - 6.5 + 1e-3 * (i % 13) as f64;
        columns_match_lanes::<f32>(&(0..n).map(|i| f(i) as f32).collect::<Vec<_>>());
        columns_match_lanes::<f64>(&(0..n).map(f).collect::<Vec<_>>());
        columns_match_lanes::<half::bf16>(
            &(0..n)
                .map(|i| half::bf16::from_f64(f(i)))
                .collect::<Vec<_>>(),
        );
    }

    #[test]
    fn empty_axis() {
        let x: Vec<f32> = vec![];
        let l = Layout::contiguous(&[3, 0]);
        let r = |op| Cpu.reduce(op, &x, &l, 1);
        assert_eq!(r(ReduceOp::Sum).unwrap(), vec![0.; 3]);
        assert_eq!(r(ReduceOp::Prod).unwrap(), vec![1.; 3]);
        assert!(r(ReduceOp::Mean).unwrap().iter().all(|v| v.is_nan()));
        assert!(r(ReduceOp::Var { ddof: 0 })
            .unwrap()
            .iter()
            .all(|v| v.is_nan()));
        assert_eq!(r(ReduceOp::LogSumExp).unwrap(), vec![f32::NEG_INFINITY; 3]);
        assert_eq!(
            r(ReduceOp::Max),
            Err(Error::invalid("max", "cannot reduce an empty axis"))
        );
        assert_eq!(
            r(ReduceOp::Min),
            Err(Error::invalid("min", "cannot reduce an empty axis"))
        );
        assert!(Cpu.arg_reduce(ArgReduceOp::ArgMax, &x, &l, 1).is_err());
        // Reducing the non-empty axis of an empty tensor gives an empty result.
        assert_eq!(
            Cpu.reduce(ReduceOp::Max, &x, &l, 0).unwrap(),
            Vec::<f32>::new()
        );
        assert_eq!(
            Cpu.arg_reduce(ArgReduceOp::ArgMin, &x, &l, 0).unwrap(),
            vec![]
        );
        assert_eq!(
            Cpu.reduce(ReduceOp::Sum, &x, &l, 0).unwrap(),
            Vec::<f32>::new()
        );
        // An empty axis is an error for max even when the output is empty (PyTorch).
        let l00 = Layout::contiguous(&[0, 0]);
        assert!(Cpu.reduce(ReduceOp::Max, &x, &l00, 1).is_err());
        assert_eq!(
            Cpu.reduce(ReduceOp::Sum, &x, &l00, 1).unwrap(),
            Vec::<f32>::new()
        );
    }

    #[test]
    fn nan_propagates() {
        let nan = f32::NAN;
        let x = vec![1.0, nan, 3.0, 5.0, 2.0, 4.0];
        let l = Layout::contiguous(&[2, 3]);
        for op in OPS {
            let r = Cpu.reduce(op, &x, &l, 1).unwrap();
            assert!(r[0].is_nan(), "{op:?}");
            assert!(!r[1].is_nan(), "{op:?}");
        }
        assert_eq!(Cpu.reduce(ReduceOp::Max, &x, &l, 1).unwrap()[1], 5.0);
        assert_eq!(Cpu.reduce(ReduceOp::Min, &x, &l, 1).unwrap()[1], 2.0);
        // NaN first or last in a lane.
        for x in [vec![nan, 1.0, 2.0], vec![1.0, 2.0, nan]] {
            let l = Layout::contiguous(&[3]);
            assert!(Cpu.reduce(ReduceOp::Max, &x, &l, 0).unwrap()[0].is_nan());
            assert!(Cpu.reduce(ReduceOp::Min, &x, &l, 0).unwrap()[0].is_nan());
        }
    }

    #[test]
    fn argmax_ties_and_nan() {
        let nan = f32::NAN;
        let l = Layout::contiguous(&[5]);
        let am = |x: Vec<f32>| Cpu.arg_reduce(ArgReduceOp::ArgMax, &x, &l, 0).unwrap()[0];
        let an = |x: Vec<f32>| Cpu.arg_reduce(ArgReduceOp::ArgMin, &x, &l, 0).unwrap()[0];
        assert_eq!(am(vec![1., 3., 2., 3., 0.]), 1);
        assert_eq!(an(vec![1., 0., 2., 0., 3.]), 1);
        assert_eq!(am(vec![1., 3., nan, 9., nan]), 2);
        assert_eq!(an(vec![1., 3., nan, -9., nan]), 2);
        assert_eq!(am(vec![nan, 3., 2., 1., 0.]), 0);
        let inf = f32::INFINITY;
        assert_eq!(am(vec![1., inf, 2., inf, 0.]), 1);
        assert_eq!(an(vec![1., -inf, 2., -inf, 0.]), 1);
        assert_eq!(am(vec![-inf; 5]), 0);
    }

    #[test]
    fn logsumexp_extremes() {
        let (inf, ninf) = (f32::INFINITY, f32::NEG_INFINITY);
        let l = Layout::contiguous(&[3]);
        let lse = |x: Vec<f32>| Cpu.reduce(ReduceOp::LogSumExp, &x, &l, 0).unwrap()[0];
        assert_eq!(lse(vec![ninf; 3]), ninf);
        assert_eq!(lse(vec![1., inf, ninf]), inf);
        assert_eq!(lse(vec![inf, inf, 0.]), inf);
        assert_eq!(lse(vec![0., ninf, ninf]), 0.);
        assert!(lse(vec![0., f32::NAN, 1.]).is_nan());
        let big = lse(vec![1000., 1000., ninf]);
        assert!((big - (1000. + 2f32.ln())).abs() < 1e-4, "{big}");
        let small = lse(vec![-1000., -1000., -1000.]);
        assert!((small - (-1000. + 3f32.ln())).abs() < 1e-4, "{small}");
    }

    #[test]
    fn var_ddof() {
        let x = vec![1.0f32, 2., 3., 4.];
        let l = Layout::contiguous(&[4]);
        let v0 = Cpu.reduce(ReduceOp::Var { ddof: 0 }, &x, &l, 0).unwrap()[0];
        let v1 = Cpu.reduce(ReduceOp::Var { ddof: 1 }, &x, &l, 0).unwrap()[0];
        assert_eq!(v0, 1.25);
        assert!((v1 - 5.0 / 3.0).abs() < 1e-6);
        // A single element: 0 biased, 0/0 = NaN unbiased (as torch.var).
        let one = Layout::contiguous(&[1]);
        assert_eq!(
            Cpu.reduce(ReduceOp::Var { ddof: 0 }, &x, &one, 0).unwrap(),
            vec![0.]
        );
        assert!(Cpu.reduce(ReduceOp::Var { ddof: 1 }, &x, &one, 0).unwrap()[0].is_nan());
        // ddof beyond n - 1 with a non-zero spread: x/0 = inf, as PyTorch.
        let two = Layout::contiguous(&[2]);
        let v = Cpu.reduce(ReduceOp::Var { ddof: 3 }, &x, &two, 0).unwrap()[0];
        assert_eq!(v, f32::INFINITY);
        // Two-pass stays accurate with a large offset.
        let y = vec![1e4f32 + 1., 1e4 + 2., 1e4 + 3., 1e4 + 4.];
        assert_eq!(
            Cpu.reduce(ReduceOp::Var { ddof: 0 }, &y, &l, 0).unwrap(),
            vec![1.25]
        );
        let mean = Cpu.reduce(ReduceOp::Mean, &x, &l, 0).unwrap();
        assert_eq!(mean, vec![2.5]);
    }

    #[test]
    fn half_types_accumulate_in_f32() {
        let l = Layout::contiguous(&[4096]);
        let h = vec![f16::ONE; 4096];
        assert_eq!(
            Cpu.reduce(ReduceOp::Sum, &h, &l, 0).unwrap(),
            vec![f16::from_f32(4096.)]
        );
        assert_eq!(
            Cpu.reduce(ReduceOp::Mean, &h, &l, 0).unwrap(),
            vec![f16::ONE]
        );
        let b = vec![bf16::ONE; 4096];
        assert_eq!(
            Cpu.reduce(ReduceOp::Sum, &b, &l, 0).unwrap(),
            vec![bf16::from_f32(4096.)]
        );
        // f16 tops out at 65504; the f32 accumulator does not overflow midway.
        let big = vec![f16::from_f32(60000.); 4];
        let l4 = Layout::contiguous(&[4]);
        let m = Cpu.reduce(ReduceOp::Mean, &big, &l4, 0).unwrap();
        assert_eq!(m, vec![f16::from_f32(60000.)]);
        let a = Cpu.arg_reduce(ArgReduceOp::ArgMax, &big, &l4, 0).unwrap();
        assert_eq!(a, vec![0]);
    }

    #[test]
    fn f64_reduces() {
        let x: Vec<f64> = (0..6).map(|i| i as f64).collect();
        let l = Layout::contiguous(&[2, 3]);
        assert_eq!(
            Cpu.reduce(ReduceOp::Prod, &x, &l, 0).unwrap(),
            vec![0., 4., 10.]
        );
        assert_eq!(Cpu.reduce(ReduceOp::Mean, &x, &l, 1).unwrap(), vec![1., 4.]);
    }
}
