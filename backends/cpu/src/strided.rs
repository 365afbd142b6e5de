//! Walking a strided view in row-major order.

use forma_core::shape::{Dims, MAX_RANK};
use forma_core::Layout;

/// Yields the storage offsets of a view's elements in row-major order,
/// starting from any linear index (so parallel chunks can start mid-way).
#[derive(Debug)]
pub struct StridedIter {
    dims: Dims,
    strides: Dims,
    idx: [usize; MAX_RANK],
    offset: usize,
}

impl StridedIter {
    /// Positions the walk at linear index `start`.
    pub fn new(layout: &Layout, start: usize) -> Self {
        let mut idx = [0; MAX_RANK];
        let mut rem = start;
        let mut offset = layout.offset;
        for d in (0..layout.rank()).rev() {
            let n = layout.dims[d].max(1);
            idx[d] = rem % n;
            rem /= n;
            offset += idx[d] * layout.strides[d];
        }
        StridedIter {
            dims: layout.dims,
            strides: layout.strides,
            idx,
            offset,
        }
    }

    /// The current offset, then advances by one element.
    #[inline(always)]
    pub fn next_offset(&mut self) -> usize {
        let o = self.offset;
        let r = self.dims.len();
        let mut d = r;
        while d > 0 {
            d -= 1;
            self.idx[d] += 1;
            self.offset += self.strides[d];
            if self.idx[d] < self.dims[d] {
                return o;
            }
            self.offset -= self.strides[d] * self.dims[d];
            self.idx[d] = 0;
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_a_transposed_view() {
        let l = Layout::contiguous(&[2, 3]).swap(0, 1);
        let mut it = StridedIter::new(&l, 0);
        let offs: Vec<usize> = (0..6).map(|_| it.next_offset()).collect();
        assert_eq!(offs, vec![0, 3, 1, 4, 2, 5]);
        let mut mid = StridedIter::new(&l, 3);
        assert_eq!(mid.next_offset(), 4);
    }

    #[test]
    fn walks_a_broadcast_view() {
        let l = Layout::contiguous(&[3]).broadcast_to(&[2, 3]);
        let mut it = StridedIter::new(&l, 0);
        let offs: Vec<usize> = (0..6).map(|_| it.next_offset()).collect();
        assert_eq!(offs, vec![0, 1, 2, 0, 1, 2]);
    }
}
