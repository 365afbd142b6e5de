//! [`IndexKernel`] for [`Cuda`]: `index_select`, `gather`, `scatter_add`.
//!
//! Every index is checked on the device before the op runs and a bad one
//! is an [`Error::IndexOutOfRange`] like the CPU's; returning that error is
//! a value the host needs, so each index op waits for the stream once.
//! `scatter_add` accumulates with atomics: repeated targets sum in an
//! unspecified order (PyTorch's CUDA behaviour), so the last bits of a
//! float sum may differ from the CPU's sequential order.

use crate::device::{cfg_1d, Lay};
use crate::kernels::{float_module, tag};
use crate::{Cuda, CudaStorage};
use forma_core::ops::index::{IndexKernel, check_index_layouts};
use forma_core::{Backend, DType, Error, Float, Layout, Result};

/// The index module source for dtype `d`.
pub(crate) fn source(d: DType) -> String {
    float_module(d, include_str!("index.cu"))
}

/// The storage offset of row-major position `p` of a view.
fn offset_of(l: &Layout, mut p: usize) -> usize {
    let mut off = l.offset;
    for d in (0..l.rank()).rev() {
        off += (p % l.dims[d]) * l.strides[d];
        p /= l.dims[d];
    }
    off
}

impl Cuda {
    /// Checks every index of the view against `0..size` on the device.
    fn check_indices<E: Float>(
        &self,
        op: &'static str,
        idx: &CudaStorage<i64>,
        li: &Layout,
        size: usize,
    ) -> Result<()> {
        let n = li.numel();
        if n == 0 {
            return Ok(());
        }
        let flag = self.full::<i64>(1, i64::MAX)?;
        let key = format!("index/{}", tag(E::DTYPE));
        let f = self
            .inner()
            .function(&key, || source(E::DTYPE), "check_idx")?;
        let (ip, l, nn, sz, fp) = (idx.ptr(), Lay::new(li), n as i64, size as i64, flag.ptr());
        launch!(self, f, cfg_1d(n), ip, l, nn, sz, fp)?;
        let mut first = [0i64];
        self.inner().download(flag.ptr(), &mut first)?;
        if first[0] == i64::MAX {
            return Ok(());
        }
        let mut bad = [0i64];
        self.inner()
            .download(idx.ptr_at(offset_of(li, first[0] as usize)), &mut bad)?;
        Err(Error::IndexOutOfRange {
            op,
            index: bad[0],
            size,
        })
    }
}

impl<E: Float> IndexKernel<E> for Cuda {
    fn index_select(
        &self,
        x: &CudaStorage<E>,
        lx: &Layout,
        axis: usize,
        idx: &CudaStorage<i64>,
        li: &Layout,
    ) -> Result<CudaStorage<E>> {
        if li.rank() != 1 {
            return Err(Error::invalid(
                "index_select",
                format!("the index must have rank 1, not {}", li.rank()),
            ));
        }
        self.check_indices::<E>("index_select", idx, li, lx.dims[axis])?;
        let mut dims = lx.dims;
        dims[axis] = li.dims[0];
        let n = dims.numel();
        let out = self.alloc::<E>(n)?;
        if n == 0 {
            return Ok(out);
        }
        let key = format!("index/{}", tag(E::DTYPE));
        let f = self
            .inner()
            .function(&key, || source(E::DTYPE), "index_select")?;
        let (xp, l1, ax, ip, l2) = (x.ptr(), Lay::new(lx), axis as i32, idx.ptr(), Lay::new(li));
        let (op_, lo, nn) = (out.ptr(), Lay::new(&Layout::contiguous(&dims)), n as i64);
        launch!(self, f, cfg_1d(n), xp, l1, ax, ip, l2, op_, lo, nn)?;
        Ok(out)
    }

    fn gather(
        &self,
        x: &CudaStorage<E>,
        lx: &Layout,
        axis: usize,
        idx: &CudaStorage<i64>,
        li: &Layout,
    ) -> Result<CudaStorage<E>> {
        check_index_layouts("gather", lx, li, axis, None)?;
        self.check_indices::<E>("gather", idx, li, lx.dims[axis])?;
        let n = li.numel();
        let out = self.alloc::<E>(n)?;
        if n == 0 {
            return Ok(out);
        }
        let key = format!("index/{}", tag(E::DTYPE));
        let f = self.inner().function(&key, || source(E::DTYPE), "gather")?;
        let (xp, l1, ax, ip, l2) = (x.ptr(), Lay::new(lx), axis as i32, idx.ptr(), Lay::new(li));
        let (op_, nn) = (out.ptr(), n as i64);
        launch!(self, f, cfg_1d(n), xp, l1, ax, ip, l2, op_, nn)?;
        Ok(out)
    }

    fn scatter_add(
        &self,
        x: &CudaStorage<E>,
        lx: &Layout,
        axis: usize,
        idx: &CudaStorage<i64>,
        li: &Layout,
        src: &CudaStorage<E>,
        ls: &Layout,
    ) -> Result<CudaStorage<E>> {
        check_index_layouts("scatter_add", lx, li, axis, Some(ls))?;
        self.check_indices::<E>("scatter_add", idx, li, lx.dims[axis])?;
        let out = self.contiguous(x, lx)?;
        let n = li.numel();
        if n == 0 {
            return Ok(out);
        }
        let key = format!("index/{}", tag(E::DTYPE));
        let f = self
            .inner()
            .function(&key, || source(E::DTYPE), "scatter_add")?;
        let (op_, lo, ax, ip, l2) = (
            out.ptr(),
            Lay::new(&Layout::contiguous(&lx.dims)),
            axis as i32,
            idx.ptr(),
            Lay::new(li),
        );
        let (sp, l3, nn) = (src.ptr(), Lay::new(ls), n as i64);
        launch!(self, f, cfg_1d(n), op_, lo, ax, ip, l2, sp, l3, nn)?;
        Ok(out)
    }
}
