//! Index kernels: `index_select`, `gather` and `scatter_add`.
//!
//! Index tensors are read through their layouts (they may be strided views)
//! and every index is checked before anything is written, so a bad index is
//! an [`Error::IndexOutOfRange`], never a wild read or a half-written result.

use crate::strided::StridedIter;
use crate::{gather_vec, Cpu, PAR_CHUNK};
use forma_core::ops::index::{check_index_layouts, IndexKernel};
use forma_core::shape::Dims;
use forma_core::{Error, Float, Layout, Result};

/// Reads an index view row-major and checks every entry against `0..size`
/// (negative indices are out of range, as in PyTorch's `index_select`,
/// `gather` and `scatter_add`). Returns the indices as `usize`.
fn checked_indices(op: &'static str, idx: &[i64], li: &Layout, size: usize) -> Result<Vec<usize>> {
    gather_vec(idx, li)
        .into_iter()
        .map(|i| {
            if i >= 0 && (i as u64) < size as u64 {
                Ok(i as usize)
            } else {
                Err(Error::IndexOutOfRange { op, index: i, size })
            }
        })
        .collect()
}

/// A view of `lx` over the index's sizes with the indexed axis's stride
/// zeroed: its offsets are the base offsets that `idx * stride` is added to.
fn base_view(lx: &Layout, li: &Layout, axis: usize) -> Layout {
    let mut l = *lx;
    l.dims = li.dims;
    l.strides[axis] = 0;
    l
}

fn sub_layout(l: &Layout, axes: std::ops::Range<usize>, offset: usize) -> Layout {
    Layout {
        dims: Dims::from_slice(&l.dims[axes.clone()]),
        strides: Dims::from_slice(&l.strides[axes]),
        offset,
    }
}

impl<E: Float> IndexKernel<E> for Cpu {
    fn index_select(
        &self,
        x: &Vec<E>,
        lx: &Layout,
        axis: usize,
        idx: &Vec<i64>,
        li: &Layout,
    ) -> Result<Vec<E>> {
        if li.rank() != 1 {
            return Err(Error::invalid(
                "index_select",
                format!("the index must have rank 1, not {}", li.rank()),
            ));
        }
        let ids = checked_indices("index_select", idx, li, lx.dims[axis])?;
        let k = ids.len();
        let mut dims = lx.dims;
        dims[axis] = k;
        let numel = dims.numel();
        if numel == 0 {
            return Ok(Vec::new());
        }
        // The output is `[pre..., k, post...]`: one block of `inner` elements
        // (the axes after `axis`) per (pre position, selected index).
        let inner: usize = lx.dims[axis + 1..].iter().product();
        let pre = sub_layout(lx, 0..axis, lx.offset);
        let post = sub_layout(lx, axis + 1..lx.rank(), 0);
        let dense_post = post.is_contiguous();
        let sa = lx.strides[axis];
        let mut out = vec![E::default(); numel];
        let run = |first_block: usize, chunk: &mut [E]| {
            let mut last_a = usize::MAX;
            let mut base_a = 0;
            for (bi, block) in chunk.chunks_exact_mut(inner).enumerate() {
                let b = first_block + bi;
                let (a, j) = (b / k, b % k);
                if a != last_a {
                    base_a = StridedIter::new(&pre, a).next_offset();
                    last_a = a;
                }
                let base = base_a + ids[j] * sa;
                if dense_post {
                    block.copy_from_slice(&x[base..base + inner]);
                } else {
                    let mut it = StridedIter::new(&post, 0);
                    for o in block {
                        *o = x[base + it.next_offset()];
                    }
                }
            }
        };
        crate::par::units_mut(&mut out, inner, run);
        Ok(out)
    }

    fn gather(
        &self,
        x: &Vec<E>,
        lx: &Layout,
        axis: usize,
        idx: &Vec<i64>,
        li: &Layout,
    ) -> Result<Vec<E>> {
        check_index_layouts("gather", lx, li, axis, None)?;
        let ids = checked_indices("gather", idx, li, lx.dims[axis])?;
        let mut out = vec![E::default(); ids.len()];
        if ids.is_empty() {
            return Ok(out);
        }
        let lb = base_view(lx, li, axis);
        let sa = lx.strides[axis];
        let run = |start: usize, chunk: &mut [E]| {
            let mut it = StridedIter::new(&lb, start);
            for (o, &i) in chunk.iter_mut().zip(&ids[start..]) {
                *o = x[it.next_offset() + i * sa];
            }
        };
        if out.len() >= 2 * PAR_CHUNK {
            crate::par::chunks_mut(&mut out, PAR_CHUNK, |c, chunk| run(c * PAR_CHUNK, chunk));
        } else {
            run(0, &mut out);
        }
        Ok(out)
    }

    fn scatter_add(
        &self,
        x: &Vec<E>,
        lx: &Layout,
        axis: usize,
        idx: &Vec<i64>,
        li: &Layout,
        src: &Vec<E>,
        ls: &Layout,
    ) -> Result<Vec<E>> {
        check_index_layouts("scatter_add", lx, li, axis, Some(ls))?;
        let ids = checked_indices("scatter_add", idx, li, lx.dims[axis])?;
        let mut out = gather_vec(x, lx);
        if ids.is_empty() {
            return Ok(out);
        }
        let vals = gather_vec(src, ls);
        let lo = Layout::contiguous(&lx.dims);
        let lb = base_view(&lo, li, axis);
        let sa = lo.strides[axis];
        // Sequential, in the index's row-major order: deterministic, and a
        // repeated target accumulates its sources in order (each add rounds to
        // `E`, as PyTorch's in-place `+=` does).
        let mut it = StridedIter::new(&lb, 0);
        for (&i, &v) in ids.iter().zip(&vals) {
            let o = it.next_offset() + i * sa;
            out[o] = E::from_acc(out[o].to_acc() + v.to_acc());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn iota(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32).collect()
    }

    fn oob(op: &'static str, index: i64, size: usize) -> Error {
        Error::IndexOutOfRange { op, index, size }
    }

    #[test]
    fn index_select_each_axis() {
        let x = iota(24);
        let l = Layout::contiguous(&[2, 3, 4]);
        let li = Layout::contiguous(&[2]);
        let r = Cpu.index_select(&x, &l, 0, &vec![1, 1], &li).unwrap();
        assert_eq!(r, [&x[12..], &x[12..]].concat());
        let r = Cpu.index_select(&x, &l, 1, &vec![2, 0], &li).unwrap();
        let want = vec![
            8., 9., 10., 11., 0., 1., 2., 3., 20., 21., 22., 23., 12., 13., 14., 15.,
        ];
        assert_eq!(r, want);
        let r = Cpu
            .index_select(&x, &l, 2, &vec![3, 0, 3], &Layout::contiguous(&[3]))
            .unwrap();
        let want: Vec<f32> = (0..6)
            .flat_map(|row| [4 * row + 3, 4 * row, 4 * row + 3])
            .map(|v| v as f32)
            .collect();
        assert_eq!(r, want);
        // Empty selection.
        let empty = Cpu.index_select(&x, &l, 1, &vec![], &Layout::contiguous(&[0]));
        assert_eq!(empty.unwrap(), Vec::<f32>::new());
    }

    #[test]
    fn index_select_views() {
        // Transposed x ([4, 3, 2] view), strided index (every other entry).
        let x = iota(24);
        let l = Layout::contiguous(&[2, 3, 4]).swap(0, 2);
        let idx = vec![2i64, -5, 0, -5];
        let li = Layout::contiguous(&[4]).slice_step(0, 0, 2, 2);
        let r = Cpu.index_select(&x, &l, 1, &idx, &li).unwrap();
        // r[c][j][a] = x[a*12 + ids[j]*4 + c] with ids = [2, 0].
        let mut want = vec![];
        for c in 0..4 {
            for b in [2, 0] {
                for a in 0..2 {
                    want.push((a * 12 + b * 4 + c) as f32);
                }
            }
        }
        assert_eq!(r, want);
        // Broadcast x: rows of [10, 20, 30] repeated, selected along axis 1.
        let xb = vec![10.0f32, 20., 30.];
        let lb = Layout::contiguous(&[3]).broadcast_to(&[4, 3]);
        let r = Cpu
            .index_select(&xb, &lb, 1, &vec![2, 2], &Layout::contiguous(&[2]))
            .unwrap();
        assert_eq!(r, vec![30.; 8]);
        // Narrowed x (non-zero offset).
        let ln = Layout::contiguous(&[2, 3, 4]).narrow(2, 1, 2);
        let r = Cpu
            .index_select(&x, &ln, 0, &vec![1], &Layout::contiguous(&[1]))
            .unwrap();
        assert_eq!(r, vec![13., 14., 17., 18., 21., 22.]);
    }

    #[test]
    fn index_select_large_is_parallel_and_exact() {
        // An embedding-like lookup: 50 000 rows of 8 out of a [100, 8] table.
        let table = iota(800);
        let lt = Layout::contiguous(&[100, 8]);
        let idx: Vec<i64> = (0..50_000).map(|i| (i * 37 % 100) as i64).collect();
        let r = Cpu
            .index_select(&table, &lt, 0, &idx, &Layout::contiguous(&[50_000]))
            .unwrap();
        for (row, &i) in idx.iter().enumerate() {
            assert_eq!(
                &r[row * 8..row * 8 + 8],
                &table[i as usize * 8..i as usize * 8 + 8]
            );
        }
        // And along the last axis of a transposed table.
        let r = Cpu
            .index_select(
                &table,
                &lt.swap(0, 1),
                1,
                &idx,
                &Layout::contiguous(&[50_000]),
            )
            .unwrap();
        for c in 0..8 {
            for (j, &i) in idx.iter().enumerate() {
                assert_eq!(r[c * 50_000 + j], table[i as usize * 8 + c]);
            }
        }
    }

    #[test]
    fn index_errors() {
        let x = iota(6);
        let l = Layout::contiguous(&[2, 3]);
        let li = Layout::contiguous(&[2]);
        assert_eq!(
            Cpu.index_select(&x, &l, 1, &vec![0, 3], &li),
            Err(oob("index_select", 3, 3))
        );
        assert_eq!(
            Cpu.index_select(&x, &l, 0, &vec![-1, 0], &li),
            Err(oob("index_select", -1, 2))
        );
        let l22 = Layout::contiguous(&[2, 2]);
        assert_eq!(
            Cpu.gather(&x, &l, 1, &vec![0, 1, 2, 3], &l22),
            Err(oob("gather", 3, 3))
        );
        assert_eq!(
            Cpu.gather(&x, &l, 0, &vec![0, -2, 1, 1], &l22),
            Err(oob("gather", -2, 2))
        );
        let src = vec![1.0f32; 4];
        assert_eq!(
            Cpu.scatter_add(&x, &l, 0, &vec![0, 1, 2, 0], &l22, &src, &l22),
            Err(oob("scatter_add", 2, 2))
        );
        assert_eq!(
            Cpu.scatter_add(&x, &l, 1, &vec![0, 1, 0, i64::MIN], &l22, &src, &l22),
            Err(oob("scatter_add", i64::MIN, 3))
        );
        // Indices into an empty axis are all out of range.
        assert_eq!(
            Cpu.index_select(
                &x,
                &Layout::contiguous(&[2, 0]),
                1,
                &vec![0],
                &Layout::contiguous(&[1])
            ),
            Err(oob("index_select", 0, 0))
        );
        // An index larger than x outside the axis is rejected, not read.
        assert!(Cpu
            .gather(&x, &l, 1, &vec![0; 6], &Layout::contiguous(&[3, 2]))
            .is_err());
    }

    #[test]
    fn gather_by_hand() {
        // torch.gather([[0,1,2],[3,4,5]], 1, [[2,0],[1,1]]) = [[2,0],[4,4]]
        let x = iota(6);
        let l = Layout::contiguous(&[2, 3]);
        let r = Cpu
            .gather(&x, &l, 1, &vec![2, 0, 1, 1], &Layout::contiguous(&[2, 2]))
            .unwrap();
        assert_eq!(r, vec![2., 0., 4., 4.]);
        // Axis 0 with a smaller index: [[1, 0, 1]] -> [[3, 1, 5]].
        let r = Cpu
            .gather(&x, &l, 0, &vec![1, 0, 1], &Layout::contiguous(&[1, 3]))
            .unwrap();
        assert_eq!(r, vec![3., 1., 5.]);
        // The index's axis may be longer than x's: [[0, 0, 1, 1]] along axis 0 of [2, 1].
        let r = Cpu
            .gather(
                &x,
                &Layout::contiguous(&[2, 1]),
                0,
                &vec![1, 0, 1, 1],
                &Layout::contiguous(&[4, 1]),
            )
            .unwrap();
        assert_eq!(r, vec![1., 0., 1., 1.]);
    }

    #[test]
    fn gather_views() {
        // x: transposed [3, 2] view of [[0,1,2],[3,4,5]] = [[0,3],[1,4],[2,5]].
        let x = iota(6);
        let lt = Layout::contiguous(&[2, 3]).swap(0, 1);
        let r = Cpu
            .gather(&x, &lt, 1, &vec![1, 1, 0], &Layout::contiguous(&[3, 1]))
            .unwrap();
        assert_eq!(r, vec![3., 4., 2.]);
        // Broadcast index: [[1], [0]] expanded to [2, 3] along axis 1 of x.
        let idx = vec![1i64, 0];
        let li = Layout::contiguous(&[2, 1]).broadcast_to(&[2, 3]);
        let r = Cpu
            .gather(&x, &Layout::contiguous(&[2, 3]), 1, &idx, &li)
            .unwrap();
        assert_eq!(r, vec![1., 1., 1., 3., 3., 3.]);
        // Transposed index over a [2, 3, 4] x along the middle axis.
        let x = iota(24);
        let lx = Layout::contiguous(&[2, 3, 4]);
        let idx: Vec<i64> = (0..8).map(|i| i % 3).collect(); // stored [4, 1, 2]
        let li = Layout::contiguous(&[4, 1, 2]).permute(&[2, 1, 0]); // view [2, 1, 4]
        let r = Cpu.gather(&x, &lx, 1, &idx, &li).unwrap();
        let mut want = vec![];
        for a in 0..2 {
            for c in 0..4 {
                let i = idx[c * 2 + a] as usize;
                want.push((a * 12 + i * 4 + c) as f32);
            }
        }
        assert_eq!(r, want);
    }

    #[test]
    fn gather_large() {
        let x = iota(200_000);
        let lx = Layout::contiguous(&[1000, 200]);
        let idx: Vec<i64> = (0..100_000).map(|i| (i * 7 % 200) as i64).collect();
        let r = Cpu
            .gather(&x, &lx, 1, &idx, &Layout::contiguous(&[1000, 100]))
            .unwrap();
        for (p, (&g, &i)) in r.iter().zip(&idx).enumerate() {
            assert_eq!(g, ((p / 100) * 200) as f32 + i as f32);
        }
    }

    #[test]
    fn scatter_add_by_hand() {
        // zeros(2, 3).scatter_add(1, [[0, 0], [2, 1]], [[1, 2], [3, 4]])
        //   = [[3, 0, 0], [0, 4, 3]]
        let x = vec![0.0f32; 6];
        let l = Layout::contiguous(&[2, 3]);
        let l22 = Layout::contiguous(&[2, 2]);
        let r = Cpu
            .scatter_add(
                &x,
                &l,
                1,
                &vec![0, 0, 2, 1],
                &l22,
                &vec![1., 2., 3., 4.],
                &l22,
            )
            .unwrap();
        assert_eq!(r, vec![3., 0., 0., 0., 4., 3.]);
        // Axis 0 onto a non-zero, transposed x: x view = [[0, 3], [1, 4], [2, 5]].
        let x = iota(6);
        let lt = Layout::contiguous(&[2, 3]).swap(0, 1);
        let l12 = Layout::contiguous(&[1, 2]);
        let r = Cpu
            .scatter_add(&x, &lt, 0, &vec![2, 2], &l12, &vec![10., 20.], &l12)
            .unwrap();
        assert_eq!(r, vec![0., 3., 1., 4., 12., 25.]);
        // Broadcast source and index views.
        let src = vec![1.0f32];
        let ls = Layout::contiguous(&[1, 1]).broadcast_to(&[2, 2]);
        let idx = vec![1i64];
        let r = Cpu
            .scatter_add(&vec![0.0f32; 6], &l, 1, &idx, &ls, &src, &ls)
            .unwrap();
        assert_eq!(r, vec![0., 2., 0., 0., 2., 0.]);
        // Empty index: a plain copy of x.
        let l0 = Layout::contiguous(&[2, 0]);
        let r = Cpu
            .scatter_add(&iota(6), &l, 1, &vec![], &l0, &vec![], &l0)
            .unwrap();
        assert_eq!(r, iota(6));
        // Mismatched index and source sizes.
        assert!(Cpu
            .scatter_add(&x, &l, 1, &vec![0; 4], &l22, &vec![0.; 2], &l12)
            .is_err());
    }

    #[test]
    fn scatter_add_accumulates_in_order() {
        // 3000 adds of 1 into one f16 slot: f16 stops at 2048 (2048 + 1 rounds
        // back to 2048), as PyTorch's in-place accumulation does; an f32
        // accumulator would reach 3000.
        let x = vec![f16::ZERO];
        let lx = Layout::contiguous(&[1]);
        let li = Layout::contiguous(&[3000]);
        let r = Cpu
            .scatter_add(&x, &lx, 0, &vec![0; 3000], &li, &vec![f16::ONE; 3000], &li)
            .unwrap();
        assert_eq!(r, vec![f16::from_f32(2048.)]);
        // Order matters in floating point: 1e8 + 1 - 1e8 in index order.
        let x = vec![0.0f32];
        let li = Layout::contiguous(&[3]);
        let r = Cpu
            .scatter_add(&x, &lx, 0, &vec![0; 3], &li, &vec![1e8, 1., -1e8], &li)
            .unwrap();
        assert_eq!(r, vec![0.]);
    }
}
