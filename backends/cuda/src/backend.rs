//! [`Backend`] for [`Cuda`]: storages, host transfers, copies and casts.

use crate::{Cuda, CudaStorage};
use forma_core::{Backend, Dtype, Layout, Result};

/// The bytes of a slice of plain values.
fn as_bytes<E: Dtype>(v: &[E]) -> &[u8] {
    // SAFETY: every `Dtype` is plain data (floats, integers, bool) with no padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

impl Backend for Cuda {
    type Storage<E: Dtype> = CudaStorage<E>;

    fn grad_ops<F: Dtype>(&self) -> Option<&'static dyn forma_core::tape::GradOps<F, Self>> {
        forma_core::tape::float_grad_ops::<F, Self>()
    }

    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal())
    }

    fn upload<E: Dtype>(&self, data: Vec<E>) -> Result<CudaStorage<E>> {
        let s = self.alloc::<E>(data.len())?;
        self.inner().upload_bytes(s.ptr(), as_bytes(&data))?;
        Ok(s)
    }

    fn full<E: Dtype>(&self, len: usize, value: E) -> Result<CudaStorage<E>> {
        let s = self.alloc::<E>(len)?;
        self.fill(s.ptr(), len, value)?;
        Ok(s)
    }

    fn to_vec<E: Dtype>(&self, src: &CudaStorage<E>, layout: &Layout) -> Result<Vec<E>> {
        let mut out = vec![E::default(); layout.numel()];
        if out.is_empty() {
            return Ok(out);
        }
        match layout.contiguous_range() {
            Some(r) => self.inner().download(src.ptr_at(r.start), &mut out)?,
            None => {
                let c = self.contiguous(src, layout)?;
                self.inner().download(c.ptr(), &mut out)?;
            }
        }
        // The bytes of a `bool` came from kernels that write only 0 or 1.
        Ok(out)
    }

    fn contiguous<E: Dtype>(
        &self,
        src: &CudaStorage<E>,
        layout: &Layout,
    ) -> Result<CudaStorage<E>> {
        let n = layout.numel();
        let out = self.alloc::<E>(n)?;
        match layout.contiguous_range() {
            Some(r) => self.inner().copy_d2d(
                out.ptr(),
                src.ptr_at(r.start),
                n * std::mem::size_of::<E>(),
            )?,
            None => self.copy_view(src, layout, out.ptr(), &Layout::contiguous(&layout.dims))?,
        }
        Ok(out)
    }

    fn copy_strided<E: Dtype>(
        &self,
        src: &CudaStorage<E>,
        src_layout: &Layout,
        dst: &mut CudaStorage<E>,
        dst_layout: &Layout,
    ) -> Result<()> {
        debug_assert_eq!(src_layout.dims, dst_layout.dims);
        self.copy_view(src, src_layout, dst.ptr(), dst_layout)
    }

    fn cast<E: Dtype, F: Dtype>(
        &self,
        src: &CudaStorage<E>,
        layout: &Layout,
    ) -> Result<CudaStorage<F>> {
        self.cast_view(src, layout)
    }
}
