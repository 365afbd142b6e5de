//! Forma's CPU backend: [`Cpu`] implements [`Backend`] and every kernel trait
//! of `forma-core` on `Vec<E>` storages. Kernels work on erased sizes
//! ([`Layout`]), run in parallel with rayon above a size threshold, compute
//! half types in f32, and are generic over the op so hot loops have no dispatch.

pub mod ops;
pub mod strided;

use forma_core::{Backend, DefaultDevice, Dtype, Layout, Result};
use rayon::prelude::*;
use strided::StridedIter;

/// Elements per parallel task: below this, work stays on one thread.
pub const PAR_CHUNK: usize = 1 << 15;

/// The CPU device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpu;

impl DefaultDevice for Cpu {
    fn default_device() -> Self {
        Cpu
    }
}

/// Fills `out` (row-major over `layout`'s sizes) with `f(offset)` for each
/// element's storage offset, in parallel chunks for large outputs.
pub fn fill_strided<T: Send>(out: &mut [T], layout: &Layout, f: impl Fn(usize) -> T + Sync) {
    if let Some(r) = layout.contiguous_range() {
        let start = r.start;
        if out.len() >= 2 * PAR_CHUNK {
            out.par_chunks_mut(PAR_CHUNK)
                .enumerate()
                .for_each(|(c, chunk)| {
                    for (i, o) in chunk.iter_mut().enumerate() {
                        *o = f(start + c * PAR_CHUNK + i);
                    }
                });
        } else {
            for (i, o) in out.iter_mut().enumerate() {
                *o = f(start + i);
            }
        }
        return;
    }
    if out.len() >= 2 * PAR_CHUNK {
        out.par_chunks_mut(PAR_CHUNK)
            .enumerate()
            .for_each(|(c, chunk)| {
                let mut it = StridedIter::new(layout, c * PAR_CHUNK);
                for o in chunk.iter_mut() {
                    *o = f(it.next_offset());
                }
            });
    } else {
        let mut it = StridedIter::new(layout, 0);
        for o in out.iter_mut() {
            *o = f(it.next_offset());
        }
    }
}

/// Gathers a strided view into a new row-major `Vec`.
pub fn gather_vec<E: Dtype>(src: &[E], layout: &Layout) -> Vec<E> {
    if let Some(r) = layout.contiguous_range() {
        return src[r].to_vec();
    }
    let mut out = vec![E::default(); layout.numel()];
    fill_strided(&mut out, layout, |o| src[o]);
    out
}

impl Backend for Cpu {
    type Storage<E: Dtype> = Vec<E>;

    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn upload<E: Dtype>(&self, data: Vec<E>) -> Result<Vec<E>> {
        Ok(data)
    }

    fn full<E: Dtype>(&self, len: usize, value: E) -> Result<Vec<E>> {
        Ok(vec![value; len])
    }

    fn to_vec<E: Dtype>(&self, src: &Vec<E>, layout: &Layout) -> Result<Vec<E>> {
        Ok(gather_vec(src, layout))
    }

    fn contiguous<E: Dtype>(&self, src: &Vec<E>, layout: &Layout) -> Result<Vec<E>> {
        Ok(gather_vec(src, layout))
    }

    fn copy_strided<E: Dtype>(
        &self,
        src: &Vec<E>,
        src_layout: &Layout,
        dst: &mut Vec<E>,
        dst_layout: &Layout,
    ) -> Result<()> {
        debug_assert_eq!(src_layout.dims, dst_layout.dims);
        let mut si = StridedIter::new(src_layout, 0);
        let mut di = StridedIter::new(dst_layout, 0);
        for _ in 0..src_layout.numel() {
            dst[di.next_offset()] = src[si.next_offset()];
        }
        Ok(())
    }

    fn cast<E: Dtype, F: Dtype>(&self, src: &Vec<E>, layout: &Layout) -> Result<Vec<F>> {
        let mut out = vec![F::default(); layout.numel()];
        fill_strided(&mut out, layout, |o| src[o].cast::<F>());
        Ok(out)
    }
}
