//! Row-wise fast path for broadcast operands.
//!
//! Most strided elementwise calls are broadcasts along whole rows: a bias
//! `[O]` added to `[N, O]`, a mean `[N, 1]` subtracted from `[N, F]`. After
//! merging the dims that are laid out alike in every operand, each operand's
//! innermost dim has stride 1 (a contiguous run) or 0 (one value repeated), so
//! each output row is a zip over slices, which vectorises, instead of an
//! offset computed per element.

use crate::dense::build;
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

    /// A new row-major vector of the common sizes, `row(segment, out)` filling
    /// `out` from one segment of a row: for each operand, the start offset of
    /// the segment's values in its storage and whether they are a run (else
    /// one value to repeat). Segments are whole rows except where a parallel
    /// chunk boundary splits one.
    pub(crate) fn build<T: Copy + Send>(
        &self,
        row: impl Fn([(usize, bool); K], &mut [MaybeUninit<T>]) + Sync,
    ) -> Vec<T> {
        let n = self.n;
        let total = n * self.outer[0].numel();
        build(total, |start, out| {
            let mut col = start % n;
            let mut its = self
                .outer
                .each_ref()
                .map(|l| StridedIter::new(l, start / n));
            let mut done = 0;
            while done < out.len() {
                let seg = (n - col).min(out.len() - done);
                let at = std::array::from_fn(|i| {
                    let base = its[i].next_offset();
                    if self.unit[i] {
                        (base + col, true)
                    } else {
                        (base, false)
                    }
                });
                row(at, &mut out[done..done + seg]);
                done += seg;
                col = 0;
            }
        })
    }
}

/// `f(a, b)` over one row segment: each operand a run at its offset or one
/// repeated value.
#[inline(always)]
pub(crate) fn zip2<A: Copy, B: Copy, T: Copy>(
    out: &mut [MaybeUninit<T>],
    (a, (ia, ua)): (&[A], (usize, bool)),
    (b, (ib, ub)): (&[B], (usize, bool)),
    f: impl Fn(A, B) -> T,
) {
    let n = out.len();
    match (ua, ub) {
        (true, true) => {
            for ((o, &x), &y) in out.iter_mut().zip(&a[ia..ia + n]).zip(&b[ib..ib + n]) {
                o.write(f(x, y));
            }
        }
        (true, false) => {
            let y = b[ib];
            for (o, &x) in out.iter_mut().zip(&a[ia..ia + n]) {
                o.write(f(x, y));
            }
        }
        (false, true) => {
            let x = a[ia];
            for (o, &y) in out.iter_mut().zip(&b[ib..ib + n]) {
                o.write(f(x, y));
            }
        }
        (false, false) => {
            let v = f(a[ia], b[ib]);
            for o in out.iter_mut() {
                o.write(v);
            }
        }
    }
}

/// `f(a, b, c)` over one row segment (see [`zip2`]); a repeated third
/// operand is rare (a gradient is dense), so it is handled as a pair.
#[inline(always)]
pub(crate) fn zip3<A: Copy, B: Copy, C: Copy, T: Copy>(
    out: &mut [MaybeUninit<T>],
    a: (&[A], (usize, bool)),
    b: (&[B], (usize, bool)),
    (c, (ic, uc)): (&[C], (usize, bool)),
    f: impl Fn(A, B, C) -> T,
) {
    let n = out.len();
    if !uc {
        let z = c[ic];
        return zip2(out, a, b, |x, y| f(x, y, z));
    }
    let c = &c[ic..ic + n];
    let (a, (ia, ua)) = a;
    let (b, (ib, ub)) = b;
    match (ua, ub) {
        (true, true) => {
            let ab = a[ia..ia + n].iter().zip(&b[ib..ib + n]);
            for ((o, (&x, &y)), &z) in out.iter_mut().zip(ab).zip(c) {
                o.write(f(x, y, z));
            }
        }
        (true, false) => {
            let y = b[ib];
            for ((o, &x), &z) in out.iter_mut().zip(&a[ia..ia + n]).zip(c) {
                o.write(f(x, y, z));
            }
        }
        (false, true) => {
            let x = a[ia];
            for ((o, &y), &z) in out.iter_mut().zip(&b[ib..ib + n]).zip(c) {
                o.write(f(x, y, z));
            }
        }
        (false, false) => {
            let (x, y) = (a[ia], b[ib]);
            for (o, &z) in out.iter_mut().zip(c) {
                o.write(f(x, y, z));
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

    /// Every element's offsets as the row plan sees them, per operand.
    fn planned<const K: usize>(ls: [&Layout; K]) -> Option<[Vec<usize>; K]> {
        let p = Rows::plan(ls)?;
        let out: Vec<[usize; K]> = p.build(|at, out| {
            for (k, o) in out.iter_mut().enumerate() {
                o.write(at.map(|(i, unit)| if unit { i + k } else { i }));
            }
        });
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
