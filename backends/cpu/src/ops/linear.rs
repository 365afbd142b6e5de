//! [`LinearKernel`] for [`Cpu`]: the product with the bias added to each
//! finished sum (in Forma's sgemm, the microkernel adds it as it stores a
//! tile), for the dtypes that are their own accumulation type (f32, f64).
//! f16 and bf16 compose, so their product is rounded before the bias is
//! added, as it is unfused.

use super::matmul::{dense_acc, from_acc_vec, gemm_uninit, same_ref, solo_parallelism, Operand};
use crate::Cpu;
use forma_core::error::fmt_dims;
use forma_core::ops::linear::LinearKernel;
use forma_core::{Error, Float, Layout, Result};

impl<E: Float> LinearKernel<E> for Cpu {
    fn linear(
        &self,
        (x, lx): (&Vec<E>, &Layout),
        (w, lw): (&Vec<E>, &Layout),
        (b, lb): (&Vec<E>, &Layout),
    ) -> Result<Option<Vec<E>>> {
        let (Some(xa), Some(wa)) = (same_ref::<E, E::Acc>(x), same_ref::<E, E::Acc>(w)) else {
            return Ok(None);
        };
        if lx.rank() != 2
            || lw.rank() != 2
            || lb.dims[..] != [lw.dims[0]]
            || lx.dims[1] != lw.dims[1]
        {
            return Err(Error::invalid(
                "linear",
                format!(
                    "operands {}, {} and {} are not [m, k], [n, k] and [n]",
                    fmt_dims(&lx.dims),
                    fmt_dims(&lw.dims),
                    fmt_dims(&lb.dims)
                ),
            ));
        }
        let (m, k, n) = (lx.dims[0], lx.dims[1], lw.dims[0]);
        let bias = dense_acc(b, lb);
        let lhs = Operand {
            data: xa.as_slice(),
            off: lx.offset,
            rs: lx.strides[0],
            cs: lx.strides[1],
        };
        // `w^T`, `[k, n]`.
        let rhs = Operand {
            data: wa.as_slice(),
            off: lw.offset,
            rs: lw.strides[1],
            cs: lw.strides[0],
        };
        let len = m * n;
        let mut out = Vec::with_capacity(len);
        gemm_uninit(
            &mut out.spare_capacity_mut()[..len],
            m,
            n,
            k,
            lhs,
            rhs,
            Some(&bias),
            solo_parallelism(),
        );
        // SAFETY: the product wrote all `len` elements.
        unsafe { out.set_len(len) };
        Ok(Some(from_acc_vec::<E>(out)))
    }
}
