//! In-place updates of a parameter and an optimizer's state buffers from a
//! gradient. An update rule is written once, as a per-element function
//! ([`UpdateOp`]) over a [`Lane`]: a backend runs it fused with
//! [`UpdateKernel`] (one pass over memory, PyTorch's fused optimizer
//! kernels), and [`Tensor::try_composed_update`] runs the same function over
//! whole tensors ([`Composed`]), one op at a time, where there is no fused
//! kernel or where per-op rounding is wanted.
//!
//! The shape rule: every operand has the gradient's sizes (the same shape
//! type, its `Dyn` sizes checked when the update runs).

mod composed;

pub use composed::Composed;

use crate::device::{Backend, Device};
use crate::dtype::{Float, Real};
use crate::error::{fmt_dims, Error, Result};
use crate::layout::Layout;
use crate::ops::binary::{BinaryOp, Maximum};
use crate::shape::Shape;
use crate::tensor::Tensor;
use composed::Value;

/// The arithmetic an update rule is written in: the operators, constants
/// (`R::c(0.9)`), `sqrt` and `maximum`. Implemented by the accumulation
/// types (one element at a time, in the fused pass) and by [`Composed`]
/// (whole tensors, one op at a time).
pub trait Lane:
    Copy
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
{
    /// The constant `v` (rounded to the accumulation type).
    fn c(v: f64) -> Self;
    /// The square root.
    fn sqrt(self) -> Self;
    /// The larger of two values, NaN if either is (`torch.maximum`).
    fn maximum(self, other: Self) -> Self;
}

impl<R: Real> Lane for R {
    #[inline(always)]
    fn c(v: f64) -> Self {
        <R as Real>::c(v)
    }

    #[inline(always)]
    fn sqrt(self) -> Self {
        num_traits::Float::sqrt(self)
    }

    #[inline(always)]
    fn maximum(self, other: Self) -> Self {
        Maximum.f(self, other)
    }
}

/// A per-element update rule over `N` values: `state[0]` is the parameter,
/// `state[1..]` the rule's buffers (moment averages, momentum, ...), all
/// updated in place from the gradient.
///
/// `apply` is written once, generic over the [`Lane`]. Fused, it runs in the
/// accumulation type (f32 for f16, bf16 and f32; f64 for f64): values are
/// widened, updated, and rounded back once per step. Composed, each
/// operation is a tensor op rounding to the element type. In f32 and f64
/// both give the same bits. Branch only on the rule's own fields, never on
/// values (a composed value is a whole tensor).
pub trait UpdateOp<const N: usize>: Copy + Send + Sync + 'static {
    /// The rule's name, for errors.
    const NAME: &'static str;
    /// Updates one element of the parameter and of each buffer.
    fn apply<R: Lane>(&self, grad: R, state: &mut [R; N]);
}

/// Backend support for [`UpdateOp`]s.
pub trait UpdateKernel<E: Float>: Backend {
    /// Runs `op` over every element, in place: `grad` is read, each storage
    /// of `state` (`state[0]` the parameter) is read and written. Every view
    /// has the same sizes; no two storages are the same buffer.
    ///
    /// Returns `Ok(false)`, having written nothing, when the backend has no
    /// fused kernel for these operands (the default: no fused kernel on this
    /// backend), and the caller runs the rule as composed ops instead.
    fn update<const N: usize, Op: UpdateOp<N>>(
        &self,
        op: Op,
        grad: &Self::Storage<E>,
        lg: &Layout,
        state: [(&mut Self::Storage<E>, &Layout); N],
    ) -> Result<bool> {
        let _ = (op, grad, lg, state);
        Ok(false)
    }
}

impl<S: Shape, E: Float, D: Device<E>> Tensor<S, E, D> {
    /// Updates `state` in place with the rule `op` and the gradient `grad`,
    /// in one pass over memory: `state[0]` is the parameter, the rest the
    /// rule's buffers. Runs outside the autograd graph, like the in-place
    /// updates of `torch.optim` under no-grad.
    ///
    /// Returns whether the update ran. It does not (and nothing is written)
    /// when the backend has no fused kernel for these operands (CUDA, or a
    /// view that is not dense on the CPU), or when two of the tensors share
    /// a storage; the caller then runs the rule as composed ops.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::core::ops::update::{Lane, UpdateOp};
    ///
    /// // Plain gradient descent: p -= 0.5 * g.
    /// #[derive(Clone, Copy)]
    /// struct Descent;
    /// impl UpdateOp<1> for Descent {
    ///     const NAME: &'static str = "descent";
    ///     fn apply<R: Lane>(&self, g: R, s: &mut [R; 1]) {
    ///         s[0] = s[0] - R::c(0.5) * g;
    ///     }
    /// }
    ///
    /// let p = Tensor::<(C<2>,)>::from_vec(vec![1.0, 2.0], (C,)).unwrap();
    /// let g = Tensor::<(C<2>,)>::from_vec(vec![2.0, -2.0], (C,)).unwrap();
    /// assert!(Tensor::try_fused_update(Descent, &g, [&p]).unwrap());
    /// assert_eq!(p.to_vec(), [0.0, 3.0]);
    /// ```
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when a tensor's sizes differ from the
    /// gradient's, a device mismatch, or a backend failure.
    pub fn try_fused_update<const N: usize, Op: UpdateOp<N>>(
        op: Op,
        grad: &Self,
        state: [&Self; N],
    ) -> Result<bool> {
        check_operands(Op::NAME, grad, &state)?;
        // One storage locked twice (read and write, or write twice) would
        // deadlock, and aliased operands would not be a per-element update.
        let all: Vec<&Self> = std::iter::once(grad).chain(state).collect();
        for (i, a) in all.iter().enumerate() {
            if all[i + 1..].iter().any(|b| a.shares_storage(*b)) {
                return Ok(false);
            }
        }
        let g = grad.storage();
        let mut guards = state.map(|t| t.storage_mut());
        let mut it = guards.iter_mut();
        let operands: [(&mut D::Storage<E>, &Layout); N] = std::array::from_fn(|i| {
            let s = it.next().expect("one guard per state tensor");
            (&mut **s, &state[i].layout)
        });
        grad.device.update(op, &g, &grad.layout, operands)
    }
}

impl<S: Shape, E: Float, D: Device<E>> Tensor<S, E, D> {
    /// Runs the rule `op` as composed tensor ops, one kernel per operation,
    /// each rounding to the element type (PyTorch's single-tensor
    /// optimizers), then writes each state tensor the rule changed in place.
    /// The same rule as [`Tensor::try_fused_update`], derived from the same
    /// `apply`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::core::ops::update::{Lane, UpdateOp};
    ///
    /// // Momentum: m = 0.5 m + g; p -= m / 4.
    /// #[derive(Clone, Copy)]
    /// struct Momentum;
    /// impl UpdateOp<2> for Momentum {
    ///     const NAME: &'static str = "momentum";
    ///     fn apply<R: Lane>(&self, g: R, s: &mut [R; 2]) {
    ///         s[1] = s[1] * R::c(0.5) + g;
    ///         s[0] = s[0] - s[1] / R::c(4.0);
    ///     }
    /// }
    ///
    /// let p = Tensor::<(C<2>,)>::from_vec(vec![1.0, 2.0], (C,)).unwrap();
    /// let m = Tensor::<(C<2>,)>::from_vec(vec![2.0, 0.0], (C,)).unwrap();
    /// let g = Tensor::<(C<2>,)>::from_vec(vec![1.0, 4.0], (C,)).unwrap();
    /// Tensor::try_composed_update(Momentum, &g, [&p, &m]).unwrap();
    /// assert_eq!(m.to_vec(), [2.0, 4.0]);
    /// assert_eq!(p.to_vec(), [0.5, 1.0]);
    /// ```
    ///
    /// # Errors
    /// As [`Tensor::try_fused_update`]; nothing is written when an op fails.
    pub fn try_composed_update<const N: usize, Op: UpdateOp<N>>(
        op: Op,
        grad: &Self,
        state: [&Self; N],
    ) -> Result<()> {
        check_operands(Op::NAME, grad, &state)?;
        let new = composed::run(op, grad.raw(), state.map(Tensor::raw))?;
        // A state tensor set to another one's old value reads it before
        // that one is written: copy it first.
        let mut values = Vec::with_capacity(N);
        for v in new {
            values.push(match v {
                Some(Value::Tensor(r))
                    if state
                        .iter()
                        .any(|t| std::sync::Arc::ptr_eq(&t.storage, &r.storage)) =>
                {
                    let s = r.device.contiguous(&r.storage(), &r.layout)?;
                    let dims = r.layout.dims;
                    Some(Value::Tensor(crate::tape::Raw::new(s, &dims, r.device)))
                }
                v => v,
            });
        }
        for (t, v) in state.iter().zip(values) {
            match v {
                None => {}
                Some(Value::Const(c)) => t.try_fill(c)?,
                Some(Value::Tensor(r)) => t.try_assign(&Tensor::<S, E, D>::from_raw(r)?)?,
            }
        }
        Ok(())
    }

    /// Runs the rule `op`: fused when `fused` and the backend has a kernel
    /// for these operands ([`Tensor::try_fused_update`]), else composed
    /// ([`Tensor::try_composed_update`]).
    ///
    /// # Errors
    /// As [`Tensor::try_fused_update`].
    pub fn try_update<const N: usize, Op: UpdateOp<N>>(
        op: Op,
        grad: &Self,
        state: [&Self; N],
        fused: bool,
    ) -> Result<()> {
        if fused && Self::try_fused_update(op, grad, state)? {
            return Ok(());
        }
        Self::try_composed_update(op, grad, state)
    }
}

/// Every state tensor is on the gradient's device, with its sizes.
fn check_operands<S: Shape, E: Float, D: Device<E>>(
    name: &'static str,
    grad: &Tensor<S, E, D>,
    state: &[&Tensor<S, E, D>],
) -> Result<()> {
    for t in state {
        grad.same_device(name, t)?;
        if t.layout.dims != grad.layout.dims {
            return Err(Error::shape(
                name,
                fmt_dims(&grad.layout.dims),
                &t.layout.dims,
            ));
        }
    }
    Ok(())
}
