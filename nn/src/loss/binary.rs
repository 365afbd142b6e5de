//! Binary cross-entropies: [`binary_cross_entropy`] on probabilities and
//! [`binary_cross_entropy_with_logits`] on logits, with an elementwise
//! `weight` (and `pos_weight` for logits) that broadcasts against the input.
//!
//! Both record PyTorch's own gradient formulas on the tape instead of
//! differentiating their forward composition: on probabilities the input's
//! gradient `(x - y) / max(x (1 - x), 1e-12)` stays finite where `x` is
//! exactly 0 or 1 (the clamped logarithm's chain rule would give `0 * inf`),
//! and on logits `sigmoid(x) - y` holds at `x = 0`, where the stable form's
//! `|x|` and `min(x, 0)` have kinks.

use super::op;
use super::{flat_pair, ok, reduce, LossError, LossShape, Mean, Reduction, Weight};
use forma_core::device::Device;
use forma_core::tape::no_grad;
use forma_core::{Dtype, Dyn, Float, Shape, Tensor};
use forma_cpu::Cpu;

type Flat<E, D> = Tensor<(Dyn,), E, D>;

/// The floor of `x (1 - x)` in the BCE gradient: PyTorch's `EPSILON`, a
/// `float` 1e-12 (so 9.999999960041972e-13 in f64).
const EPSILON: f64 = 1e-12f32 as f64;

/// Checks that every element of `t` is in `[0, 1]` (NaN is not), as PyTorch
/// does for `binary_cross_entropy`.
fn check_unit<E: Float, D: Device<E>>(
    op: &'static str,
    what: &'static str,
    t: &Flat<E, D>,
) -> Result<(), LossError> {
    let bad = t
        .try_to_vec()?
        .into_iter()
        .enumerate()
        .find(|(_, v)| !(0.0..=1.0).contains(&Dtype::to_f64(*v)));
    match bad {
        Some((index, v)) => Err(LossError::OutOfDomain {
            op,
            what,
            index,
            value: Dtype::to_f64(v),
        }),
        None => Ok(()),
    }
}

fn times<E: Float, D: Device<E>>(t: Flat<E, D>, w: &Option<Flat<E, D>>) -> Flat<E, D> {
    match w {
        Some(w) => &t * w,
        None => t,
    }
}

/// `min(x, 0) - log1p(exp(-|x|))`, PyTorch's stable `log_sigmoid` (off the tape).
fn log_sigmoid<E: Float, D: Device<E>>(x: &Flat<E, D>) -> Flat<E, D> {
    &x.clamp(f64::NEG_INFINITY, 0.0) - &(-&x.abs()).exp().log1p()
}

/// The per-element BCE of probabilities `x` against `y`, weighted, with
/// PyTorch's gradients for both.
fn bce<E: Float, D: Device<E>>(
    x: &Flat<E, D>,
    y: &Flat<E, D>,
    w: Option<Flat<E, D>>,
) -> Flat<E, D> {
    let (xd, yd) = (x.detach(), y.detach());
    let value = {
        let _guard = no_grad();
        let log_x = xd.log().clamp(-100.0, f64::INFINITY);
        let log_1mx = (-&xd).log1p().clamp(-100.0, f64::INFINITY);
        // PyTorch: (y - 1) * max(log1p(-x), -100) - y * max(log(x), -100).
        times(&(&yd.add_scalar(-1.0) * &log_1mx) - &(&yd * &log_x), &w)
    };
    let (need_x, need_y) = (x.needs_grad(), y.needs_grad());
    value.record(
        "binary_cross_entropy",
        &[x.tape_var(), y.tape_var()],
        [
            Some(xd.saved()),
            Some(yd.saved()),
            w.as_ref().map(Tensor::saved),
        ]
        .into_iter()
        .flatten()
        .collect(),
        move |g| {
            let g = Flat::<E, D>::from_raw(g.clone())?;
            let gx = need_x.then(|| {
                // g * (x - y) / max((1 - x) * x, eps), then the weight; PyTorch's
                // eps is the f32 constant 1e-12, also for f64.
                let floor = (&(-&xd).add_scalar(1.0) * &xd).clamp(EPSILON, f64::INFINITY);
                times(&(&g * &(&xd - &yd)) / &floor, &w).raw()
            });
            let gy = need_y.then(|| {
                // -logit(x) * g, then the weight.
                let logit = (&xd / &(-&xd).add_scalar(1.0)).log();
                times(&(-&logit) * &g, &w).raw()
            });
            Ok(vec![gx, gy])
        },
    )
}

/// The per-element BCE of logits `x` against `y`, weighted, with PyTorch's
/// gradients for both.
fn bce_logits<E: Float, D: Device<E>>(
    x: &Flat<E, D>,
    y: &Flat<E, D>,
    w: Option<Flat<E, D>>,
    pw: Option<Flat<E, D>>,
) -> Flat<E, D> {
    let (xd, yd) = (x.detach(), y.detach());
    let value = {
        let _guard = no_grad();
        let mut ls = log_sigmoid(&xd);
        if let Some(pw) = &pw {
            // log_weight = (pos_weight - 1) * y + 1
            ls = &ls * &(&pw.add_scalar(-1.0) * &yd).add_scalar(1.0);
        }
        // (1 - y) * x - log_weight * log_sigmoid(x)
        times(&(&(-&yd).add_scalar(1.0) * &xd) - &ls, &w)
    };
    let (need_x, need_y) = (x.needs_grad(), y.needs_grad());
    value.record(
        "binary_cross_entropy_with_logits",
        &[x.tape_var(), y.tape_var()],
        [
            Some(xd.saved()),
            Some(yd.saved()),
            w.as_ref().map(Tensor::saved),
            pw.as_ref().map(Tensor::saved),
        ]
        .into_iter()
        .flatten()
        .collect(),
        move |g| {
            let g = Flat::<E, D>::from_raw(g.clone())?;
            let gx = need_x.then(|| {
                let d = match &pw {
                    // t = pos_weight * y; (t + 1 - y) * sigmoid(x) - t
                    Some(pw) => {
                        let t = pw * &yd;
                        &(&(&t.add_scalar(1.0) - &yd) * &xd.sigmoid()) - &t
                    }
                    None => &xd.sigmoid() - &yd,
                };
                times(&d * &g, &w).raw()
            });
            let gy = need_y.then(|| {
                let d = match &pw {
                    // log_sigmoid(-x) - log_sigmoid(x) * pos_weight
                    Some(pw) => &log_sigmoid(&(-&xd)) - &(&log_sigmoid(&xd) * pw),
                    None => -&xd,
                };
                times(&d * &g, &w).raw()
            });
            Ok(vec![gx, gy])
        },
    )
}

/// Binary cross-entropy of probabilities, `-(y log x + (1 - y) log(1 - x))`
/// with each log clamped at -100, like `F.binary_cross_entropy(input, target,
/// reduction=...)`; for a `weight` use [`BceLoss`].
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::loss::{binary_cross_entropy, Sum};
/// let p = Tensor::<(C<2>,)>::from_vec(vec![0.5, 0.0], (C,)).unwrap();
/// let y = Tensor::<(C<2>,)>::from_vec(vec![1.0, 1.0], (C,)).unwrap();
/// let l = binary_cross_entropy(&p, &y, Sum).item();
/// assert!((l - (2f32.ln() + 100.0)).abs() < 1e-4);   // log 0 is clamped at -100
/// ```
///
/// # Panics
/// For a value outside `[0, 1]` or a `Dyn` size mismatch (see
/// [`try_binary_cross_entropy`]).
#[track_caller]
pub fn binary_cross_entropy<S: Shape, T: Shape, R: Reduction, E: Float, D: Device<E>>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E, D>,
    reduction: R,
) -> Tensor<R::Output<S>, E, D>
where
    S: LossShape<T, op::binary_cross_entropy>,
{
    ok(try_binary_cross_entropy(input, target, reduction))
}

/// Fallible [`binary_cross_entropy`].
///
/// # Errors
/// [`LossError::OutOfDomain`] for an input or target value outside `[0, 1]`
/// (or NaN); [`LossError::Core`] when a `Dyn` size of the target differs.
pub fn try_binary_cross_entropy<S: Shape, T: Shape, R: Reduction, E: Float, D: Device<E>>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E, D>,
    reduction: R,
) -> Result<Tensor<R::Output<S>, E, D>, LossError>
where
    S: LossShape<T, op::binary_cross_entropy>,
{
    BceLoss::<E, D, Mean>::default()
        .reduction(reduction)
        .try_forward(input, target)
}

/// Binary cross-entropy of logits, `-(y log sigmoid(x) + (1 - y) log(1 -
/// sigmoid(x)))` computed stably, like `F.binary_cross_entropy_with_logits`;
/// for `weight` and `pos_weight` use [`BceWithLogitsLoss`].
///
/// # Panics
/// For a `Dyn` size mismatch (see [`try_binary_cross_entropy_with_logits`]).
#[track_caller]
pub fn binary_cross_entropy_with_logits<S: Shape, T: Shape, R: Reduction, E: Float, D: Device<E>>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E, D>,
    reduction: R,
) -> Tensor<R::Output<S>, E, D>
where
    S: LossShape<T, op::binary_cross_entropy_with_logits>,
{
    ok(try_binary_cross_entropy_with_logits(
        input, target, reduction,
    ))
}

/// Fallible [`binary_cross_entropy_with_logits`].
///
/// # Errors
/// [`LossError::Core`] when a `Dyn` size of the target differs.
pub fn try_binary_cross_entropy_with_logits<
    S: Shape,
    T: Shape,
    R: Reduction,
    E: Float,
    D: Device<E>,
>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E, D>,
    reduction: R,
) -> Result<Tensor<R::Output<S>, E, D>, LossError>
where
    S: LossShape<T, op::binary_cross_entropy_with_logits>,
{
    BceWithLogitsLoss::<E, D, Mean>::default()
        .reduction(reduction)
        .try_forward(input, target)
}

/// [`binary_cross_entropy`] with its options, like `nn.BCELoss(weight=...,
/// reduction=...)`. The weight broadcasts against the input (a per-element
/// `[B, C]` weight, or a `[C]` one) and is a constant.
#[derive(Clone, Debug)]
pub struct BceLoss<E: Float = f32, D: Device<E> = Cpu, R: Reduction = Mean> {
    weight: Option<Weight<E, D>>,
    reduction: R,
}

impl<E: Float, D: Device<E>> BceLoss<E, D, Mean> {
    /// PyTorch's defaults: no weight, `mean`.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<E: Float, D: Device<E>, R: Reduction> Default for BceLoss<E, D, R> {
    fn default() -> Self {
        BceLoss {
            weight: None,
            reduction: R::default(),
        }
    }
}

impl<E: Float, D: Device<E>, R: Reduction> BceLoss<E, D, R> {
    /// A weight that broadcasts against the input (checked when the loss runs).
    pub fn weight<W: Shape>(mut self, weight: &Tensor<W, E, D>) -> Self {
        self.weight = Some(Weight::new(weight));
        self
    }

    /// The same loss with another reduction.
    pub fn reduction<R2: Reduction>(self, reduction: R2) -> BceLoss<E, D, R2> {
        BceLoss {
            weight: self.weight,
            reduction,
        }
    }

    /// The loss of probabilities `input` against `target` (both in `[0, 1]`).
    ///
    /// # Errors
    /// [`LossError::OutOfDomain`] for a value outside `[0, 1]`;
    /// [`LossError::InvalidOption`] for a weight that does not broadcast;
    /// [`LossError::Core`] when a `Dyn` size of the target differs.
    pub fn try_forward<S: Shape, T: Shape>(
        &self,
        input: &Tensor<S, E, D>,
        target: &Tensor<T, E, D>,
    ) -> Result<Tensor<R::Output<S>, E, D>, LossError>
    where
        S: LossShape<T, op::binary_cross_entropy>,
    {
        const OP: &str = "binary_cross_entropy";
        let _ = self.reduction;
        let dims = input.dims();
        let (x, y) = flat_pair(OP, input, target)?;
        check_unit(OP, "input", &x)?;
        check_unit(OP, "target", &y)?;
        let w = self
            .weight
            .as_ref()
            .map(|w| w.expand(OP, &dims))
            .transpose()?;
        reduce::<R, S, E, D>(OP, bce(&x, &y, w), &dims, None)
    }

    /// [`Self::try_forward`] that panics on its errors.
    ///
    /// # Panics
    /// Where [`Self::try_forward`] errs.
    #[track_caller]
    pub fn forward<S: Shape, T: Shape>(
        &self,
        input: &Tensor<S, E, D>,
        target: &Tensor<T, E, D>,
    ) -> Tensor<R::Output<S>, E, D>
    where
        S: LossShape<T, op::binary_cross_entropy>,
    {
        ok(self.try_forward(input, target))
    }
}

/// [`binary_cross_entropy_with_logits`] with its options, like
/// `nn.BCEWithLogitsLoss(weight=..., pos_weight=..., reduction=...)`:
///
/// `loss = w * ((1 - y) x - (1 + (pos_weight - 1) y) log sigmoid(x))`
///
/// Both weights broadcast against the input (`pos_weight` is usually `[C]`,
/// one per class of a multi-label output) and are constants.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::loss::BceWithLogitsLoss;
/// let x = Tensor::<(Dyn, C<2>)>::zeros_with((Dyn(3), C));
/// let y = Tensor::<(Dyn, C<2>)>::ones_with((Dyn(3), C));
/// let pw = Tensor::<(C<2>,)>::from_vec(vec![1.0, 3.0], (C,)).unwrap();
/// let l = BceWithLogitsLoss::new().pos_weight(&pw).forward(&x, &y).item();
/// assert!((l - 2.0 * 2f32.ln()).abs() < 1e-6);   // mean of ln 2 and 3 ln 2
/// ```
#[derive(Clone, Debug)]
pub struct BceWithLogitsLoss<E: Float = f32, D: Device<E> = Cpu, R: Reduction = Mean> {
    weight: Option<Weight<E, D>>,
    pos_weight: Option<Weight<E, D>>,
    reduction: R,
}

impl<E: Float, D: Device<E>> BceWithLogitsLoss<E, D, Mean> {
    /// PyTorch's defaults: no weights, `mean`.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<E: Float, D: Device<E>, R: Reduction> Default for BceWithLogitsLoss<E, D, R> {
    fn default() -> Self {
        BceWithLogitsLoss {
            weight: None,
            pos_weight: None,
            reduction: R::default(),
        }
    }
}

impl<E: Float, D: Device<E>, R: Reduction> BceWithLogitsLoss<E, D, R> {
    /// A weight of each element's loss, broadcasting against the input.
    pub fn weight<W: Shape>(mut self, weight: &Tensor<W, E, D>) -> Self {
        self.weight = Some(Weight::new(weight));
        self
    }

    /// A weight of the positive term, broadcasting against the input
    /// (usually `[C]`): above 1 raises recall, below 1 precision.
    pub fn pos_weight<W: Shape>(mut self, pos_weight: &Tensor<W, E, D>) -> Self {
        self.pos_weight = Some(Weight::new(pos_weight));
        self
    }

    /// The same loss with another reduction.
    pub fn reduction<R2: Reduction>(self, reduction: R2) -> BceWithLogitsLoss<E, D, R2> {
        BceWithLogitsLoss {
            weight: self.weight,
            pos_weight: self.pos_weight,
            reduction,
        }
    }

    /// The loss of logits `input` against targets in `[0, 1]`.
    ///
    /// # Errors
    /// [`LossError::InvalidOption`] for a weight that does not broadcast;
    /// [`LossError::Core`] when a `Dyn` size of the target differs.
    pub fn try_forward<S: Shape, T: Shape>(
        &self,
        input: &Tensor<S, E, D>,
        target: &Tensor<T, E, D>,
    ) -> Result<Tensor<R::Output<S>, E, D>, LossError>
    where
        S: LossShape<T, op::binary_cross_entropy_with_logits>,
    {
        const OP: &str = "binary_cross_entropy_with_logits";
        let _ = self.reduction;
        let dims = input.dims();
        let (x, y) = flat_pair(OP, input, target)?;
        let w = self
            .weight
            .as_ref()
            .map(|w| w.expand(OP, &dims))
            .transpose()?;
        let pw = self
            .pos_weight
            .as_ref()
            .map(|w| w.expand(OP, &dims))
            .transpose()?;
        reduce::<R, S, E, D>(OP, bce_logits(&x, &y, w, pw), &dims, None)
    }

    /// [`Self::try_forward`] that panics on its errors.
    ///
    /// # Panics
    /// Where [`Self::try_forward`] errs.
    #[track_caller]
    pub fn forward<S: Shape, T: Shape>(
        &self,
        input: &Tensor<S, E, D>,
        target: &Tensor<T, E, D>,
    ) -> Tensor<R::Output<S>, E, D>
    where
        S: LossShape<T, op::binary_cross_entropy_with_logits>,
    {
        ok(self.try_forward(input, target))
    }
}
