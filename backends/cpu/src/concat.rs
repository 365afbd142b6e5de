//! `Backend::concat` for the CPU: the joined tensor written once, row by
//! row, into uninitialised memory (the default zero-fills it first and
//! copies each piece in a pass of its own).

use crate::{gather_vec, par, tune_allocator, PAR_CHUNK};
use forma_core::{Dtype, Layout};
use std::borrow::Cow;
use std::mem::MaybeUninit;

/// One piece seen as `[outer, width]`: row `o` of it is
/// `data[off + o * stride..]`, its elements `step` apart.
struct Piece<'a, E: Clone> {
    data: Cow<'a, [E]>,
    off: usize,
    stride: usize,
    step: usize,
    width: usize,
}

impl<E: Copy> Piece<'_, E> {
    /// Columns `j0..j0 + dst.len()` of row `o` into `dst`.
    #[inline]
    fn write(&self, o: usize, j0: usize, dst: &mut [MaybeUninit<E>]) {
        let base = self.off + o * self.stride + j0 * self.step;
        if self.step == 1 {
            let src = &self.data[base..base + dst.len()];
            // SAFETY: `src` and `dst` are `dst.len()` elements long and do not
            // overlap (`dst` is the new storage); `E` is `Copy`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr(),
                    dst.as_mut_ptr().cast::<E>(),
                    dst.len(),
                );
            }
        } else {
            for (t, d) in dst.iter_mut().enumerate() {
                d.write(self.data[base + t * self.step]);
            }
        }
    }
}

/// `parts` joined along `axis` (sizes agreeing elsewhere), row-major.
pub(crate) fn concat<E: Dtype>(parts: &[(&Vec<E>, &Layout)], axis: usize) -> Vec<E> {
    tune_allocator();
    let Some((_, first)) = parts.first() else {
        return Vec::new();
    };
    let outer: usize = first.dims[..axis].iter().product();
    let inner: usize = first.dims[axis + 1..].iter().product();
    let pieces: Vec<Piece<'_, E>> = parts
        .iter()
        .filter(|(_, l)| l.numel() > 0)
        .map(|&(s, l)| {
            let width = l.dims[axis] * inner;
            match l.reshape(&[outer, width]) {
                Some(v) => Piece {
                    data: Cow::Borrowed(&s[..]),
                    off: v.offset,
                    stride: v.strides[0],
                    step: v.strides[1],
                    width,
                },
                None => Piece {
                    data: Cow::Owned(gather_vec(s, l)),
                    off: 0,
                    stride: width,
                    step: 1,
                    width,
                },
            }
        })
        .collect();
    let row: usize = pieces.iter().map(|p| p.width).sum();
    let n = outer * row;
    let mut out: Vec<E> = Vec::with_capacity(n);
    // Columns `c0..c0 + dst.len()` of output row `o`, across the pieces.
    let fill = |o: usize, c0: usize, dst: &mut [MaybeUninit<E>]| {
        let (mut c, mut k, mut start) = (c0, 0, 0);
        for p in &pieces {
            let end = start + p.width;
            if k < dst.len() && c < end {
                let take = (end - c).min(dst.len() - k);
                p.write(o, c - start, &mut dst[k..k + take]);
                c += take;
                k += take;
            }
            start = end;
        }
        debug_assert_eq!(k, dst.len(), "the pieces cover the row");
    };
    let spare = &mut out.spare_capacity_mut()[..n];
    if n >= 2 * PAR_CHUNK && outer == 1 {
        // One long row: pieces of it, each starting mid-row.
        par::chunks_mut(spare, PAR_CHUNK, |i, chunk| fill(0, i * PAR_CHUNK, chunk));
    } else if n >= 2 * PAR_CHUNK {
        par::units_mut(spare, row, |o0, chunk| {
            for (i, r) in chunk.chunks_mut(row).enumerate() {
                fill(o0 + i, 0, r);
            }
        });
    } else {
        for (o, r) in spare.chunks_mut(row.max(1)).enumerate() {
            fill(o, 0, r);
        }
    }
    // SAFETY: every row `o < outer` is `row` elements, each written by the
    // one piece whose columns hold it (the widths sum to `row`).
    unsafe { out.set_len(n) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use forma_core::Backend;

    /// The default (zero-fill, then a copy per piece), for comparison.
    fn by_copies(parts: &[(&Vec<i64>, &Layout)], axis: usize) -> Vec<i64> {
        let mut dims = parts[0].1.dims;
        dims[axis] = parts.iter().map(|(_, l)| l.dims[axis]).sum();
        let mut out = vec![0; dims.numel()];
        let whole = Layout::contiguous(&dims);
        let mut start = 0;
        for (s, l) in parts {
            let len = l.dims[axis];
            crate::Cpu
                .copy_strided(s, l, &mut out, &whole.narrow(axis, start, len))
                .unwrap();
            start += len;
        }
        out
    }

    #[test]
    fn concat_matches_copying_each_piece() {
        let data: Vec<i64> = (0..400_000).collect();
        // (dims of each piece, axis, a transposed piece among them): short
        // and long rows, a single row split in parallel, strided pieces
        // that reshape and one that must be gathered, an empty piece.
        let cases: [(&[&[usize]], usize); 7] = [
            (&[&[2, 3], &[2, 4]], 1),
            (&[&[3, 5], &[1, 5], &[0, 5]], 0),
            (&[&[32, 1, 256], &[32, 1, 256], &[32, 1, 256]], 1),
            (&[&[100_000], &[90_000]], 0),
            (&[&[40, 700, 3], &[40, 500, 3]], 1),
            (&[&[7, 9, 11], &[7, 9, 2]], 2),
            (&[&[64, 2, 300], &[64, 3, 300]], 1),
        ];
        for (dims, axis) in cases {
            // Every other piece a transposed view of the first two axes.
            let layouts: Vec<Layout> = dims
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    if i % 2 == 1 && d.len() >= 2 {
                        let mut sw = d.to_vec();
                        sw.swap(0, 1);
                        let mut l = Layout::contiguous(&sw).swap(0, 1);
                        l.offset = 3;
                        l
                    } else {
                        Layout::contiguous(d)
                    }
                })
                .collect();
            let parts: Vec<(&Vec<i64>, &Layout)> = layouts.iter().map(|l| (&data, l)).collect();
            assert_eq!(
                concat(&parts, axis),
                by_copies(&parts, axis),
                "{dims:?} axis {axis}"
            );
        }
    }
}
