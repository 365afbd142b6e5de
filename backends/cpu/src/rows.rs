//! Row-wise fast path for broadcast operands.
//!
//! Most strided elementwise calls are broadcasts along whole rows: a bias
//! `[O]` added to `[N, O]`, a mean `[N, 1]` subtracted from `[N, F]`. After
//! merging the dims that are laid out alike in every operand, each operand's
//! innermost dim has stride 1 (a contiguous run) or 0 (one value repeated), so
//! each output row is a zip over slices, which vectorises, instead of an
//! offset computed per element.

use crate::dense::{build, fill_block, Chunks, Elementwise, BLOCK};
use crate::strided::StridedIter;
use forma_core::shape::MAX_RANK;
use forma_core::Layout;
use std::mem::MaybeUninit;

/// Rows shorter than this go to the general walk: the per-row set-up would
/// cost more than it saves.
const MIN_ROW: usize = 16;

/// `K` views of one size, as rows: `outer[i]` walks the start offset of each
/// row of operand `i`, whose row is a contiguous run of `n` values when
/// `unit[i]`, else one value repeated.
pub(crate) struct Rows<const K: usize> {
    outer: [Layout; K],
    n: usize,
    unit: [bool; K],
}

impl<const K: usize> Rows<K> {
    /// The row plan of `layouts` (all of the same sizes), when their merged
    /// innermost dim has stride 0 or 1 in each and rows are long enough.
    pub(crate) fn plan(layouts: [&Layout; K]) -> Option<Self> {
        let first = layouts.first()?;
        // Merge dims from the innermost out, skipping size-1 dims, while
        // every operand steps over the pair as over one dim.
        let mut dims = [0usize; MAX_RANK];
        let mut strides = [[0usize; MAX_RANK]; K];
        let mut rank = 0;
        for d in (0..first.rank()).rev() {
            let size = first.dims[d];
            if size == 1 {
                continue;
            }
            let mergeable = rank > 0
                && (0..K).all(|i| layouts[i].strides[d] == strides[i][rank - 1] * dims[rank - 1]);
            if mergeable {
                dims[rank - 1] *= size;
            } else {
                dims[rank] = size;
                for i in 0..K {
                    strides[i][rank] = layouts[i].strides[d];
                }
                rank += 1;
            }
        }
        if rank == 0 || dims[0] < MIN_ROW || (0..K).any(|i| strides[i][0] > 1) {
            return None;
        }
        let n = dims[0];
        // The outer dims, back in row-major order (they were collected
        // innermost first).
        let outer_dims: Vec<usize> = dims[1..rank].iter().rev().copied().collect();
        let outer = std::array::from_fn(|i| {
            let mut l = Layout::contiguous(&outer_dims);
            for (j, s) in strides[i][1..rank].iter().rev().enumerate() {
                l.strides[j] = *s;
            }
            l.offset = layouts[i].offset;
            l
        });
        Some(Rows {
            outer,
            n,
            unit: std::array::from_fn(|i| strides[i][0] == 1),
        })
    }

    /// `f` over the operands' rows: a new row-major vector of the common
    /// sizes, `ins[i]` being the storage operand `i`'s layout indexes.
    pub(crate) fn map<A: Copy + Sync, T: Copy + Send, F>(&self, ins: [&[A]; K], f: F) -> Vec<T>
    where
        F: Elementwise<A, K, Out = T>,
        for<'a> RowZip<'a, A, K, F>: Chunks<T>,
    {
        let total = self.n * self.outer[0].numel();
        build(total, &RowZip { rows: self, ins, f })
    }

    /// [`Rows::map`] for any number of operands: each block of a row is
    /// copied (or, for a repeated value, filled) into an L1 buffer per
    /// operand, then run through [`fill_block`].
    pub(crate) fn map_blocks<A: Copy + Default + Sync, T: Copy + Send, F>(
        &self,
        ins: [&[A]; K],
        f: F,
    ) -> Vec<T>
    where
        F: Elementwise<A, K, Out = T>,
    {
        let total = self.n * self.outer[0].numel();
        build(total, &RowBlocks { rows: self, ins, f })
    }

    /// The row segments of the chunk of `len` output elements starting at
    /// `start` (see [`Segments`]).
    #[inline(always)]
    fn segments(&self, start: usize, len: usize) -> Segments<'_, K> {
        Segments {
            rows: self,
            its: self
                .outer
                .each_ref()
                .map(|l| StridedIter::new(l, start / self.n)),
            col: start % self.n,
            done: 0,
            len,
        }
    }
}

/// Yields, for each row segment of a chunk of the output, where each
/// operand's values start in its storage and whether they run (else one
/// repeats), with the segment's range in the chunk. Segments are whole rows
/// except where a chunk boundary splits one.
pub(crate) struct Segments<'a, const K: usize> {
    rows: &'a Rows<K>,
    its: [StridedIter; K],
    col: usize,
    done: usize,
    len: usize,
}

impl<const K: usize> Iterator for Segments<'_, K> {
    type Item = ([(usize, bool); K], std::ops::Range<usize>);

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        if self.done >= self.len {
            return None;
        }
        let seg = (self.rows.n - self.col).min(self.len - self.done);
        let at = std::array::from_fn(|i| {
            let base = self.its[i].next_offset();
            if self.rows.unit[i] {
                (base + self.col, true)
            } else {
                (base, false)
            }
        });
        let range = self.done..self.done + seg;
        self.done += seg;
        self.col = 0;
        Some((at, range))
    }
}

/// `f` over the rows of `K` operands (see [`Rows::map`]).
pub(crate) struct RowZip<'a, A, const K: usize, F> {
    rows: &'a Rows<K>,
    ins: [&'a [A]; K],
    f: F,
}

// SAFETY: `Segments` covers `out` with consecutive ranges, each written
// whole (a slice loop over the segment, or a fill).
unsafe impl<A: Copy + Sync, F: Elementwise<A, 1>> Chunks<F::Out> for RowZip<'_, A, 1, F> {
    #[inline(always)]
    fn fill(&self, start: usize, out: &mut [MaybeUninit<F::Out>]) {
        let [a] = self.ins;
        for ([(ia, ua)], r) in self.rows.segments(start, out.len()) {
            let out = &mut out[r];
            let n = out.len();
            if ua {
                for (o, &x) in out.iter_mut().zip(&a[ia..ia + n]) {
                    o.write(self.f.at([x]));
                }
            } else {
                let v = self.f.at([a[ia]]);
                for o in out.iter_mut() {
                    o.write(v);
                }
            }
        }
    }
}

// SAFETY: `Segments` covers `out` with consecutive ranges, each written
// whole (a slice loop over the segment, or a fill).
unsafe impl<A: Copy + Sync, F: Elementwise<A, 2>> Chunks<F::Out> for RowZip<'_, A, 2, F> {
    #[inline(always)]
    fn fill(&self, start: usize, out: &mut [MaybeUninit<F::Out>]) {
        let [a, b] = self.ins;
        for ([ia, ib], r) in self.rows.segments(start, out.len()) {
            zip2(&mut out[r], (a, ia), (b, ib), &self.f);
        }
    }
}

// SAFETY: `Segments` covers `out` with consecutive ranges, each written
// whole (a slice loop over the segment, or a fill).
unsafe impl<A: Copy + Sync, F: Elementwise<A, 3>> Chunks<F::Out> for RowZip<'_, A, 3, F> {
    #[inline(always)]
    fn fill(&self, start: usize, out: &mut [MaybeUninit<F::Out>]) {
        let [a, b, c] = self.ins;
        for ([ia, ib, (ic, uc)], r) in self.rows.segments(start, out.len()) {
            let out = &mut out[r];
            if uc {
                let c = &c[ic..ic + out.len()];
                zip2_with(out, (a, ia), (b, ib), c, &self.f);
            } else {
                let third = Third {
                    f: &self.f,
                    z: c[ic],
                };
                zip2(out, (a, ia), (b, ib), &third);
            }
        }
    }
}

/// `f` over the rows of `K` operands, block by block (see
/// [`Rows::map_blocks`]).
pub(crate) struct RowBlocks<'a, A, const K: usize, F> {
    rows: &'a Rows<K>,
    ins: [&'a [A]; K],
    f: F,
}

// SAFETY: `Segments` covers `out` with consecutive ranges; each is written
// block by block, whole blocks through `fill_block` and the last, shorter
// one element by element.
unsafe impl<A: Copy + Default + Sync, F: Elementwise<A, K>, const K: usize> Chunks<F::Out>
    for RowBlocks<'_, A, K, F>
{
    #[inline(always)]
    fn fill(&self, start: usize, out: &mut [MaybeUninit<F::Out>]) {
        let mut buf = [[A::default(); BLOCK]; K];
        for (at, r) in self.rows.segments(start, out.len()) {
            let seg = &mut out[r];
            for (b, o) in seg.chunks_mut(BLOCK).enumerate() {
                let len = o.len();
                for (k, &(i, unit)) in at.iter().enumerate() {
                    if unit {
                        let i = i + b * BLOCK;
                        buf[k][..len].copy_from_slice(&self.ins[k][i..i + len]);
                    } else {
                        buf[k][..len].fill(self.ins[k][i]);
                    }
                }
                if len == BLOCK {
                    let o = <&mut [_; BLOCK]>::try_from(o).expect("checked length");
                    fill_block(buf.each_ref(), o, &self.f);
                } else {
                    for (j, o) in o.iter_mut().enumerate() {
                        o.write(self.f.at(std::array::from_fn(|k| buf[k][j])));
                    }
                }
            }
        }
    }
}

/// A function of three values with the third fixed.
struct Third<'a, F, A> {
    f: &'a F,
    z: A,
}

impl<A: Copy + Sync, F: Elementwise<A, 3>> Elementwise<A, 2> for Third<'_, F, A> {
    type Out = F::Out;
    #[inline(always)]
    fn at(&self, [x, y]: [A; 2]) -> F::Out {
        self.f.at([x, y, self.z])
    }
}

/// `f(a, b)` over one row segment: each operand a run at its offset or one
/// repeated value.
#[inline(always)]
fn zip2<A: Copy, F: Elementwise<A, 2>>(
    out: &mut [MaybeUninit<F::Out>],
    (a, (ia, ua)): (&[A], (usize, bool)),
    (b, (ib, ub)): (&[A], (usize, bool)),
    f: &F,
) {
    let n = out.len();
    match (ua, ub) {
        (true, true) => {
            for ((o, &x), &y) in out.iter_mut().zip(&a[ia..ia + n]).zip(&b[ib..ib + n]) {
                o.write(f.at([x, y]));
            }
        }
        (true, false) => {
            let y = b[ib];
            for (o, &x) in out.iter_mut().zip(&a[ia..ia + n]) {
                o.write(f.at([x, y]));
            }
        }
        (false, true) => {
            let x = a[ia];
            for (o, &y) in out.iter_mut().zip(&b[ib..ib + n]) {
                o.write(f.at([x, y]));
            }
        }
        (false, false) => {
            let v = f.at([a[ia], b[ib]]);
            for o in out.iter_mut() {
                o.write(v);
            }
        }
    }
}

/// `f(a, b, c)` over one row segment whose third operand runs (a gradient is
/// dense; a repeated one goes through [`zip2`]).
#[inline(always)]
fn zip2_with<A: Copy, F: Elementwise<A, 3>>(
    out: &mut [MaybeUninit<F::Out>],
    (a, (ia, ua)): (&[A], (usize, bool)),
    (b, (ib, ub)): (&[A], (usize, bool)),
    c: &[A],
    f: &F,
) {
    let n = out.len();
    match (ua, ub) {
        (true, true) => {
            let ab = a[ia..ia + n].iter().zip(&b[ib..ib + n]);
            for ((o, (&x, &y)), &z) in out.iter_mut().zip(ab).zip(c) {
                o.write(f.at([x, y, z]));
            }
        }
        (true, false) => {
            let y = b[ib];
            for ((o, &x), &z) in out.iter_mut().zip(&a[ia..ia + n]).zip(c) {
                o.write(f.at([x, y, z]));
            }
        }
        (false, true) => {
            let x = a[ia];
            for ((o, &y), &z) in out.iter_mut().zip(&b[ib..ib + n]).zip(c) {
                o.write(f.at([x, y, z]));
            }
        }
        (false, false) => {
            let (x, y) = (a[ia], b[ib]);
            for (o, &z) in out.iter_mut().zip(c) {
                o.write(f.at([x, y, z]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(l: &Layout) -> Vec<usize> {
        let mut it = StridedIter::new(l, 0);
        (0..l.numel()).map(|_| it.next_offset()).collect()
    }

    /// The inputs themselves, to read back which offsets were used.
    struct Inputs;
    impl<const K: usize> Elementwise<usize, K> for Inputs {
        type Out = [usize; K];
        fn at(&self, x: [usize; K]) -> [usize; K] {
            x
        }
    }

    /// Every element's offsets as the row plan sees them, per operand
    /// (each storage holds its own offsets).
    fn planned<const K: usize>(ls: [&Layout; K]) -> Option<[Vec<usize>; K]>
    where
        for<'a> RowZip<'a, usize, K, Inputs>: Chunks<[usize; K]>,
    {
        let p = Rows::plan(ls)?;
        let storages: [Vec<usize>; K] = ls.map(|l| (0..l.span().max(1)).collect());
        let out = p.map(storages.each_ref().map(|s| &s[..]), Inputs);
        Some(std::array::from_fn(|i| out.iter().map(|o| o[i]).collect()))
    }

    #[test]
    fn rows_match_the_strided_walk() {
        let x = Layout::contiguous(&[3, 5, 32]);
        let bias = Layout::contiguous(&[32]).broadcast_to(&[3, 5, 32]);
        let mean = Layout::contiguous(&[3, 5, 1]).broadcast_to(&[3, 5, 32]);
        let narrowed = Layout::contiguous(&[3, 5, 40]).narrow(2, 4, 32);
        for ls in [[&x, &bias], [&x, &mean], [&mean, &bias], [&narrowed, &bias]] {
            let got = planned(ls).expect("rows of 32 with strides 0/1");
            assert_eq!(got, [offsets(ls[0]), offsets(ls[1])]);
        }
    }

    #[test]
    fn chunks_split_rows_mid_way() {
        // Many short-enough rows that the parallel split lands mid-row.
        let dims = [3 * crate::PAR_CHUNK / 40 + 7, 40];
        let x = Layout::contiguous(&dims);
        let b = Layout::contiguous(&[40]).broadcast_to(&dims);
        let got = planned([&x, &b]).unwrap();
        assert_eq!(got, [offsets(&x), offsets(&b)]);
    }

    #[test]
    fn declines_transposes_and_short_rows() {
        let t = Layout::contiguous(&[64, 32]).swap(0, 1);
        let x = Layout::contiguous(&[32, 64]);
        assert!(Rows::plan([&x, &t]).is_none());
        let short = Layout::contiguous(&[100, 4]);
        let col = Layout::contiguous(&[4]).broadcast_to(&[100, 4]);
        assert!(Rows::plan([&short, &col]).is_none());
    }
}
