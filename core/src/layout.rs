//! The erased view of a tensor that kernels see: sizes, strides (in elements)
//! and an offset into the storage. Views (transpose, narrow, expand, ...) only
//! change the layout; `contiguous()` copies only when the layout is not already
//! row-major.

use crate::shape::{Dims, MAX_RANK};

/// Sizes, strides and offset of a strided view over a storage.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Layout {
    /// Sizes.
    pub dims: Dims,
    /// Strides in elements; 0 for a broadcast (expanded) dim.
    pub strides: Dims,
    /// Offset of the first element in the storage.
    pub offset: usize,
}

impl Layout {
    /// A row-major layout of the given sizes at offset 0.
    pub fn contiguous(dims: &[usize]) -> Self {
        let dims = Dims::from_slice(dims);
        let mut strides = dims;
        let mut acc = 1;
        for i in (0..dims.len()).rev() {
            strides[i] = acc;
            acc *= dims[i];
        }
        Layout {
            dims,
            strides,
            offset: 0,
        }
    }

    /// Rank.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.numel()
    }

    /// Whether the elements are row-major and dense (ignoring size-1 dims).
    pub fn is_contiguous(&self) -> bool {
        let mut acc = 1;
        for i in (0..self.rank()).rev() {
            if self.dims[i] != 1 && self.strides[i] != acc {
                return false;
            }
            acc *= self.dims[i];
        }
        true
    }

    /// The contiguous element range `[offset, offset + numel)` when the view
    /// is dense and row-major.
    pub fn contiguous_range(&self) -> Option<std::ops::Range<usize>> {
        self.is_contiguous()
            .then(|| self.offset..self.offset + self.numel())
    }

    /// One past the largest storage index the view touches (0 when empty).
    pub fn span(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset
            + self
                .dims
                .iter()
                .zip(self.strides.iter())
                .map(|(d, s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// Swaps two axes.
    pub fn swap(&self, a: usize, b: usize) -> Self {
        let mut l = *self;
        l.dims.swap(a, b);
        l.strides.swap(a, b);
        l
    }

    /// Reorders the axes: output axis `i` is input axis `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Self {
        let mut l = *self;
        for (i, &p) in perm.iter().enumerate() {
            l.dims[i] = self.dims[p];
            l.strides[i] = self.strides[p];
        }
        l
    }

    /// Restricts an axis to `start..start + len`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Self {
        let mut l = *self;
        l.offset += start * self.strides[axis];
        l.dims[axis] = len;
        l
    }

    /// Keeps every `step`-th element of an axis from `start`, `len` of them.
    pub fn slice_step(&self, axis: usize, start: usize, len: usize, step: usize) -> Self {
        let mut l = self.narrow(axis, start, len);
        l.strides[axis] *= step;
        l
    }

    /// Inserts a size-1 axis at `axis`.
    pub fn insert_axis(&self, axis: usize) -> Self {
        let mut d: Vec<usize> = self.dims.to_vec();
        let mut s: Vec<usize> = self.strides.to_vec();
        let stride = if axis < d.len() { s[axis] * d[axis] } else { 1 };
        d.insert(axis, 1);
        s.insert(axis, stride);
        Layout {
            dims: Dims::from_slice(&d),
            strides: Dims::from_slice(&s),
            offset: self.offset,
        }
    }

    /// Views of one set of sizes, over as few dims as they allow: size-1
    /// dims dropped, and each run of neighbouring dims that every view
    /// steps through evenly (a dim's stride the next one's times its size,
    /// in all of them) merged into one. The elements and their row-major
    /// order are unchanged, so a kernel walking the last dim walks rows as
    /// long as the views allow: a scalar expanded to `[1, n, 1]` becomes
    /// one row of `n` with stride 0. An empty view is returned as it is.
    ///
    /// ```
    /// use forma_core::Layout;
    /// let x = Layout::contiguous(&[4, 3, 5]).narrow(2, 0, 5);
    /// let g = Layout::contiguous(&[]).broadcast_to(&[4, 3, 5]);
    /// let [x, g] = Layout::coalesce([&x, &g]);
    /// assert_eq!((&x.dims[..], &x.strides[..]), (&[60][..], &[1][..]));
    /// assert_eq!((&g.dims[..], &g.strides[..]), (&[60][..], &[0][..]));
    /// ```
    pub fn coalesce<const K: usize>(layouts: [&Layout; K]) -> [Layout; K] {
        let Some(first) = layouts.first() else {
            return layouts.map(|l| *l);
        };
        if first.numel() == 0 {
            return layouts.map(|l| *l);
        }
        let mut dims: Vec<usize> = Vec::with_capacity(first.rank());
        let mut strides: [Vec<usize>; K] = std::array::from_fn(|_| Vec::new());
        for i in 0..first.rank() {
            let d = first.dims[i];
            if d == 1 {
                continue;
            }
            let merges = !dims.is_empty()
                && (0..K).all(|k| strides[k].last() == Some(&(layouts[k].strides[i] * d)));
            if merges {
                *dims.last_mut().expect("a dim to merge into") *= d;
                for k in 0..K {
                    *strides[k].last_mut().expect("as many strides as dims") =
                        layouts[k].strides[i];
                }
            } else {
                dims.push(d);
                for k in 0..K {
                    strides[k].push(layouts[k].strides[i]);
                }
            }
        }
        std::array::from_fn(|k| Layout {
            dims: Dims::from_slice(&dims),
            strides: Dims::from_slice(&strides[k]),
            offset: layouts[k].offset,
        })
    }

    /// Removes an axis (which must have size 1, or the view is being reduced).
    pub fn remove_axis(&self, axis: usize) -> Self {
        let mut d: Vec<usize> = self.dims.to_vec();
        let mut s: Vec<usize> = self.strides.to_vec();
        d.remove(axis);
        s.remove(axis);
        Layout {
            dims: Dims::from_slice(&d),
            strides: Dims::from_slice(&s),
            offset: self.offset,
        }
    }

    /// The layout broadcast to `target` sizes (aligned from the right): stretched
    /// dims get stride 0. The caller has checked compatibility.
    pub fn broadcast_to(&self, target: &[usize]) -> Self {
        debug_assert!(target.len() >= self.rank() && target.len() <= MAX_RANK);
        let mut strides = Dims::from_slice(&vec![0; target.len()]);
        let extra = target.len() - self.rank();
        for i in 0..self.rank() {
            strides[extra + i] = if self.dims[i] == target[extra + i] {
                self.strides[i]
            } else {
                0
            };
        }
        Layout {
            dims: Dims::from_slice(target),
            strides,
            offset: self.offset,
        }
    }

    /// The layout with new sizes (as many elements) when the data can be
    /// reinterpreted without a copy, else `None`: like PyTorch's `view`, any
    /// run of dims that is dense within itself (each dim's stride the next
    /// one's times its size) may be split or merged, so a contiguous layout
    /// reshapes to anything, and a strided view when each new dim lies
    /// within one such run (splitting the last dim of a column slice, say).
    pub fn reshape(&self, dims: &[usize]) -> Option<Self> {
        if self.is_contiguous() {
            let mut l = Layout::contiguous(dims);
            l.offset = self.offset;
            return Some(l);
        }
        if self.numel() == 0 {
            // Nothing to view (and the offset may lie past the storage): a
            // copy of no elements is as cheap.
            return None;
        }
        let (old, old_strides) = (&self.dims[..], &self.strides[..]);
        let mut strides = Dims::from_slice(dims);
        // Walk the old dims from the innermost, a dense run at a time; fill
        // the new dims that span exactly the same elements.
        let mut view_d = dims.len();
        let mut base = *old_strides.last()?;
        let (mut run, mut view_run) = (1usize, 1usize);
        for d in (0..old.len()).rev() {
            run *= old[d];
            let run_ends = d == 0 || (old[d - 1] != 1 && old_strides[d - 1] != run * base);
            if !run_ends {
                continue;
            }
            while view_d > 0 && (view_run < run || dims[view_d - 1] == 1) {
                view_d -= 1;
                strides[view_d] = view_run * base;
                view_run *= dims[view_d];
            }
            if view_run != run {
                return None;
            }
            if d > 0 {
                base = old_strides[d - 1];
                (run, view_run) = (1, 1);
            }
        }
        (view_d == 0).then_some(Layout {
            dims: Dims::from_slice(dims),
            strides,
            offset: self.offset,
        })
    }
}

/// Broadcasts two sets of sizes with PyTorch's rules (aligned from the right;
/// a size 1 stretches). `None` when they are incompatible.
pub fn broadcast_dims(a: &[usize], b: &[usize]) -> Option<Dims> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (k, o) in out.iter_mut().enumerate() {
        let da = (k + a.len()).checked_sub(n).map_or(1, |i| a[i]);
        let db = (k + b.len()).checked_sub(n).map_or(1, |i| b[i]);
        *o = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(Dims::from_slice(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_are_row_major() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(&*l.strides, &[12, 4, 1]);
        assert!(l.is_contiguous());
        assert!(!l.swap(0, 2).is_contiguous());
        assert_eq!(l.span(), 24);
    }

    #[test]
    fn reshape_views_what_needs_no_copy() {
        // A column slice [2, 3, 4] of a [2, 3, 10] tensor: the last dim
        // splits and the first two merge; the last cannot merge with the
        // others.
        let slice = Layout {
            dims: Dims::from_slice(&[2, 3, 4]),
            strides: Dims::from_slice(&[30, 10, 1]),
            offset: 5,
        };
        let split = slice.reshape(&[2, 3, 2, 2]).unwrap();
        assert_eq!(&*split.strides, &[30, 10, 2, 1]);
        assert_eq!(split.offset, 5);
        assert_eq!(&*slice.reshape(&[6, 4]).unwrap().strides, &[10, 1]);
        assert!(slice.reshape(&[2, 12]).is_none());
        assert!(slice.reshape(&[24]).is_none());
        // A transpose: each dim splits on its own, and size-1 dims (whose
        // stride is never used) can be added, but the two never merge.
        let t = Layout::contiguous(&[3, 4]).swap(0, 1);
        let r = t.reshape(&[4, 1, 3]).unwrap();
        assert_eq!((r.strides[0], r.strides[2]), (1, 4));
        assert_eq!(&*t.reshape(&[2, 2, 3]).unwrap().strides, &[2, 1, 4]);
        assert!(t.reshape(&[12]).is_none());
        assert!(t.reshape(&[4, 3, 1]).is_some());
        assert!(t.reshape(&[6, 2]).is_none());
        // Broadcast dims keep stride 0 when they stay whole.
        let b = Layout {
            dims: Dims::from_slice(&[3, 4]),
            strides: Dims::from_slice(&[0, 1]),
            offset: 0,
        };
        assert_eq!(&*b.reshape(&[3, 2, 2]).unwrap().strides, &[0, 2, 1]);
        assert!(b.reshape(&[12]).is_none());
        // Every view gives each element the address the original gives it.
        let cases: [(Layout, &[usize]); 4] = [
            (slice, &[2, 3, 2, 2]),
            (slice, &[6, 2, 2]),
            (t, &[2, 2, 3]),
            (b, &[3, 2, 2]),
        ];
        for (l, dims) in cases {
            let r = l.reshape(dims).unwrap();
            let addr = |l: &Layout, idx: &[usize]| {
                l.offset
                    + idx
                        .iter()
                        .zip(&*l.strides)
                        .map(|(i, s)| i * s)
                        .sum::<usize>()
            };
            let unravel = |mut i: usize, dims: &[usize]| {
                let mut idx = vec![0; dims.len()];
                for d in (0..dims.len()).rev() {
                    idx[d] = i % dims[d];
                    i /= dims[d];
                }
                idx
            };
            for i in 0..l.numel() {
                assert_eq!(
                    addr(&l, &unravel(i, &l.dims)),
                    addr(&r, &unravel(i, &r.dims))
                );
            }
        }
    }

    #[test]
    fn broadcast_rules() {
        assert_eq!(&*broadcast_dims(&[3, 1], &[4]).unwrap(), &[3, 4]);
        assert_eq!(&*broadcast_dims(&[], &[2]).unwrap(), &[2]);
        assert!(broadcast_dims(&[3], &[4]).is_none());
        let l = Layout::contiguous(&[3, 1]).broadcast_to(&[2, 3, 4]);
        assert_eq!(&*l.strides, &[0, 1, 0]);
    }

    #[test]
    fn insert_and_remove_axis() {
        let l = Layout::contiguous(&[2, 3]);
        let u = l.insert_axis(1);
        assert_eq!(&*u.dims, &[2, 1, 3]);
        assert_eq!(u.remove_axis(1), l);
        assert_eq!(&*l.insert_axis(2).dims, &[2, 3, 1]);
    }
}
