//! [`CumsumKernel`] for [`Cuda`]: one thread per lane of the axis. The
//! kernel is short, so its CUDA C sits here as a string (a folder with a
//! `.cu` file beside `mod.rs` suits a longer one).

use crate::device::cfg_1d;
use crate::kernels::{float_module, tag};
use crate::{Cuda, CudaStorage};
use forma_core::ops::cumsum::CumsumKernel;
use forma_core::{DType, Float, Layout, Result};

/// The cumsum module source for dtype `d`.
pub(crate) fn source(d: DType) -> String {
    float_module(d, SOURCE)
}

/// Cumulative sums along one axis of a dense `[outer, n, inner]` view, one
/// thread per lane (consecutive threads take consecutive inner positions,
/// so their reads coalesce), accumulated in the accumulation type and
/// rounded once per output, as PyTorch's CPU kernel does.
const SOURCE: &str = r#"
extern "C" __global__ void cumsum(int reverse, const T* x, T* out, i64 outer, i64 n, i64 inner) {
    i64 lanes = outer * inner;
    for (i64 l = blockIdx.x * (i64)blockDim.x + threadIdx.x; l < lanes; l += (i64)gridDim.x * blockDim.x) {
        i64 base = (l / inner) * n * inner + (l % inner);
        A acc = (A)0;
        for (i64 k = 0; k < n; k++) {
            i64 j = base + (reverse ? n - 1 - k : k) * inner;
            acc += to_acc(x[j]);
            out[j] = from_acc<T>(acc);
        }
    }
}
"#;

impl<E: Float> CumsumKernel<E> for Cuda {
    fn cumsum(
        &self,
        x: &CudaStorage<E>,
        layout: &Layout,
        axis: usize,
        reverse: bool,
    ) -> Result<CudaStorage<E>> {
        let numel = layout.numel();
        let out = self.alloc::<E>(numel)?;
        if numel == 0 {
            return Ok(out);
        }
        // The output is row-major in the input's axis order: the same dense
        // [outer, n, inner] indexing as the lanes.
        let l = self.lanes(x, layout, axis)?;
        let key = format!("cumsum/{}", tag(E::DTYPE));
        let f = self.inner().function(&key, || source(E::DTYPE), "cumsum")?;
        let (rev, op_, o, nn, i) = (
            i32::from(reverse),
            out.ptr(),
            l.outer as i64,
            l.n as i64,
            l.inner as i64,
        );
        launch!(self, f, cfg_1d(l.outer * l.inner), rev, l.ptr, op_, o, nn, i)?;
        Ok(out)
    }
}
