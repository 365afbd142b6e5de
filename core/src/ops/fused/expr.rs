//! Fused expressions: a typed tree of table ops over the inputs, built once
//! per call by the user's closure and evaluated per element.
//!
//! Each node is a type (`Arg<I>`, [`Unary`], [`Binary`]), so the whole tree
//! is one monomorphised function: the CPU backend runs it as one vectorised
//! loop. The same tree also knows its derivatives (one reverse sweep per
//! element) and how to run as composed ops, for backends without a fused
//! kernel.

use crate::device::Device;
use crate::dtype::{Float, Real};
use crate::error::Result;
use crate::ops::binary::{raw_binary as binary, raw_binary_backward, Add, BinaryOp, Div, Mul, Sub};
use crate::ops::unary::{AddScalar, DivScalar, MulScalar, Neg, UnaryOp};
use crate::tape::Raw;

/// An elementwise expression over the inputs of a [`crate::ops::fused::fused`] call.
///
/// Implemented by the expression nodes only; users build expressions with
/// operators (`+ - * /`, also with an `f64` on either side of `+ - *` and on
/// the right of `/`) and the table ops' methods ([`UnaryExprs`](crate::ops::unary::UnaryExprs),
/// [`BinaryExprs`](crate::ops::binary::BinaryExprs)), never by implementing this.
pub trait Expr: Copy + Send + Sync + 'static {
    /// The value at one position, from every input's value there.
    fn eval<R: Real, const N: usize>(&self, x: &[R; N]) -> R;

    /// Adds `seed * d(self)/d(x[i])` to `grad[i]` for each input `i` (reverse
    /// mode; each op contributes its output gradient times its partial
    /// derivatives, as the composed ops' backwards do).
    fn grad<R: Real, const N: usize>(&self, x: &[R; N], seed: R, grad: &mut [R; N]);

    /// The expression as composed ops over raw tensors (every input already
    /// stretched to the output's sizes), each op rounding to `E`.
    fn compose<E: Float, D: Device<E>>(&self, x: &[Raw<E, D>]) -> Result<Raw<E, D>>;

    /// Appends this expression's nodes (operands first) to `nodes` for
    /// graph capture; returns the index of its own.
    fn graph(&self, nodes: &mut Vec<crate::graph::Elem>) -> usize;

    /// The backward of [`Expr::compose`]: adds each input's share of the
    /// output gradient `g` into `grads[i]`.
    fn compose_grad<E: Float, D: Device<E>>(
        &self,
        x: &[Raw<E, D>],
        g: Raw<E, D>,
        grads: &mut [Option<Raw<E, D>>],
    ) -> Result<()>;
}

/// The `I`th input of a fused expression.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Arg<const I: usize>;

/// A unary table op applied to an expression.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Unary<Op, A>(pub Op, pub A);

/// A binary table op applied to two expressions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Binary<Op, A, B>(pub Op, pub A, pub B);

impl<const I: usize> Expr for Arg<I> {
    #[inline(always)]
    fn eval<R: Real, const N: usize>(&self, x: &[R; N]) -> R {
        x[I]
    }

    #[inline(always)]
    fn grad<R: Real, const N: usize>(&self, _: &[R; N], seed: R, grad: &mut [R; N]) {
        grad[I] = grad[I] + seed;
    }

    fn compose<E: Float, D: Device<E>>(&self, x: &[Raw<E, D>]) -> Result<Raw<E, D>> {
        Ok(x[I].clone())
    }

    fn graph(&self, nodes: &mut Vec<crate::graph::Elem>) -> usize {
        nodes.push(crate::graph::Elem::Arg(I));
        nodes.len() - 1
    }

    fn compose_grad<E: Float, D: Device<E>>(
        &self,
        _: &[Raw<E, D>],
        g: Raw<E, D>,
        grads: &mut [Option<Raw<E, D>>],
    ) -> Result<()> {
        grads[I] = Some(match grads[I].take() {
            None => g,
            Some(prev) => binary(Add, &prev, &g)?,
        });
        Ok(())
    }
}

impl<Op: UnaryOp, A: Expr> Expr for Unary<Op, A> {
    fn graph(&self, nodes: &mut Vec<crate::graph::Elem>) -> usize {
        let x = self.1.graph(nodes);
        let (name, params) = (Op::NAME, self.0.params());
        nodes.push(crate::graph::Elem::Unary { name, params, x });
        nodes.len() - 1
    }

    #[inline(always)]
    fn eval<R: Real, const N: usize>(&self, x: &[R; N]) -> R {
        self.0.f(self.1.eval(x))
    }

    #[inline(always)]
    fn grad<R: Real, const N: usize>(&self, x: &[R; N], seed: R, grad: &mut [R; N]) {
        let v = self.1.eval(x);
        let y = self.0.f(v);
        self.1.grad(x, seed * self.0.df(v, y), grad);
    }

    fn compose<E: Float, D: Device<E>>(&self, x: &[Raw<E, D>]) -> Result<Raw<E, D>> {
        let v = self.1.compose(x)?;
        let y = v.device.unary(self.0, &v.storage(), &v.layout)?;
        Ok(Raw::new(y, &v.layout.dims, v.device.clone()))
    }

    fn compose_grad<E: Float, D: Device<E>>(
        &self,
        x: &[Raw<E, D>],
        g: Raw<E, D>,
        grads: &mut [Option<Raw<E, D>>],
    ) -> Result<()> {
        let v = self.1.compose(x)?;
        let y = self.compose(x)?;
        let gv = g.device.unary_backward(
            self.0,
            &v.storage(),
            &v.layout,
            &y.storage(),
            &y.layout,
            &g.storage(),
            &g.layout,
        )?;
        let gv = Raw::new(gv, &g.layout.dims, g.device.clone());
        self.1.compose_grad(x, gv, grads)
    }
}

impl<Op: BinaryOp, A: Expr, B: Expr> Expr for Binary<Op, A, B> {
    fn graph(&self, nodes: &mut Vec<crate::graph::Elem>) -> usize {
        let (a, b) = (self.1.graph(nodes), self.2.graph(nodes));
        nodes.push(crate::graph::Elem::Binary {
            name: Op::NAME,
            a,
            b,
        });
        nodes.len() - 1
    }

    #[inline(always)]
    fn eval<R: Real, const N: usize>(&self, x: &[R; N]) -> R {
        self.0.f(self.1.eval(x), self.2.eval(x))
    }

    #[inline(always)]
    fn grad<R: Real, const N: usize>(&self, x: &[R; N], seed: R, grad: &mut [R; N]) {
        let (a, b) = (self.1.eval(x), self.2.eval(x));
        let (da, db) = self.0.df(a, b);
        self.1.grad(x, seed * da, grad);
        self.2.grad(x, seed * db, grad);
    }

    fn compose<E: Float, D: Device<E>>(&self, x: &[Raw<E, D>]) -> Result<Raw<E, D>> {
        binary(self.0, &self.1.compose(x)?, &self.2.compose(x)?)
    }

    fn compose_grad<E: Float, D: Device<E>>(
        &self,
        x: &[Raw<E, D>],
        g: Raw<E, D>,
        grads: &mut [Option<Raw<E, D>>],
    ) -> Result<()> {
        let (a, b) = (self.1.compose(x)?, self.2.compose(x)?);
        let (ga, gb) = raw_binary_backward(self.0, &a, &b, &g)?;
        self.1.compose_grad(x, ga, grads)?;
        self.2.compose_grad(x, gb, grads)
    }
}

// Operators between expressions, and with an `f64` constant, for every node
// type (a blanket impl over `Expr` would collide with the std impls).
macro_rules! expr_operators {
    ($([$($g:tt)*] $node:ty),*) => {$(
        impl<$($g)*, Rhs: Expr> std::ops::Add<Rhs> for $node {
            type Output = Binary<Add, Self, Rhs>;
            fn add(self, rhs: Rhs) -> Self::Output { Binary(Add, self, rhs) }
        }
        impl<$($g)*, Rhs: Expr> std::ops::Sub<Rhs> for $node {
            type Output = Binary<Sub, Self, Rhs>;
            fn sub(self, rhs: Rhs) -> Self::Output { Binary(Sub, self, rhs) }
        }
        impl<$($g)*, Rhs: Expr> std::ops::Mul<Rhs> for $node {
            type Output = Binary<Mul, Self, Rhs>;
            fn mul(self, rhs: Rhs) -> Self::Output { Binary(Mul, self, rhs) }
        }
        impl<$($g)*, Rhs: Expr> std::ops::Div<Rhs> for $node {
            type Output = Binary<Div, Self, Rhs>;
            fn div(self, rhs: Rhs) -> Self::Output { Binary(Div, self, rhs) }
        }
        impl<$($g)*> std::ops::Neg for $node {
            type Output = Unary<Neg, Self>;
            fn neg(self) -> Self::Output { Unary(Neg {}, self) }
        }
        // The scalar forms are the tensor scalar ops (`x - v` is `x + (-v)`,
        // as for tensors), so fused and composed results agree.
        impl<$($g)*> std::ops::Add<f64> for $node {
            type Output = Unary<AddScalar, Self>;
            fn add(self, value: f64) -> Self::Output { Unary(AddScalar { value }, self) }
        }
        impl<$($g)*> std::ops::Sub<f64> for $node {
            type Output = Unary<AddScalar, Self>;
            fn sub(self, value: f64) -> Self::Output { Unary(AddScalar { value: -value }, self) }
        }
        impl<$($g)*> std::ops::Mul<f64> for $node {
            type Output = Unary<MulScalar, Self>;
            fn mul(self, value: f64) -> Self::Output { Unary(MulScalar { value }, self) }
        }
        impl<$($g)*> std::ops::Div<f64> for $node {
            type Output = Unary<DivScalar, Self>;
            fn div(self, value: f64) -> Self::Output { Unary(DivScalar { value }, self) }
        }
        impl<$($g)*> std::ops::Add<$node> for f64 {
            type Output = Unary<AddScalar, $node>;
            fn add(self, x: $node) -> Self::Output { Unary(AddScalar { value: self }, x) }
        }
        impl<$($g)*> std::ops::Mul<$node> for f64 {
            type Output = Unary<MulScalar, $node>;
            fn mul(self, x: $node) -> Self::Output { Unary(MulScalar { value: self }, x) }
        }
        // `v - x` is `(-x) + v`: negation is exact, so this is `v - x` rounded once.
        impl<$($g)*> std::ops::Sub<$node> for f64 {
            type Output = Unary<AddScalar, Unary<Neg, $node>>;
            fn sub(self, x: $node) -> Self::Output { Unary(AddScalar { value: self }, Unary(Neg {}, x)) }
        }
    )*};
}

expr_operators!(
    [const I: usize] Arg<I>,
    [Op: UnaryOp, A: Expr] Unary<Op, A>,
    [Op: BinaryOp, A: Expr, B: Expr] Binary<Op, A, B>
);
