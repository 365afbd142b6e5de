//! The unary op table: one row per op. A row names the method, the op type,
//! its parameters (if any), its scalar function and its derivative in terms of
//! the input `x` and the output `y`, writing `_` for the one it does not read
//! (the compiler holds a row to it): the backward saves only what it reads.
//! NaN propagates through every row, as in PyTorch.

use super::{CudaRow, UnaryOp};
use crate::dtype::{Float, Real};
use crate::ops::fused::{Expr, Unary};
use crate::shape::Shape;
use crate::tensor::Tensor;

macro_rules! unary_table {
    ($(
        $(#[$doc:meta])*
        $method:ident => $op:ident { $($field:ident),* } : |$x:ident, $s:ident| $body:expr, d|$dx:tt, $dy:tt| $dbody:expr,
            cuda $([$p0:expr, $p1:expr])? $cf:literal, $cdf:literal;
    )*) => {
        /// Every row's CUDA form, in table order: what a CUDA backend
        /// compiles (one kernel pair per row).
        pub const CUDA_ROWS: &[CudaRow] = &[$($op::CUDA,)*];

        /// The unary table's ops as methods of fused expressions
        /// ([`crate::ops::fused::fused`]): `x.gelu()` on an expression is the same op
        /// as on a tensor.
        pub trait UnaryExprs: Expr {$(
            $(#[$doc])*
            #[allow(clippy::wrong_self_convention)] // named like the tensor methods
            fn $method(self $(, $field: f64)*) -> Unary<$op, Self> {
                Unary($op { $($field),* }, self)
            }
        )*}

        impl<X: Expr> UnaryExprs for X {}

        /// Whether the table has a row named `name`.
        pub(crate) fn has_row(name: &str) -> bool {
            matches!(name, $(stringify!($method))|*)
        }

        /// Row `name` with `params` (in the row's field order) handed to `v`
        /// as its op type; `None` when no row has that name and that many
        /// parameters.
        pub(crate) fn visit_row<V: crate::ops::fused::RowVisitor>(
            name: &str,
            params: &[f64],
            v: V,
        ) -> Option<V::Out> {
            match name {
                $(stringify!($method) => {
                    let mut _rest = params.iter().copied();
                    let op = $op { $($field: _rest.next()?),* };
                    _rest.next().is_none().then(|| v.unary(op))
                })*
                _ => None,
            }
        }

        $(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct $op { $(
            #[allow(missing_docs)] // the parameter is documented on the method
            pub $field: f64,
        )* }

        impl UnaryOp for $op {
            const NAME: &'static str = stringify!($method);
            const READS_INPUT: bool = crate::ops::reads!($dx);
            const READS_OUTPUT: bool = crate::ops::reads!($dy);
            #[inline(always)]
            #[allow(unused_variables)] // parameterless rows ignore `self`
            fn f<R: Real>(&self, $x: R) -> R {
                let $s = self;
                $body
            }
            #[inline(always)]
            fn df<R: Real>(&self, $dx: R, $dy: R) -> R {
                // No `allow(unused_variables)` here: a row that names a value
                // it does not read must write `_` (and then saves less).
                let $s = self;
                let _ = &$s; // parameterless rows ignore `self`
                $dbody
            }
            fn cuda(&self) -> Option<(&'static CudaRow, [f64; 2])> {
                let $s = self;
                let _ = &$s; // parameterless rows pass no parameters
                // Parameterless rows pass zeros.
                let params: [f64; 2] = [$([$p0, $p1],)? [0.0, 0.0]][0];
                Some((&Self::CUDA, params))
            }
            fn params(&self) -> Vec<f64> {
                vec![$(self.$field),*]
            }
        }

        impl $op {
            /// The row in CUDA C.
            pub const CUDA: CudaRow = CudaRow { symbol: stringify!($method), f: $cf, df: $cdf };
        }

        impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
            $(#[$doc])*
            pub fn $method(&self $(, $field: f64)*) -> Self {
                self.map_unary($op { $($field),* })
            }
        }
    )*};
}

fn sigmoid<R: Real>(x: R) -> R {
    R::one() / (R::one() + (-x).exp())
}

unary_table! {
    /// `-x`.
    neg => Neg {} : |x, s| -x, d|_, _| -R::one(),
        cuda "-x", "-(A)1";
    /// `e^x`.
    exp => Exp {} : |x, s| x.exp(), d|_, y| y,
        cuda "m_exp(x)", "y";
    /// Natural logarithm (`-inf` at 0, NaN below).
    log => Log {} : |x, s| x.ln(), d|x, _| x.recip(),
        cuda "m_log(x)", "(A)1 / x";
    /// `ln(1 + x)`, accurate near 0.
    log1p => Log1p {} : |x, s| x.ln_1p(), d|x, _| (R::one() + x).recip(),
        cuda "m_log1p(x)", "(A)1 / ((A)1 + x)";
    /// Square root.
    sqrt => Sqrt {} : |x, s| x.sqrt(), d|_, y| R::c(0.5) / y,
        cuda "m_sqrt(x)", "(A)0.5 / y";
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt {} : |x, s| x.sqrt().recip(), d|_, y| R::c(-0.5) * y * y * y,
        cuda "(A)1 / m_sqrt(x)", "(A)(-0.5) * y * y * y";
    /// `1 / x`.
    recip => Recip {} : |x, s| x.recip(), d|_, y| -(y * y),
        cuda "(A)1 / x", "-(y * y)";
    /// `x * x`.
    square => Square {} : |x, s| x * x, d|x, _| R::c(2.0) * x,
        cuda "x * x", "(A)2 * x";
    /// `|x|`.
    abs => Abs {} : |x, s| x.abs(), d|x, _| if x > R::zero() { R::one() } else if x < R::zero() { -R::one() } else { R::zero() },
        cuda "m_abs(x)", "x > (A)0 ? (A)1 : (x < (A)0 ? -(A)1 : (A)0)";
    /// Sine.
    sin => Sin {} : |x, s| x.sin(), d|x, _| x.cos(),
        cuda "m_sin(x)", "m_cos(x)";
    /// Cosine.
    cos => Cos {} : |x, s| x.cos(), d|x, _| -x.sin(),
        cuda "m_cos(x)", "-m_sin(x)";
    /// Hyperbolic tangent.
    tanh => Tanh {} : |x, s| x.tanh(), d|_, y| R::one() - y * y,
        cuda "m_tanh(x)", "(A)1 - y * y";
    /// Logistic sigmoid `1 / (1 + e^-x)`.
    sigmoid => Sigmoid {} : |x, s| sigmoid(x), d|_, y| y * (R::one() - y),
        cuda "sigm(x)", "y * ((A)1 - y)";
    /// `max(x, 0)`.
    relu => Relu {} : |x, s| if x > R::zero() || x.is_nan() { x } else { R::zero() }, d|_, y| if y > R::zero() { R::one() } else { R::zero() },
        cuda "(x > (A)0 || m_isnan(x)) ? x : (A)0", "y > (A)0 ? (A)1 : (A)0";
    /// GELU with the exact `erf` form, like `F.gelu(x)`.
    // `1 + erf` needs erf's absolute error only: `erf_abs` is cheaper.
    gelu => Gelu {} : |x, s| R::c(0.5) * x * (R::one() + (x * R::c(std::f64::consts::FRAC_1_SQRT_2)).erf_abs()), d|x, _| R::c(0.5) * (R::one() + (x * R::c(std::f64::consts::FRAC_1_SQRT_2)).erf_abs()) + x * (R::c(-0.5) * x * x).exp_fast() * R::c(0.398_942_280_401_432_7),
        cuda "(A)0.5 * x * ((A)1 + m_erf(x * (A)0.7071067811865476))",
        "(A)0.5 * ((A)1 + m_erf(x * (A)0.7071067811865476)) + x * m_exp((A)(-0.5) * x * x) * (A)0.3989422804014327";
    /// GELU with the tanh approximation, like `F.gelu(x, approximate="tanh")`.
    gelu_tanh => GeluTanh {} : |x, s| {
        let k = R::c((2.0 / std::f64::consts::PI).sqrt());
        R::c(0.5) * x * (R::one() + (k * (x + R::c(0.044715) * x * x * x)).tanh())
    }, d|x, _| { let k = R::c((2.0 / std::f64::consts::PI).sqrt()); let c = R::c(0.044715); let t = (k * (x + c * x * x * x)).tanh(); R::c(0.5) * (R::one() + t) + R::c(0.5) * x * (R::one() - t * t) * k * (R::one() + R::c(3.0) * c * x * x) },
        cuda "gelu_tanh_f(x)", "gelu_tanh_df(x)";
    /// SiLU (swish) `x * sigmoid(x)`.
    silu => Silu {} : |x, s| x * sigmoid(x), d|x, _| { let sg = sigmoid(x); sg * (R::one() + x * (R::one() - sg)) },
        cuda "x * sigm(x)", "silu_df(x)";
    /// Hard swish `x * relu6(x + 3) / 6`, like `F.hardswish(x)`; the
    /// derivative at the kinks is PyTorch's (0 at -3, 1 at 3).
    hardswish => Hardswish {} : |x, s| if x.is_nan() { x } else { x * (x + R::c(3.0)).max(R::zero()).min(R::c(6.0)) / R::c(6.0) }, d|x, _| if x <= R::c(-3.0) { R::zero() } else if x < R::c(3.0) { x / R::c(3.0) + R::c(0.5) } else { R::one() },
        cuda "m_isnan(x) ? x : x * fmin(fmax(x + (A)3, (A)0), (A)6) / (A)6", "x <= (A)(-3) ? (A)0 : (x < (A)3 ? x / (A)3 + (A)0.5 : (A)1)";
    /// Leaky ReLU with `negative_slope` (PyTorch's default is 0.01).
    leaky_relu => LeakyRelu { negative_slope } : |x, s| if x > R::zero() || x.is_nan() { x } else { x * R::c(s.negative_slope) }, d|x, _| if x > R::zero() { R::one() } else { R::c(s.negative_slope) },
        cuda [s.negative_slope, 0.0] "(x > (A)0 || m_isnan(x)) ? x : x * p0", "x > (A)0 ? (A)1 : p0";
    /// `x ^ exponent` for a scalar exponent, like `x.pow(2.5)`.
    pow_scalar => PowScalar { exponent } : |x, s| x.powf(R::c(s.exponent)), d|x, _| if s.exponent == 0.0 { R::zero() } else { R::c(s.exponent) * x.powf(R::c(s.exponent - 1.0)) },
        cuda [s.exponent, s.exponent - 1.0] "m_pow(x, p0)", "p0 == (A)0 ? (A)0 : p0 * m_pow(x, p1)";
    /// `x + value`.
    add_scalar => AddScalar { value } : |x, s| x + R::c(s.value), d|_, _| R::one(),
        cuda [s.value, 0.0] "x + p0", "(A)1";
    /// `x * value`.
    mul_scalar => MulScalar { value } : |x, s| x * R::c(s.value), d|_, _| R::c(s.value),
        cuda [s.value, 0.0] "x * p0", "p0";
    /// `x / value` (a true division, as PyTorch does it, not a multiply by the reciprocal).
    div_scalar => DivScalar { value } : |x, s| x / R::c(s.value), d|_, _| R::c(1.0 / s.value),
        cuda [s.value, 1.0 / s.value] "x / p0", "p1";
    /// Clamps into `[min, max]`, like `x.clamp(min, max)`; NaN stays NaN.
    clamp => Clamp { min, max } : |x, s| {
        if x.is_nan() { x } else { x.max(R::c(s.min)).min(R::c(s.max)) }
    }, d|x, _| if x > R::c(s.min) && x < R::c(s.max) { R::one() } else { R::zero() },
        cuda [s.min, s.max] "m_isnan(x) ? x : fmin(fmax(x, p0), p1)", "(x > p0 && x < p1) ? (A)1 : (A)0";
    /// Clamps from below, like `x.clamp_min(min)` (`x.clamp(min=min)`);
    /// NaN stays NaN. The gradient passes where `x > min`, as PyTorch's.
    clamp_min => ClampMin { min } : |x, s| if x.is_nan() || x >= R::c(s.min) { x } else { R::c(s.min) }, d|x, _| if x > R::c(s.min) { R::one() } else { R::zero() },
        cuda [s.min, 0.0] "(m_isnan(x) || x >= p0) ? x : p0", "x > p0 ? (A)1 : (A)0";
    /// Clamps from above, like `x.clamp_max(max)` (`x.clamp(max=max)`);
    /// NaN stays NaN. The gradient passes where `x < max`, as PyTorch's.
    clamp_max => ClampMax { max } : |x, s| if x.is_nan() || x <= R::c(s.max) { x } else { R::c(s.max) }, d|x, _| if x < R::c(s.max) { R::one() } else { R::zero() },
        cuda [s.max, 0.0] "(m_isnan(x) || x <= p0) ? x : p0", "x < p0 ? (A)1 : (A)0";
}
