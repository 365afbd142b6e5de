//! [`BinaryKernel`] for [`Cuda`]: every row of `forma_core`'s binary table
//! through one generic kernel, with broadcasting by stride-0 views.
//!
//! The CUDA form of each row (kernel symbol, function of `a`, `b` and its
//! two partial derivatives in CUDA C) lives beside its Rust form in core's
//! table ([`b::CUDA_ROWS`]); the source is generated from that list and an
//! op finds its kernel through [`BinaryOp::cuda`]. An op type from outside
//! the table runs on the host.

use crate::device::{cfg_1d, Lay};
use crate::kernels::{float_module, tag};
use crate::{Cuda, CudaStorage};
use forma_core::ops::binary::{self as b, BinaryKernel, BinaryOp};
use forma_core::{Backend, DType, Float, Layout, Result};

/// The binary module source for dtype `d`.
pub(crate) fn source(d: DType) -> String {
    let mut s = String::from(include_str!("binary.cu"));
    for b::CudaRow { symbol: sym, f, da, db } in b::CUDA_ROWS {
        s.push_str(&format!(
            "struct Op_{sym} {{\n\
             __device__ __forceinline__ A f(A a, A b) const {{ return {f}; }}\n\
             __device__ __forceinline__ A da(A a, A b) const {{ return {da}; }}\n\
             __device__ __forceinline__ A db(A a, A b) const {{ return {db}; }}\n\
             }};\n\
             extern \"C\" __global__ void b_{sym}(const T* a, Lay la, const T* b, Lay lb, T* out, i64 n) {{\n\
             binary_fwd<Op_{sym}>(a, la, b, lb, out, n);\n}}\n\
             extern \"C\" __global__ void b_{sym}_bwd(const T* a, Lay la, const T* b, Lay lb, const T* g, Lay lg, T* ga, T* gb, i64 n) {{\n\
             binary_bwd<Op_{sym}>(a, la, b, lb, g, lg, ga, gb, n);\n}}\n"
        ));
    }
    float_module(d, &s)
}

impl<E: Float> BinaryKernel<E> for Cuda {
    fn binary<Op: BinaryOp>(
        &self,
        op: Op,
        a: &CudaStorage<E>,
        la: &Layout,
        b: &CudaStorage<E>,
        lb: &Layout,
    ) -> Result<CudaStorage<E>> {
        let Some(b::CudaRow { symbol: sym, .. }) = op.cuda() else {
            let (av, bv) = (self.to_vec(a, la)?, self.to_vec(b, lb)?);
            let out = av
                .iter()
                .zip(&bv)
                .map(|(x, y)| E::from_acc(op.f(x.to_acc(), y.to_acc())))
                .collect();
            return self.upload(out);
        };
        let n = la.numel();
        let out = self.alloc::<E>(n)?;
        if n == 0 {
            return Ok(out);
        }
        let key = format!("binary/{}", tag(E::DTYPE));
        let f = self
            .inner()
            .function(&key, || source(E::DTYPE), &format!("b_{sym}"))?;
        let (ap, l1, bp, l2, op_, nn) = (
            a.ptr(),
            Lay::new(la),
            b.ptr(),
            Lay::new(lb),
            out.ptr(),
            n as i64,
        );
        launch!(self, f, cfg_1d(n), ap, l1, bp, l2, op_, nn)?;
        Ok(out)
    }

    fn binary_backward<Op: BinaryOp>(
        &self,
        op: Op,
        a: &CudaStorage<E>,
        la: &Layout,
        b: &CudaStorage<E>,
        lb: &Layout,
        g: &CudaStorage<E>,
        lg: &Layout,
    ) -> Result<(CudaStorage<E>, CudaStorage<E>)> {
        let Some(b::CudaRow { symbol: sym, .. }) = op.cuda() else {
            let (av, bv, gv) = (
                self.to_vec(a, la)?,
                self.to_vec(b, lb)?,
                self.to_vec(g, lg)?,
            );
            let (mut ga, mut gb) = (Vec::with_capacity(gv.len()), Vec::with_capacity(gv.len()));
            for ((x, y), g) in av.iter().zip(&bv).zip(&gv) {
                let (dx, dy) = op.df(x.to_acc(), y.to_acc());
                ga.push(E::from_acc(g.to_acc() * dx));
                gb.push(E::from_acc(g.to_acc() * dy));
            }
            return Ok((self.upload(ga)?, self.upload(gb)?));
        };
        let n = lg.numel();
        let (ga, gb) = (self.alloc::<E>(n)?, self.alloc::<E>(n)?);
        if n == 0 {
            return Ok((ga, gb));
        }
        let key = format!("binary/{}", tag(E::DTYPE));
        let f = self
            .inner()
            .function(&key, || source(E::DTYPE), &format!("b_{sym}_bwd"))?;
        let (ap, l1, bp, l2, gp, l3) = (
            a.ptr(),
            Lay::new(la),
            b.ptr(),
            Lay::new(lb),
            g.ptr(),
            Lay::new(lg),
        );
        let (p1, p2, nn) = (ga.ptr(), gb.ptr(), n as i64);
        launch!(self, f, cfg_1d(n), ap, l1, bp, l2, gp, l3, p1, p2, nn)?;
        Ok((ga, gb))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row of core's table has its kernel pair in the source, and
    /// every table op finds its row (none silently runs on the host).
    #[test]
    fn every_table_row_has_a_cuda_kernel() {
        let src = source(DType::F32);
        for row in b::CUDA_ROWS {
            let sym = row.symbol;
            assert!(src.contains(&format!("void b_{sym}(")), "{sym}");
            assert!(src.contains(&format!("void b_{sym}_bwd(")), "{sym}");
        }
        assert_eq!(b::Add.cuda().map(|r| r.symbol), Some("add"));
        assert_eq!(b::Minimum.cuda().map(|r| r.symbol), Some("minimum"));
        assert_eq!(b::Fmin.cuda().map(|r| r.symbol), Some("fmin"));
        assert_eq!(b::CUDA_ROWS.len(), 9);
    }
}
