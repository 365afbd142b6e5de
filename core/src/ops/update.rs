//! Fused in-place updates: one pass over a parameter, its gradient and the
//! optimizer's state buffers, writing the parameter and the buffers in place
//! (PyTorch's fused optimizer kernels). An update rule is a per-element
//! function ([`UpdateOp`]); a backend runs it with [`UpdateKernel`] or says it
//! cannot, and the caller then runs the same rule as composed tensor ops.
//!
//! The shape rule: every operand has the gradient's sizes (the same shape
//! type, its `Dyn` sizes checked when the update runs).

use crate::device::{Backend, Device};
use crate::dtype::{Float, Real};
use crate::error::{fmt_dims, Error, Result};
use crate::layout::Layout;
use crate::shape::Shape;
use crate::tensor::Tensor;

/// A per-element update rule over `N` values: `state[0]` is the parameter,
/// `state[1..]` the rule's buffers (moment averages, momentum, ...), all
/// updated in place from the gradient.
///
/// `apply` runs in the accumulation type (f32 for f16, bf16 and f32; f64 for
/// f64): values are widened, updated, and rounded back once per step.
pub trait UpdateOp<const N: usize>: Copy + Send + Sync + 'static {
    /// The rule's name, for errors.
    const NAME: &'static str;
    /// Updates one element of the parameter and of each buffer.
    fn apply<R: Real>(&self, grad: R, state: &mut [R; N]);
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
    /// use forma::core::dtype::Real;
    /// use forma::core::ops::update::UpdateOp;
    ///
    /// // Plain gradient descent: p -= 0.5 * g.
    /// #[derive(Clone, Copy)]
    /// struct Descent;
    /// impl UpdateOp<1> for Descent {
    ///     const NAME: &'static str = "descent";
    ///     fn apply<R: Real>(&self, g: R, s: &mut [R; 1]) {
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
        for t in state {
            grad.same_device(Op::NAME, t)?;
            if t.layout.dims != grad.layout.dims {
                return Err(Error::shape(
                    Op::NAME,
                    fmt_dims(&grad.layout.dims),
                    &t.layout.dims,
                ));
            }
        }
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
