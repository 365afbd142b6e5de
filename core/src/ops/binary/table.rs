//! The binary op table: one row per op, each with a method, a `try_` method
//! and (for the four arithmetic ops) the `std::ops` operator.

use super::{BinaryOp, CudaRow};
use crate::dtype::{Float, Real};
use crate::error::Result;
use crate::ops::fused::{Binary, Expr};
use crate::ops::unary::Neg;
use crate::shape::op::SameDtype;
use crate::shape::{op, BroadcastShape, Broadcasts, Shape};
use crate::tensor::{ok, Tensor};

macro_rules! binary_table {
    ($(
        $(#[$doc:meta])*
        $method:ident, $try_method:ident => $op:ident : |$a:ident, $b:ident| $body:expr, d|$da:tt, $db:tt| $dbody:expr,
            cuda $cf:literal, $cda:literal, $cdb:literal;
    )*) => {
        /// Every row's CUDA form, in table order: what a CUDA backend
        /// compiles (one kernel pair per row).
        pub const CUDA_ROWS: &[CudaRow] = &[$($op::CUDA,)*];

        /// The binary table's ops as methods of fused expressions
        /// ([`crate::ops::fused::fused`]): `a.maximum(b)` on expressions is the same op
        /// as on tensors (`+ - * /` are also operators).
        pub trait BinaryExprs: Expr {$(
            $(#[$doc])*
            fn $method<B: Expr>(self, rhs: B) -> Binary<$op, Self, B> {
                Binary($op, self, rhs)
            }
        )*}

        impl<X: Expr> BinaryExprs for X {}

        /// Row `name` applied to `a` and `b` (how a replayed graph runs a
        /// binary node); `None` when no row has that name.
        pub(crate) fn zip_row<S: Shape, S2: Shape, E: Float, D: crate::device::Device<E>>(
            a: &Tensor<S, E, D>,
            b: &Tensor<S2, E, D>,
            name: &str,
        ) -> Option<Result<Tensor<<S as BroadcastShape<S2>>::Output, E, D>>>
        where
            S: BroadcastShape<S2>,
        {
            match name {
                $(stringify!($method) => Some(a.try_zip($op, b)),)*
                _ => None,
            }
        }

        /// Row `name` handed to `v` as its op type; `None` when no row has
        /// that name.
        pub(crate) fn visit_row<V: crate::ops::fused::RowVisitor>(name: &str, v: V) -> Option<V::Out> {
            match name {
                $(stringify!($method) => Some(v.binary($op)),)*
                _ => None,
            }
        }

        $(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        pub struct $op;

        impl BinaryOp for $op {
            const NAME: &'static str = stringify!($method);
            #[inline(always)]
            fn f<R: Real>(&self, $a: R, $b: R) -> R {
                $body
            }
            const READS_LHS: bool = crate::ops::reads!($da);
            const READS_RHS: bool = crate::ops::reads!($db);
            #[inline(always)]
            fn df<R: Real>(&self, $da: R, $db: R) -> (R, R) {
                $dbody
            }
            fn cuda(&self) -> Option<&'static CudaRow> {
                Some(&Self::CUDA)
            }
        }

        impl $op {
            /// The row in CUDA C.
            pub const CUDA: CudaRow = CudaRow { symbol: stringify!($method), f: $cf, da: $cda, db: $cdb };
        }

        impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
            $(#[$doc])*
            ///
            /// # Panics
            /// If `Dyn` sizes do not broadcast at run time (see the `try_` form).
            #[track_caller]
            pub fn $method<S2: Shape>(&self, rhs: &Tensor<S2, E, D>) -> Tensor<<S as BroadcastShape<S2>>::Output, E, D>
            where
                S: Broadcasts<S2, op::$method>,
            {
                ok(self.try_zip($op, rhs))
            }

            $(#[$doc])*
            ///
            /// # Errors
            /// A [`crate::ShapeError`] when `Dyn` sizes do not broadcast.
            pub fn $try_method<S2: Shape>(&self, rhs: &Tensor<S2, E, D>) -> Result<Tensor<<S as BroadcastShape<S2>>::Output, E, D>>
            where
                S: Broadcasts<S2, op::$method>,
            {
                self.try_zip($op, rhs)
            }
        }
    )*};
}

binary_table! {
    /// Elementwise `a + b` with broadcasting.
    add, try_add => Add : |a, b| a + b, d|_, _| (R::one(), R::one()),
        cuda "a + b", "(A)1", "(A)1";
    /// Elementwise `a - b` with broadcasting.
    sub, try_sub => Sub : |a, b| a - b, d|_, _| (R::one(), -R::one()),
        cuda "a - b", "(A)1", "-(A)1";
    /// Elementwise `a * b` with broadcasting.
    mul, try_mul => Mul : |a, b| a * b, d|a, b| (b, a),
        cuda "a * b", "b", "a";
    /// Elementwise `a / b` with broadcasting.
    div, try_div => Div : |a, b| a / b, d|a, b| (b.recip(), -a / (b * b)),
        cuda "a / b", "(A)1 / b", "-a / (b * b)";
    /// Elementwise `a ^ b` with broadcasting, like `torch.pow`.
    pow, try_pow => Pow : |a, b| a.powf(b), d|a, b| (if b == R::zero() { R::zero() } else { b * a.powf(b - R::one()) }, if a == R::zero() && b >= R::zero() { R::zero() } else { a.powf(b) * a.ln() }),
        cuda "m_pow(a, b)",
        "b == (A)0 ? (A)0 : b * m_pow(a, b - (A)1)",
        "(a == (A)0 && b >= (A)0) ? (A)0 : m_pow(a, b) * m_log(a)";
    /// Elementwise maximum with broadcasting; NaN wins, like `torch.maximum`.
    maximum, try_maximum => Maximum : |a, b| if a.is_nan() || b.is_nan() { R::nan() } else if a > b { a } else { b }, d|a, b| if a > b { (R::one(), R::zero()) } else if a < b { (R::zero(), R::one()) } else { (R::c(0.5), R::c(0.5)) },
        cuda "(m_isnan(a) || m_isnan(b)) ? m_nan<A>() : (a > b ? a : b)",
        "a > b ? (A)1 : (a < b ? (A)0 : (A)0.5)", "a > b ? (A)0 : (a < b ? (A)1 : (A)0.5)";
    /// Elementwise minimum with broadcasting; NaN wins, like `torch.minimum`.
    minimum, try_minimum => Minimum : |a, b| if a.is_nan() || b.is_nan() { R::nan() } else if a < b { a } else { b }, d|a, b| if a < b { (R::one(), R::zero()) } else if a > b { (R::zero(), R::one()) } else { (R::c(0.5), R::c(0.5)) },
        cuda "(m_isnan(a) || m_isnan(b)) ? m_nan<A>() : (a < b ? a : b)",
        "a < b ? (A)1 : (a > b ? (A)0 : (A)0.5)", "a < b ? (A)0 : (a > b ? (A)1 : (A)0.5)";
    /// Elementwise maximum that ignores NaN (the other operand wins; NaN
    /// only when both are), like `torch.fmax`. The gradient goes to the
    /// operand that is not NaN (to `a` when both are) and is split at a tie,
    /// as PyTorch's.
    fmax, try_fmax => Fmax : |a, b| if b.is_nan() || a >= b { a } else { b }, d|a, b| if b.is_nan() || a > b { (R::one(), R::zero()) } else if a.is_nan() || a < b { (R::zero(), R::one()) } else { (R::c(0.5), R::c(0.5)) },
        cuda "(m_isnan(b) || a >= b) ? a : b",
        "(m_isnan(b) || a > b) ? (A)1 : ((m_isnan(a) || a < b) ? (A)0 : (A)0.5)",
        "(m_isnan(b) || a > b) ? (A)0 : ((m_isnan(a) || a < b) ? (A)1 : (A)0.5)";
    /// Elementwise minimum that ignores NaN (the other operand wins; NaN
    /// only when both are), like `torch.fmin`. Its gradient is routed as
    /// [`Tensor::fmax`]'s.
    fmin, try_fmin => Fmin : |a, b| if b.is_nan() || a <= b { a } else { b }, d|a, b| if b.is_nan() || a < b { (R::one(), R::zero()) } else if a.is_nan() || a > b { (R::zero(), R::one()) } else { (R::c(0.5), R::c(0.5)) },
        cuda "(m_isnan(b) || a <= b) ? a : b",
        "(m_isnan(b) || a < b) ? (A)1 : ((m_isnan(a) || a > b) ? (A)0 : (A)0.5)",
        "(m_isnan(b) || a < b) ? (A)0 : ((m_isnan(a) || a > b) ? (A)1 : (A)0.5)";
}

macro_rules! std_op {
    ($tr:ident, $f:ident, $op:ident) => {
        impl<
                S: Shape,
                S2: Shape,
                E: Float,
                E2: SameDtype<E, op::$f>,
                D: crate::device::Device<E>,
            > std::ops::$tr<&Tensor<S2, E2, D>> for &Tensor<S, E, D>
        where
            S: Broadcasts<S2, op::$f>,
        {
            type Output = Tensor<<S as BroadcastShape<S2>>::Output, E, D>;
            #[track_caller]
            fn $f(self, rhs: &Tensor<S2, E2, D>) -> Self::Output {
                ok(self.try_zip($op, E2::same(rhs)))
            }
        }
        impl<
                S: Shape,
                S2: Shape,
                E: Float,
                E2: SameDtype<E, op::$f>,
                D: crate::device::Device<E>,
            > std::ops::$tr<Tensor<S2, E2, D>> for Tensor<S, E, D>
        where
            S: Broadcasts<S2, op::$f>,
        {
            type Output = Tensor<<S as BroadcastShape<S2>>::Output, E, D>;
            #[track_caller]
            fn $f(self, rhs: Tensor<S2, E2, D>) -> Self::Output {
                ok(self.try_zip($op, E2::same(&rhs)))
            }
        }
        impl<
                S: Shape,
                S2: Shape,
                E: Float,
                E2: SameDtype<E, op::$f>,
                D: crate::device::Device<E>,
            > std::ops::$tr<&Tensor<S2, E2, D>> for Tensor<S, E, D>
        where
            S: Broadcasts<S2, op::$f>,
        {
            type Output = Tensor<<S as BroadcastShape<S2>>::Output, E, D>;
            #[track_caller]
            fn $f(self, rhs: &Tensor<S2, E2, D>) -> Self::Output {
                ok(self.try_zip($op, E2::same(rhs)))
            }
        }
        impl<
                S: Shape,
                S2: Shape,
                E: Float,
                E2: SameDtype<E, op::$f>,
                D: crate::device::Device<E>,
            > std::ops::$tr<Tensor<S2, E2, D>> for &Tensor<S, E, D>
        where
            S: Broadcasts<S2, op::$f>,
        {
            type Output = Tensor<<S as BroadcastShape<S2>>::Output, E, D>;
            #[track_caller]
            fn $f(self, rhs: Tensor<S2, E2, D>) -> Self::Output {
                ok(self.try_zip($op, E2::same(&rhs)))
            }
        }
    };
}

std_op!(Add, add, Add);
std_op!(Sub, sub, Sub);
std_op!(Mul, mul, Mul);
std_op!(Div, div, Div);

macro_rules! scalar_op {
    ($t:ty, $tr:ident, $f:ident, |$x:ident, $v:ident| $body:expr) => {
        impl<S: Shape, D: crate::device::Device<$t>> std::ops::$tr<$t> for &Tensor<S, $t, D> {
            type Output = Tensor<S, $t, D>;
            fn $f(self, $v: $t) -> Self::Output {
                let $x = self;
                $body
            }
        }
        impl<S: Shape, D: crate::device::Device<$t>> std::ops::$tr<$t> for Tensor<S, $t, D> {
            type Output = Tensor<S, $t, D>;
            fn $f(self, $v: $t) -> Self::Output {
                let $x = &self;
                $body
            }
        }
    };
}

macro_rules! scalar_ops {
    ($($t:ty),*) => {$(
        scalar_op!($t, Add, add, |x, v| x.add_scalar(v as f64));
        scalar_op!($t, Sub, sub, |x, v| x.add_scalar(-(v as f64)));
        scalar_op!($t, Mul, mul, |x, v| x.mul_scalar(v as f64));
        scalar_op!($t, Div, div, |x, v| x.div_scalar(v as f64));
    )*};
}

scalar_ops!(f32, f64);

impl<S: Shape, E: Float, D: crate::device::Device<E>> std::ops::Neg for &Tensor<S, E, D> {
    type Output = Tensor<S, E, D>;
    fn neg(self) -> Self::Output {
        self.map_unary(Neg {})
    }
}

impl<S: Shape, E: Float, D: crate::device::Device<E>> std::ops::Neg for Tensor<S, E, D> {
    type Output = Tensor<S, E, D>;
    fn neg(self) -> Self::Output {
        self.map_unary(Neg {})
    }
}
