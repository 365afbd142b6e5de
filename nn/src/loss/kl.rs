//! [`kl_div`]: the Kullback-Leibler divergence of a target distribution from
//! the input's, with the input given as log-probabilities, like `F.kl_div`.

use super::op;
use super::{flat_pair, ok, reduce, AnyReduction, LossError, LossShape, Mean};
use forma_core::device::Device;
use forma_core::{Float, Shape, Tensor};

/// `target * (log target - input)` elementwise (`0` where the target is 0),
/// or with `log_target` the target given as log-probabilities,
/// `exp(target) * (target - input)`, like `F.kl_div(input, target,
/// reduction=..., log_target=...)`. The input is log-probabilities.
///
/// [`BatchMean`](super::BatchMean) gives the divergence itself (the sum over
/// the batch divided by the batch size); [`Mean`] averages over every element,
/// as PyTorch's deprecated default does.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::loss::{kl_div, BatchMean};
/// let p = Tensor::<(Dyn, C<2>)>::from_vec(vec![0.5, 0.5], (Dyn(1), C)).unwrap();
/// let l = kl_div(&p.log(), &p, BatchMean, false);
/// assert_eq!(l.item(), 0.0);
/// ```
///
/// # Panics
/// If a `Dyn` size of the target differs (see [`try_kl_div`]).
#[track_caller]
pub fn kl_div<S: Shape, T: Shape, R: AnyReduction, E: Float, D: Device<E>>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E, D>,
    reduction: R,
    log_target: bool,
) -> Tensor<R::Output<S>, E, D>
where
    S: LossShape<T, op::kl_div>,
{
    ok(try_kl_div(input, target, reduction, log_target))
}

/// Fallible [`kl_div`].
///
/// # Errors
/// [`LossError::Core`] when a `Dyn` size of the target differs.
pub fn try_kl_div<S: Shape, T: Shape, R: AnyReduction, E: Float, D: Device<E>>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E, D>,
    reduction: R,
    log_target: bool,
) -> Result<Tensor<R::Output<S>, E, D>, LossError>
where
    S: LossShape<T, op::kl_div>,
{
    const OP: &str = "kl_div";
    let _ = reduction;
    let (x, y) = flat_pair(OP, input, target)?;
    let per = if log_target {
        &y.exp() * &(&y - &x)
    } else {
        // xlogy(y, y) - y * x, with xlogy(0, _) = 0: the log reads 1 where the
        // target is 0, so neither the value nor the gradient meets log(0).
        let zero = Tensor::<(), E, D>::zeros_on((), y.device());
        let safe = y.masked_fill(&y.eq(&zero), 1.0);
        &(&y * &safe.log()) - &(&y * &x)
    };
    reduce::<R, S, E, D>(OP, per, &input.dims(), None)
}

/// [`kl_div`] with its options, like `nn.KLDivLoss(reduction=...,
/// log_target=...)`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KlDivLoss<R: AnyReduction = Mean> {
    log_target: bool,
    reduction: R,
}

impl KlDivLoss<Mean> {
    /// PyTorch's defaults: `reduction='mean'`, `log_target=False`.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<R: AnyReduction> KlDivLoss<R> {
    /// Whether the target is given as log-probabilities (default false).
    pub fn log_target(mut self, log_target: bool) -> Self {
        self.log_target = log_target;
        self
    }

    /// The same loss with another reduction (PyTorch recommends `BatchMean`).
    pub fn reduction<R2: AnyReduction>(self, reduction: R2) -> KlDivLoss<R2> {
        KlDivLoss {
            log_target: self.log_target,
            reduction,
        }
    }

    /// Computes the loss.
    ///
    /// # Errors
    /// As [`try_kl_div`].
    pub fn try_forward<S: Shape, T: Shape, E: Float, D: Device<E>>(
        &self,
        input: &Tensor<S, E, D>,
        target: &Tensor<T, E, D>,
    ) -> Result<Tensor<R::Output<S>, E, D>, LossError>
    where
        S: LossShape<T, op::kl_div>,
    {
        try_kl_div(input, target, self.reduction, self.log_target)
    }

    /// Computes the loss.
    ///
    /// # Panics
    /// Where [`Self::try_forward`] errs.
    #[track_caller]
    pub fn forward<S: Shape, T: Shape, E: Float, D: Device<E>>(
        &self,
        input: &Tensor<S, E, D>,
        target: &Tensor<T, E, D>,
    ) -> Tensor<R::Output<S>, E, D>
    where
        S: LossShape<T, op::kl_div>,
    {
        ok(self.try_forward(input, target))
    }
}
