//! [`UnaryKernel`] for [`Cuda`]: every row of `forma_core`'s unary table
//! through one generic kernel.
//!
//! The CUDA side of the table is [`cuda_unary_table!`]: one row per op type
//! of `forma_core::ops::unary` with its kernel symbol (prefixed `u_` in the
//! source, so `sin` does not clash with the C library), the parameters it
//! passes (`p0`, `p1`, as f64) and its function and derivative in CUDA C (in
//! the accumulation type `A`, of `x`, `y`, `p0`, `p1`). The rows generate the
//! kernel source for every dtype. An op type without a row (a user's own
//! `UnaryOp`) runs on the host through its Rust function, so it still works.

use crate::device::{cfg_1d, Lay};
use crate::kernels::{float_module, tag};
use crate::{Cuda, CudaStorage};
use forma_core::ops::unary::{self as u, UnaryKernel, UnaryOp};
use forma_core::{Backend, DType, Float, Layout, Result};

macro_rules! cuda_unary_table {
    ($( $op:ident => $sym:literal, |$s:ident| [$p0:expr, $p1:expr], $f:literal, $df:literal; )*) => {
        /// `(symbol, f, df)` of every row, for the source.
        const ROWS: &[(&str, &str, &str)] = &[$(($sym, $f, $df),)*];

        /// The kernel symbol and parameters of an op, if it has a row.
        fn lookup<Op: UnaryOp>(op: &Op) -> Option<(&'static str, [f64; 2])> {
            let any = op as &dyn std::any::Any;
            $(
                #[allow(unused_variables)] // parameterless rows ignore the op
                if let Some($s) = any.downcast_ref::<u::$op>() {
                    return Some(($sym, [$p0, $p1]));
                }
            )*
            None
        }
    };
}

// The same functions as `core/src/ops/unary/table.rs`, row for row.
cuda_unary_table! {
    Neg => "neg", |s| [0.0, 0.0], "-x", "-(A)1";
    Exp => "exp", |s| [0.0, 0.0], "m_exp(x)", "y";
    Log => "log", |s| [0.0, 0.0], "m_log(x)", "(A)1 / x";
    Log1p => "log1p", |s| [0.0, 0.0], "m_log1p(x)", "(A)1 / ((A)1 + x)";
    Sqrt => "sqrt", |s| [0.0, 0.0], "m_sqrt(x)", "(A)0.5 / y";
    Rsqrt => "rsqrt", |s| [0.0, 0.0], "(A)1 / m_sqrt(x)", "(A)(-0.5) * y * y * y";
    Recip => "recip", |s| [0.0, 0.0], "(A)1 / x", "-(y * y)";
    Square => "square", |s| [0.0, 0.0], "x * x", "(A)2 * x";
    Abs => "abs", |s| [0.0, 0.0], "m_abs(x)", "x > (A)0 ? (A)1 : (x < (A)0 ? -(A)1 : (A)0)";
    Sin => "sin", |s| [0.0, 0.0], "m_sin(x)", "m_cos(x)";
    Cos => "cos", |s| [0.0, 0.0], "m_cos(x)", "-m_sin(x)";
    Tanh => "tanh", |s| [0.0, 0.0], "m_tanh(x)", "(A)1 - y * y";
    Sigmoid => "sigmoid", |s| [0.0, 0.0], "sigm(x)", "y * ((A)1 - y)";
    Relu => "relu", |s| [0.0, 0.0], "(x > (A)0 || m_isnan(x)) ? x : (A)0", "y > (A)0 ? (A)1 : (A)0";
    Gelu => "gelu", |s| [0.0, 0.0],
        "(A)0.5 * x * ((A)1 + m_erf(x * (A)0.7071067811865476))",
        "(A)0.5 * ((A)1 + m_erf(x * (A)0.7071067811865476)) + x * m_exp((A)(-0.5) * x * x) * (A)0.3989422804014327";
    GeluTanh => "gelu_tanh", |s| [0.0, 0.0], "gelu_tanh_f(x)", "gelu_tanh_df(x)";
    Silu => "silu", |s| [0.0, 0.0], "x * sigm(x)", "silu_df(x)";
    LeakyRelu => "leaky_relu", |s| [s.negative_slope, 0.0],
        "(x > (A)0 || m_isnan(x)) ? x : x * p0", "x > (A)0 ? (A)1 : p0";
    // p1 = exponent - 1, computed in f64 as the CPU does.
    PowScalar => "pow_scalar", |s| [s.exponent, s.exponent - 1.0],
        "m_pow(x, p0)", "p0 == (A)0 ? (A)0 : p0 * m_pow(x, p1)";
    AddScalar => "add_scalar", |s| [s.value, 0.0], "x + p0", "(A)1";
    MulScalar => "mul_scalar", |s| [s.value, 0.0], "x * p0", "p0";
    // p1 = 1 / value, computed in f64 as the CPU does.
    DivScalar => "div_scalar", |s| [s.value, 1.0 / s.value], "x / p0", "p1";
    Clamp => "clamp", |s| [s.min, s.max],
        "m_isnan(x) ? x : fmin(fmax(x, p0), p1)", "(x > p0 && x < p1) ? (A)1 : (A)0";
}

/// The unary module source for dtype `d`: the generic kernels, then one op
/// struct and two entry points per row.
pub(crate) fn source(d: DType) -> String {
    let mut s = String::from(include_str!("unary.cu"));
    for (sym, f, df) in ROWS {
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
        let Some((sym, [p0, p1])) = lookup(&op) else {
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
        let Some((sym, [p0, p1])) = lookup(&op) else {
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
