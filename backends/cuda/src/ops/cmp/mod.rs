//! [`CmpKernel`] for [`Cuda`]: comparisons and `where`.

use crate::device::{cfg_1d, Lay};
use crate::kernels::{float_module, tag};
use crate::{Cuda, CudaStorage};
use forma_core::ops::cmp::{CmpKernel, CmpOp};
use forma_core::{DType, Float, Layout, Result};

/// The comparison module source for dtype `d`.
pub(crate) fn source(d: DType) -> String {
    float_module(d, include_str!("cmp.cu"))
}

impl<E: Float> CmpKernel<E> for Cuda {
    fn cmp(
        &self,
        op: CmpOp,
        a: &CudaStorage<E>,
        la: &Layout,
        b: &CudaStorage<E>,
        lb: &Layout,
    ) -> Result<CudaStorage<bool>> {
        let n = la.numel();
        let out = self.alloc::<bool>(n)?;
        if n == 0 {
            return Ok(out);
        }
        let code: i32 = match op {
            CmpOp::Eq => 0,
            CmpOp::Ne => 1,
            CmpOp::Lt => 2,
            CmpOp::Le => 3,
            CmpOp::Gt => 4,
            CmpOp::Ge => 5,
        };
        let key = format!("cmp/{}", tag(E::DTYPE));
        let f = self.inner().function(&key, || source(E::DTYPE), "cmp")?;
        let (ap, l1, bp, l2, op_, nn) = (
            a.ptr(),
            Lay::new(la),
            b.ptr(),
            Lay::new(lb),
            out.ptr(),
            n as i64,
        );
        launch!(self, f, cfg_1d(n), code, ap, l1, bp, l2, op_, nn)?;
        Ok(out)
    }

    fn where_cond(
        &self,
        cond: &CudaStorage<bool>,
        lc: &Layout,
        a: &CudaStorage<E>,
        la: &Layout,
        b: &CudaStorage<E>,
        lb: &Layout,
    ) -> Result<CudaStorage<E>> {
        let n = la.numel();
        let out = self.alloc::<E>(n)?;
        if n == 0 {
            return Ok(out);
        }
        let key = format!("cmp/{}", tag(E::DTYPE));
        let f = self
            .inner()
            .function(&key, || source(E::DTYPE), "where_cond")?;
        let (cp, l0, ap, l1, bp, l2) = (
            cond.ptr(),
            Lay::new(lc),
            a.ptr(),
            Lay::new(la),
            b.ptr(),
            Lay::new(lb),
        );
        let (op_, nn) = (out.ptr(), n as i64);
        launch!(self, f, cfg_1d(n), cp, l0, ap, l1, bp, l2, op_, nn)?;
        Ok(out)
    }
}
