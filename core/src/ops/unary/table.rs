//! The unary op table: one row per op. A row names the method, the op type,
//! its parameters (if any) and its scalar function. NaN propagates through
//! every row, as in PyTorch.

use super::UnaryOp;
use crate::dtype::{Float, Real};
use crate::shape::Shape;
use crate::tensor::Tensor;

macro_rules! unary_table {
    ($(
        $(#[$doc:meta])*
        $method:ident => $op:ident { $($field:ident),* } : |$x:ident, $s:ident| $body:expr;
    )*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct $op { $(
            #[allow(missing_docs)] // the parameter is documented on the method
            pub $field: f64,
        )* }

        impl UnaryOp for $op {
            const NAME: &'static str = stringify!($method);
            #[inline(always)]
            #[allow(unused_variables)] // parameterless rows ignore `self`
            fn f<R: Real>(&self, $x: R) -> R {
                let $s = self;
                $body
            }
        }

        impl<S: Shape, E: Float, D: super::UnaryKernel<E>> Tensor<S, E, D> {
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
    neg => Neg {} : |x, s| -x;
    /// `e^x`.
    exp => Exp {} : |x, s| x.exp();
    /// Natural logarithm (`-inf` at 0, NaN below).
    log => Log {} : |x, s| x.ln();
    /// `ln(1 + x)`, accurate near 0.
    log1p => Log1p {} : |x, s| x.ln_1p();
    /// Square root.
    sqrt => Sqrt {} : |x, s| x.sqrt();
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt {} : |x, s| x.sqrt().recip();
    /// `1 / x`.
    recip => Recip {} : |x, s| x.recip();
    /// `x * x`.
    square => Square {} : |x, s| x * x;
    /// `|x|`.
    abs => Abs {} : |x, s| x.abs();
    /// Sine.
    sin => Sin {} : |x, s| x.sin();
    /// Cosine.
    cos => Cos {} : |x, s| x.cos();
    /// Hyperbolic tangent.
    tanh => Tanh {} : |x, s| x.tanh();
    /// Logistic sigmoid `1 / (1 + e^-x)`.
    sigmoid => Sigmoid {} : |x, s| sigmoid(x);
    /// `max(x, 0)`.
    relu => Relu {} : |x, s| if x > R::zero() || x.is_nan() { x } else { R::zero() };
    /// GELU with the exact `erf` form, like `F.gelu(x)`.
    gelu => Gelu {} : |x, s| R::c(0.5) * x * (R::one() + (x * R::c(std::f64::consts::FRAC_1_SQRT_2)).erf());
    /// GELU with the tanh approximation, like `F.gelu(x, approximate="tanh")`.
    gelu_tanh => GeluTanh {} : |x, s| {
        let k = R::c((2.0 / std::f64::consts::PI).sqrt());
        R::c(0.5) * x * (R::one() + (k * (x + R::c(0.044715) * x * x * x)).tanh())
    };
    /// SiLU (swish) `x * sigmoid(x)`.
    silu => Silu {} : |x, s| x * sigmoid(x);
    /// Leaky ReLU with `negative_slope` (PyTorch's default is 0.01).
    leaky_relu => LeakyRelu { negative_slope } : |x, s| if x > R::zero() || x.is_nan() { x } else { x * R::c(s.negative_slope) };
    /// `x ^ exponent` for a scalar exponent, like `x.pow(2.5)`.
    pow_scalar => PowScalar { exponent } : |x, s| x.powf(R::c(s.exponent));
    /// `x + value`.
    add_scalar => AddScalar { value } : |x, s| x + R::c(s.value);
    /// `x * value`.
    mul_scalar => MulScalar { value } : |x, s| x * R::c(s.value);
    /// `x / value` (a true division, as PyTorch does it, not a multiply by the reciprocal).
    div_scalar => DivScalar { value } : |x, s| x / R::c(s.value);
    /// Clamps into `[min, max]`, like `x.clamp(min, max)`; NaN stays NaN.
    clamp => Clamp { min, max } : |x, s| {
        if x.is_nan() { x } else { x.max(R::c(s.min)).min(R::c(s.max)) }
    };
}
