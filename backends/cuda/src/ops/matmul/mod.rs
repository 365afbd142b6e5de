//! [`MatmulKernel`] for [`Cuda`]: (batched) matmul as one cuBLAS strided
//! batched gemm (`cublasGemmStridedBatchedEx`); f16 and bf16 with f32
//! compute, f32 in full f32 (no TF32, PyTorch's default for matmul), f64 in
//! f64. Operands whose views cuBLAS can read directly (row- or column-major
//! matrices with one batch stride, 0 for a broadcast batch) are not copied.
//! The gemm helper here also serves the convolution.

use crate::{Cuda, CudaStorage};
use cudarc::cublas::result as blas;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use forma_core::ops::matmul::MatmulKernel;
use forma_core::{Backend, DType, Dtype, Float, Layout, Result};

/// A matrix operand of a batched gemm, seen row-major as `rows x cols`:
/// element `(r, c)` of batch `b` is at `ptr + b * batch + r * ld + c`, or at
/// `ptr + b * batch + r + c * ld` when `trans` (stored column-major).
/// Offsets in elements.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mat {
    pub(crate) ptr: u64,
    pub(crate) ld: usize,
    pub(crate) trans: bool,
    pub(crate) batch: usize,
}

/// `(ld, trans, batch stride)` of a view `[batch.., rows, cols]` that cuBLAS
/// reads directly, or `None`.
fn mat_of(l: &Layout) -> Option<(usize, bool, usize)> {
    let r = l.rank();
    let (rows, cols) = (l.dims[r - 2], l.dims[r - 1]);
    let (rs, cs) = (l.strides[r - 2], l.strides[r - 1]);
    let (ld, trans) = if cols == 1 || cs == 1 {
        (if rows == 1 { cols.max(1) } else { rs }, false)
    } else if rows == 1 || rs == 1 {
        (if cols == 1 { rows.max(1) } else { cs }, true)
    } else {
        return None;
    };
    if ld < if trans { rows.max(1) } else { cols.max(1) } {
        return None;
    }
    let batch: Vec<(usize, usize)> = (0..r - 2)
        .filter(|&d| l.dims[d] > 1)
        .map(|d| (l.dims[d], l.strides[d]))
        .collect();
    let stride = match batch.last() {
        None => 0,
        Some(&(_, s)) => {
            if batch.windows(2).any(|w| w[0].1 != w[1].1 * w[1].0) {
                return None;
            }
            s
        }
    };
    Some((ld, trans, stride))
}

fn data_type(d: DType) -> cudaDataType {
    match d {
        DType::F64 => cudaDataType::CUDA_R_64F,
        DType::F16 => cudaDataType::CUDA_R_16F,
        DType::BF16 => cudaDataType::CUDA_R_16BF,
        _ => cudaDataType::CUDA_R_32F,
    }
}

impl Cuda {
    /// A gemm operand for a view: the view itself when cuBLAS can read it,
    /// else a row-major copy (returned so it lives until the gemm is issued;
    /// the stream orders its reuse).
    pub(crate) fn mat_operand<E: Dtype>(
        &self,
        x: &CudaStorage<E>,
        l: &Layout,
    ) -> Result<(Mat, Option<CudaStorage<E>>)> {
        if let Some((ld, trans, batch)) = mat_of(l) {
            let m = Mat {
                ptr: x.ptr_at(l.offset),
                ld,
                trans,
                batch,
            };
            return Ok((m, None));
        }
        let c = self.contiguous(x, l)?;
        let (ld, trans, batch) =
            mat_of(&Layout::contiguous(&l.dims)).expect("row-major is readable");
        Ok((
            Mat {
                ptr: c.ptr(),
                ld,
                trans,
                batch,
            },
            Some(c),
        ))
    }

    /// `C[b] = A[b] B[b] + beta C[b]` for `batch` row-major products of
    /// `m x k` by `k x n`; `C` is dense `m x n` (ld `n`) at `c + b * stride_c`.
    /// Inputs have dtype `dt`, the output `ct` (f32 output from half inputs is
    /// allowed). Offsets in elements of each operand's dtype.
    pub(crate) fn gemm(
        &self,
        dt: DType,
        ct: DType,
        (m, n, k): (usize, usize, usize),
        a: Mat,
        b: Mat,
        c: u64,
        stride_c: usize,
        batch: usize,
        beta: f64,
    ) -> Result<()> {
        if m == 0 || n == 0 || batch == 0 {
            return Ok(());
        }
        let inner = self.inner();
        let big = |v: usize| v > i32::MAX as usize;
        if [m, n, k, a.ld, b.ld, batch].into_iter().any(big) {
            return Err(inner.err(format!(
                "matmul sizes {m}x{k}x{n} (batch {batch}) exceed cuBLAS's 32-bit limits"
            )));
        }
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (alpha32, beta32, alpha64) = (1.0f32, beta as f32, 1.0f64);
        let f64_compute = dt == DType::F64;
        let (pa, pb): (*const std::ffi::c_void, *const std::ffi::c_void) = if f64_compute {
            (
                &alpha64 as *const f64 as *const _,
                &beta as *const f64 as *const _,
            )
        } else {
            (
                &alpha32 as *const f32 as *const _,
                &beta32 as *const f32 as *const _,
            )
        };
        let compute = if f64_compute {
            cublasComputeType_t::CUBLAS_COMPUTE_64F
        } else {
            cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let blas_h = crate::device::lock(&inner.blas);
        inner.ctx.bind_to_thread().map_err(|e| inner.err(e))?;
        // Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
        // SAFETY: every pointer addresses a live device block large enough for
        // the sizes, leading dimensions and batch strides given; the handle is
        // bound to the device's stream.
        unsafe {
            blas::gemm_strided_batched_ex(
                *blas_h.handle(),
                op(b.trans),
                op(a.trans),
                n as i32,
                m as i32,
                k as i32,
                pa,
                b.ptr as *const _,
                data_type(dt),
                b.ld as i32,
                b.batch as i64,
                a.ptr as *const _,
                data_type(dt),
                a.ld as i32,
                a.batch as i64,
                pb,
                c as *mut _,
                data_type(ct),
                n as i32,
                stride_c as i64,
                batch as i32,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
        }
        .map_err(|e| inner.err(format!("cuBLAS gemm: {e:?}")))
    }
}

impl<E: Float> MatmulKernel<E> for Cuda {
    fn matmul(
        &self,
        a: &CudaStorage<E>,
        la: &Layout,
        b: &CudaStorage<E>,
        lb: &Layout,
    ) -> Result<CudaStorage<E>> {
        let r = la.rank();
        let (m, k, n) = (la.dims[r - 2], la.dims[r - 1], lb.dims[r - 1]);
        let batch: usize = la.dims[..r - 2].iter().product();
        let out = self.alloc::<E>(batch * m * n)?;
        if out.is_empty() {
            return Ok(out);
        }
        if k == 0 {
            self.inner()
                .zero(out.ptr(), batch * m * n * std::mem::size_of::<E>())?;
            return Ok(out);
        }
        let (am, _ka) = self.mat_operand(a, la)?;
        let (bm, _kb) = self.mat_operand(b, lb)?;
        self.gemm(
            E::DTYPE,
            E::DTYPE,
            (m, n, k),
            am,
            bm,
            out.ptr(),
            m * n,
            batch,
            0.0,
        )?;
        Ok(out)
    }
}

/// The family's modules: none, matmul runs on cuBLAS.
pub(crate) fn sources() -> Vec<(String, String)> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cublas_reads_row_and_column_major_views() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(mat_of(&l), Some((4, false, 12)));
        assert_eq!(mat_of(&l.swap(1, 2)), Some((4, true, 12)));
        // A broadcast batch has stride 0.
        let b = Layout::contiguous(&[3, 4]).broadcast_to(&[5, 3, 4]);
        assert_eq!(mat_of(&b), Some((4, false, 0)));
        // Mixed broadcast and real batch dims need a copy.
        let mixed = Layout::contiguous(&[1, 2, 3, 4]).broadcast_to(&[5, 2, 3, 4]);
        assert_eq!(mat_of(&mixed), None);
        // Neither dim unit-stride: a copy.
        assert_eq!(
            mat_of(&Layout::contiguous(&[4, 6]).slice_step(1, 0, 3, 2)),
            None
        );
    }
}
