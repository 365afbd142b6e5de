//! Copies, fills and casts: what [`Backend`](forma_core::Backend) needs
//! besides host transfers. Copies and fills move elements as unsigned
//! integers of their width, so one module serves every dtype.

use crate::device::{cfg_1d, Lay};
use crate::kernels::{ctype, tag};
use crate::{Cuda, CudaStorage};
use forma_core::{DType, Dtype, Layout, Result};

/// The family's modules: the copy kernels, and a cast for every pair of
/// dtypes.
pub(crate) fn sources() -> Vec<(String, String)> {
    use crate::kernels::ALL;
    let mut v = vec![("copy".to_string(), source())];
    for s in ALL {
        for d in ALL {
            v.push((format!("cast/{}_{}", tag(s), tag(d)), cast_source(s, d)));
        }
    }
    v
}

/// The copy/fill module source.
pub(crate) fn source() -> String {
    include_str!("copy.cu").to_string()
}

/// The cast module source for one dtype pair.
pub(crate) fn cast_source(s: DType, d: DType) -> String {
    format!(
        "typedef {} SRC;\ntypedef {} DST;\n{}",
        ctype(s),
        ctype(d),
        include_str!("cast.cu")
    )
}

impl Cuda {
    /// Copies the view `ls` of `src` into the view `ld` of the block at `dst`
    /// (same sizes).
    pub(crate) fn copy_view<E: Dtype>(
        &self,
        src: &CudaStorage<E>,
        ls: &Layout,
        dst: u64,
        ld: &Layout,
    ) -> Result<()> {
        let n = ls.numel();
        if n == 0 {
            return Ok(());
        }
        let w = std::mem::size_of::<E>();
        let f = self
            .inner()
            .function("copy", source, &format!("copy_{w}"))?;
        let (sp, l1, l2, n) = (src.ptr(), Lay::new(ls), Lay::new(ld), n as i64);
        launch!(self, f, cfg_1d(n as usize), sp, l1, dst, l2, n)
    }

    /// Fills `len` elements of width `size_of::<E>()` at `dst` with `value`.
    pub(crate) fn fill<E: Dtype>(&self, dst: u64, len: usize, value: E) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let w = std::mem::size_of::<E>();
        let mut bits = 0u64;
        // SAFETY: copies the `w <= 8` bytes of `value` into the low bytes of `bits`
        // (little-endian, as on every CUDA host).
        unsafe {
            std::ptr::copy_nonoverlapping(
                &value as *const E as *const u8,
                &mut bits as *mut u64 as *mut u8,
                w,
            )
        };
        let f = self
            .inner()
            .function("copy", source, &format!("fill_{w}"))?;
        let n = len as i64;
        launch!(self, f, cfg_1d(len), dst, n, bits)
    }

    /// Casts a view into a new row-major storage.
    pub(crate) fn cast_view<E: Dtype, F: Dtype>(
        &self,
        src: &CudaStorage<E>,
        layout: &Layout,
    ) -> Result<CudaStorage<F>> {
        let n = layout.numel();
        let out = self.alloc::<F>(n)?;
        if n == 0 {
            return Ok(out);
        }
        let key = format!("cast/{}_{}", tag(E::DTYPE), tag(F::DTYPE));
        let f = self
            .inner()
            .function(&key, || cast_source(E::DTYPE, F::DTYPE), "cast")?;
        let (sp, l, dp, nn) = (src.ptr(), Lay::new(layout), out.ptr(), n as i64);
        launch!(self, f, cfg_1d(n), sp, l, dp, nn)?;
        Ok(out)
    }
}
