//! [`SoftmaxKernel`] for [`Cuda`]: one block per lane of the axis.

use crate::device::cfg_lanes;
use crate::kernels::{float_module, tag};
use crate::{Cuda, CudaStorage};
use forma_core::ops::softmax::SoftmaxKernel;
use forma_core::{DType, Float, Layout, Result};

/// The softmax module source for dtype `d`.
pub(crate) fn source(d: DType) -> String {
    float_module(d, include_str!("softmax.cu"))
}

impl<E: Float> SoftmaxKernel<E> for Cuda {
    fn softmax(
        &self,
        x: &CudaStorage<E>,
        layout: &Layout,
        axis: usize,
        log: bool,
    ) -> Result<CudaStorage<E>> {
        let numel = layout.numel();
        let out = self.alloc::<E>(numel)?;
        if numel == 0 {
            return Ok(out);
        }
        // The output is row-major in the input's axis order: the same dense
        // [outer, n, inner] indexing as the lanes.
        let l = self.lanes(x, layout, axis)?;
        let key = format!("softmax/{}", tag(E::DTYPE));
        let f = self
            .inner()
            .function(&key, || source(E::DTYPE), "softmax")?;
        let (lg, op_, o, nn, i) = (
            i32::from(log),
            out.ptr(),
            l.outer as i64,
            l.n as i64,
            l.inner as i64,
        );
        launch!(
            self,
            f,
            cfg_lanes(l.outer * l.inner, 0),
            lg,
            l.ptr,
            op_,
            o,
            nn,
            i
        )?;
        Ok(out)
    }
}
