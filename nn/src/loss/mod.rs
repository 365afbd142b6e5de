//! Loss functions in PyTorch's names, options, reductions and numerics, as
//! functions (`cross_entropy(&logits, &target, Mean)`) and as structs holding
//! the options (`CrossEntropyLoss::new().label_smoothing(0.1)`), like
//! `torch.nn.functional` and `torch.nn`.
//!
//! - **Reductions are types** ([`Mean`], [`Sum`], [`NoReduction`],
//!   [`BatchMean`]), so the output's shape is typed: a scalar
//!   `Tensor<()>` to call `backward()` on, or the unreduced losses with the
//!   input's shape (the input's without the class axis for class losses).
//! - **The target's shape is checked** against the input's ([`LossShape`]):
//!   static sizes at compile time, `Dyn` sizes when the loss runs.
//! - Every loss is differentiable through the tape with respect to the input
//!   and, where PyTorch differentiates it, the target. Most are compositions
//!   of core ops; the two binary cross-entropies record PyTorch's own
//!   gradient formulas (finite where the composition would give `0 * inf`).
//! - Each loss has a `try_` form returning a [`LossError`] (a class index out
//!   of range, a `Dyn` size mismatch, an option out of range, a probability
//!   outside `[0, 1]`); the plain form panics with the same message.
//!
//! ```
//! use forma::prelude::*;
//! use forma::nn::loss::{cross_entropy, CrossEntropyLoss, Mean, NoReduction};
//!
//! let logits = Tensor::<(Dyn, C<3>)>::from_vec(vec![2.0, 0.5, -1.0, 0.1, 0.2, 3.0], (Dyn(2), C))
//!     .unwrap()
//!     .requires_grad();
//! let target = Tensor::<(Dyn,), i64>::from_vec(vec![0, 2], (Dyn(2),)).unwrap();
//! let loss: Tensor<()> = cross_entropy(&logits, &target, Mean);
//! loss.backward();
//! assert_eq!(logits.grad().unwrap().dims()[..], [2, 3]);
//!
//! let per_sample: Tensor<(Dyn,)> = CrossEntropyLoss::new()
//!     .label_smoothing(0.1)
//!     .reduction(NoReduction)
//!     .forward(&logits, &target);
//! assert_eq!(per_sample.dims()[..], [2]);
//! ```

mod binary;
mod class;
mod kl;
mod reduction;
mod regression;
mod shape;

pub use binary::{
    binary_cross_entropy, binary_cross_entropy_with_logits, try_binary_cross_entropy,
    try_binary_cross_entropy_with_logits, BceLoss, BceWithLogitsLoss,
};
pub use class::{
    cross_entropy, cross_entropy_probs, nll_loss, try_cross_entropy, try_cross_entropy_probs,
    try_nll_loss, CrossEntropyLoss, NllLoss,
};
pub use kl::{kl_div, try_kl_div, KlDivLoss};
pub use reduction::{AnyReduction, BatchMean, Mean, NoReduction, Reduction, ReductionKind, Sum};
pub use regression::{
    huber_loss, l1_loss, mse_loss, smooth_l1_loss, try_huber_loss, try_l1_loss, try_mse_loss,
    try_smooth_l1_loss, HuberLoss, L1Loss, MseLoss, SmoothL1Loss,
};
pub use shape::{
    op, ClassInput, ClassTargets, ClassWeight, LossDim, LossRanks, LossShape, LossSizes,
    WeightSizes,
};

use crate::module::ok;
use forma_core::device::Device;
use forma_core::error::fmt_dims;
use forma_core::{Dyn, Error, Float, Shape, Tensor};

/// Why a loss could not be computed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LossError {
    /// A class index outside `0..classes` that is not the `ignore_index`.
    #[error("{op}: target class {index} is out of range for {classes} classes (ignore_index is {ignore_index})")]
    ClassOutOfRange {
        /// The loss.
        op: &'static str,
        /// The offending class index.
        index: i64,
        /// The number of classes (the input's size along axis 1).
        classes: usize,
        /// The index that would have been skipped.
        ignore_index: i64,
    },
    /// A value outside the loss's domain (a probability outside `[0, 1]`).
    #[error("{op}: every element of the {what} must be in [0, 1], but element {index} is {value}")]
    OutOfDomain {
        /// The loss.
        op: &'static str,
        /// Which operand (`"input"`, `"target"`).
        what: &'static str,
        /// The flat (row-major) index of the first offending element.
        index: usize,
        /// Its value.
        value: f64,
    },
    /// An option outside its range, or a weight of the wrong size.
    #[error("{op}: {msg}")]
    InvalidOption {
        /// The loss.
        op: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// An error of the ops the loss runs: a `Dyn` size of the target that
    /// differs from the input's, operands on different devices.
    #[error(transparent)]
    Core(#[from] Error),
}

impl LossError {
    fn option(op: &'static str, msg: impl Into<String>) -> Self {
        LossError::InvalidOption {
            op,
            msg: msg.into(),
        }
    }
}

/// Checks that a target's sizes are `expected` (the run-time half of
/// [`LossShape`], for `Dyn` dims).
fn check_dims(op: &'static str, expected: &[usize], actual: &[usize]) -> Result<(), LossError> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::shape(op, fmt_dims(expected), actual).into())
    }
}

/// The input and the target flattened (views on the tape), after checking
/// that their sizes agree.
fn flat_pair<S: Shape, T: Shape, E: Float, D: Device<E>>(
    op: &'static str,
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E, D>,
) -> Result<(Tensor<(Dyn,), E, D>, Tensor<(Dyn,), E, D>), LossError> {
    check_dims(op, &input.dims(), &target.dims())?;
    Ok((input.flatten_all(), target.flatten_all()))
}

/// Reduces the flat per-element losses `per` of an unreduced loss with sizes
/// `dims` (typed `S`) as `R` says. `mean_over` is the mean's denominator
/// (the total class weight of class losses), or `None` for the element count.
fn reduce<R: AnyReduction, S: Shape, E: Float, D: Device<E>>(
    op: &'static str,
    per: Tensor<(Dyn,), E, D>,
    dims: &[usize],
    mean_over: Option<f64>,
) -> Result<Tensor<R::Output<S>, E, D>, LossError> {
    let scalar = match R::KIND {
        ReductionKind::None => {
            let shape = <R::Output<S> as Shape>::from_dims(dims)
                .ok_or_else(|| Error::shape(op, <R::Output<S> as Shape>::describe(), dims))?;
            return Ok(per.try_reshape_to(shape)?);
        }
        ReductionKind::Sum => per.sum_all(),
        ReductionKind::Mean => match mean_over {
            Some(n) => per.sum_all().div_scalar(n),
            None => per.mean_all(),
        },
        // PyTorch divides the sum by `input.size(0)`, except for a scalar input.
        ReductionKind::BatchMean => match dims.first() {
            Some(&b) => per.sum_all().div_scalar(b as f64),
            None => per.sum_all(),
        },
    };
    Ok(scalar.try_into_shape::<R::Output<S>>()?)
}

/// A weight that broadcasts against the input (PyTorch's BCE `weight` and
/// `pos_weight`): its values, flattened, and its sizes.
#[derive(Clone, Debug)]
struct Weight<E: Float, D: Device<E>> {
    values: Tensor<(Dyn,), E, D>,
    dims: Vec<usize>,
}

impl<E: Float, D: Device<E>> Weight<E, D> {
    fn new<S: Shape>(t: &Tensor<S, E, D>) -> Self {
        Weight {
            values: t.detach().flatten_all(),
            dims: t.dims().to_vec(),
        }
    }

    /// The weight broadcast to `to` (right-aligned, as in PyTorch) and
    /// flattened: a constant, like PyTorch's non-differentiable loss weights.
    fn expand(&self, op: &'static str, to: &[usize]) -> Result<Tensor<(Dyn,), E, D>, LossError> {
        let (w, r) = (&self.dims, to.len());
        let fits = w.len() <= r
            && w.iter()
                .zip(&to[r - w.len()..])
                .all(|(&a, &b)| a == b || a == 1);
        if !fits {
            return Err(LossError::option(
                op,
                format!(
                    "a weight of shape {} does not broadcast to the input's shape {}",
                    fmt_dims(w),
                    fmt_dims(to)
                ),
            ));
        }
        if w.as_slice() == to {
            return Ok(self.values.clone());
        }
        let src = self.values.try_to_vec()?;
        // The weight's strides in the output's index space (0 where it stretches).
        let mut strides = vec![0usize; r];
        let mut s = 1;
        for i in (0..w.len()).rev() {
            let o = r - w.len() + i;
            strides[o] = if w[i] == 1 { 0 } else { s };
            s *= w[i];
        }
        let n: usize = to.iter().product();
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; r];
        for _ in 0..n {
            out.push(src[idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>()]);
            for ax in (0..r).rev() {
                idx[ax] += 1;
                if idx[ax] < to[ax] {
                    break;
                }
                idx[ax] = 0;
            }
        }
        Ok(Tensor::from_vec_on(out, (Dyn(n),), self.values.device())?)
    }
}
