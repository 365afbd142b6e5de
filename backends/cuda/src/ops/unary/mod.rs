//! [`UnaryKernel`] for [`Cuda`]: every row of `forma_core`'s unary table
//! through one generic kernel.
//!
//! The CUDA form of each row lives beside its Rust form in core's table
//! ([`u::CUDA_ROWS`]: the kernel symbol, prefixed `u_` in the source so that
//! `sin` does not clash with the C library, and the function and derivative
//! in CUDA C of `x`, `y`, `p0`, `p1` in the accumulation type `A`); the
//! source below is generated from that list for every dtype, and an op finds
//! its kernel through [`UnaryOp::cuda`]. An op type from outside the table
//! (a user's own `UnaryOp`) has no CUDA form and runs on the host through
//! its Rust function, so it still works.

use crate::device::{cfg_1d, Lay};
use crate::kernels::{float_module, tag};
use crate::{Cuda, CudaStorage};
use forma_core::ops::unary::{self as u, UnaryKernel, UnaryOp};
use forma_core::{Backend, DType, Float, Layout, Result};

/// The unary module source for dtype `d`: the generic kernels, then one op
/// struct and two entry points per row.
pub(crate) fn source(d: DType) -> String {
    let mut s = String::from(include_str!("unary.cu"));
    for u::CudaRow { symbol: sym, f, df } in u::CUDA_ROWS {
        s.push_str(&format!(
            "struct Op_{sym} {{\n\
             __device__ __forceinline__ A f(A x, A p0, A p1) const {{ return {f}; }}\n\
             __device__ __forceinline__ A df(A x, A y, A p0, A p1) const {{ return {df}; }}\n\
             }};\n\
             extern \"C\" __global__ void u_{sym}(const T* x, Lay lx, T* out, i64 n, double p0, double p1) {{\n\
             unary_fwd<Op_{sym}>(x, lx, out, n, (A)p0, (A)p1);\n}}\n\
             extern \"C\" __global__ void u_{sym}_bwd(const T* x, Lay lx, const T* y, Lay ly, const T* g, Lay lg, T* out, i64 n, double p0, double p1) {{\n\
             unary_bwd<Op_{sym}>(x, lx, y, ly, g, lg, out, n, (A)p0, (A)p1);\n}}\n"
        ));
    }
    float_module(d, &s)
}

impl<E: Float> UnaryKernel<E> for Cuda {
    fn unary<Op: UnaryOp>(
        &self,
        op: Op,
        x: &CudaStorage<E>,
        layout: &Layout,
    ) -> Result<CudaStorage<E>> {
        let Some((u::CudaRow { symbol: sym, .. }, [p0, p1])) = op.cuda() else {
            let v: Vec<E> = self.to_vec(x, layout)?;
            return self.upload(
                v.into_iter()
                    .map(|v| E::from_acc(op.f(v.to_acc())))
                    .collect(),
            );
        };
        let n = layout.numel();
        let out = self.alloc::<E>(n)?;
        if n == 0 {
            return Ok(out);
        }
        let key = format!("unary/{}", tag(E::DTYPE));
        let f = self
            .inner()
            .function(&key, || source(E::DTYPE), &format!("u_{sym}"))?;
        let (xp, l, op_, nn) = (x.ptr(), Lay::new(layout), out.ptr(), n as i64);
        launch!(self, f, cfg_1d(n), xp, l, op_, nn, p0, p1)?;
        Ok(out)
    }

    fn unary_backward<Op: UnaryOp>(
        &self,
        op: Op,
        x: &CudaStorage<E>,
        lx: &Layout,
        y: &CudaStorage<E>,
        ly: &Layout,
        g: &CudaStorage<E>,
        lg: &Layout,
    ) -> Result<CudaStorage<E>> {
        let Some((u::CudaRow { symbol: sym, .. }, [p0, p1])) = op.cuda() else {
            let (xv, yv, gv) = (
                self.to_vec(x, lx)?,
                self.to_vec(y, ly)?,
                self.to_vec(g, lg)?,
            );
            let out = xv
                .iter()
                .zip(&yv)
                .zip(&gv)
                .map(|((x, y), g)| E::from_acc(g.to_acc() * op.df(x.to_acc(), y.to_acc())))
                .collect();
            return self.upload(out);
        };
        let n = lx.numel();
        let out = self.alloc::<E>(n)?;
        if n == 0 {
            return Ok(out);
        }
        let key = format!("unary/{}", tag(E::DTYPE));
        let f = self
            .inner()
            .function(&key, || source(E::DTYPE), &format!("u_{sym}_bwd"))?;
        let (xp, l1, yp, l2, gp, l3) = (
            x.ptr(),
            Lay::new(lx),
            y.ptr(),
            Lay::new(ly),
            g.ptr(),
            Lay::new(lg),
        );
        let (op_, nn) = (out.ptr(), n as i64);
        launch!(self, f, cfg_1d(n), xp, l1, yp, l2, gp, l3, op_, nn, p0, p1)?;
        Ok(out)
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
        for row in u::CUDA_ROWS {
            assert!(!row.f.is_empty() && !row.df.is_empty(), "{}", row.symbol);
            let sym = row.symbol;
            assert!(src.contains(&format!("void u_{sym}(")), "{sym}");
            assert!(src.contains(&format!("void u_{sym}_bwd(")), "{sym}");
        }
        let ops: [(&str, Option<(&u::CudaRow, [f64; 2])>); 4] = [
            ("neg", u::Neg {}.cuda()),
            ("gelu_tanh", u::GeluTanh {}.cuda()),
            ("clamp", u::Clamp { min: -1.0, max: 2.0 }.cuda()),
            ("div_scalar", u::DivScalar { value: 4.0 }.cuda()),
        ];
        for (name, found) in ops {
            let (row, _) = found.unwrap_or_else(|| panic!("{name} has no CUDA form"));
            assert_eq!(row.symbol, name);
        }
        assert_eq!(u::Clamp { min: -1.0, max: 2.0 }.cuda().unwrap().1, [-1.0, 2.0]);
        assert_eq!(u::DivScalar { value: 4.0 }.cuda().unwrap().1, [4.0, 0.25]);
    }
}
