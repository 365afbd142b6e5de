//! The erased view of a tensor that kernels see: sizes, strides (in elements)
//! and an offset into the storage. Views (transpose, narrow, expand, ...) only
//! change the layout; `contiguous()` copies only when the layout is not already
//! row-major.

use crate::shape::{Dims, MAX_RANK};

/// Sizes, strides and offset of a strided view over a storage.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
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

    /// The layout with new sizes when the data can be reinterpreted without a
    /// copy (contiguous), else `None`.
    pub fn reshape(&self, dims: &[usize]) -> Option<Self> {
        self.is_contiguous().then(|| {
            let mut l = Layout::contiguous(dims);
            l.offset = self.offset;
            l
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
