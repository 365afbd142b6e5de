//! Classification losses over a class axis (axis 1, as in PyTorch):
//! [`cross_entropy`] with class indices (`ignore_index`, `label_smoothing`,
//! class `weight`), [`cross_entropy_probs`] with class probabilities, and
//! [`nll_loss`] on log-probabilities. Inputs are `[B, C]` or `[B, C, d1, ...]`,
//! or one unbatched sample `[C]` as in PyTorch ([`ClassInput`]); index
//! targets are the input without its class axis (`[B]`, `[B, d1, ...]`, `[]`
//! for `[C]`), in `i64`.
//!
//! The class indices are read on the host to check them (PyTorch checks them
//! too), so an index outside `0..C` other than `ignore_index` is an error
//! value, never a wild read.

use super::op;
use super::{
    check_dims, ok, reduce, ClassInput, ClassTargets, ClassWeight, LossError, LossShape, Mean,
    Reduction,
};
use forma_core::device::Device;
use forma_core::{Dim, Dtype, Dyn, Float, One, Shape, Tensor};
use forma_cpu::Cpu;
use std::marker::PhantomData;

/// PyTorch's default `ignore_index`.
const IGNORE_INDEX: i64 = -100;

/// The options shared by the class losses.
#[derive(Clone, Copy, Debug)]
struct Options<'a, E: Float, D: Device<E>> {
    weight: Option<&'a Tensor<(Dyn,), E, D>>,
    ignore_index: i64,
    label_smoothing: f64,
}

/// The input's sizes as `(batch, classes, rest)` and the sizes the target
/// (and the unreduced loss) must have: the input's without axis 1.
fn split_dims(dims: &[usize]) -> (usize, usize, usize, Vec<usize>) {
    if let [classes] = dims {
        // One sample's scores: a batch of one whose targets have no dims.
        return (1, *classes, 1, vec![]);
    }
    let rest: usize = dims[2..].iter().product();
    let tdims = std::iter::once(dims[0])
        .chain(dims[2..].iter().copied())
        .collect();
    (dims[0], dims[1], rest, tdims)
}

/// Checks the options against `classes`; returns the class weights on the host.
fn check_options<E: Float, D: Device<E>>(
    op: &'static str,
    classes: usize,
    o: &Options<'_, E, D>,
) -> Result<Option<Vec<f64>>, LossError> {
    let ls = o.label_smoothing;
    if !(0.0..=1.0).contains(&ls) {
        return Err(LossError::option(
            op,
            format!("label_smoothing must be between 0.0 and 1.0, got {ls}"),
        ));
    }
    let Some(w) = o.weight else { return Ok(None) };
    if w.numel() != classes {
        return Err(LossError::option(
            op,
            format!(
                "the class weight must have one value per class ({classes}), but has {}",
                w.numel()
            ),
        ));
    }
    Ok(Some(
        w.try_to_vec()?.into_iter().map(Dtype::to_f64).collect(),
    ))
}

/// The class weight viewed as `[1, C, 1]`, to scale every class of `[B, C, d]`.
fn class_weight<E: Float, D: Device<E>>(
    w: &Tensor<(Dyn,), E, D>,
) -> Result<Tensor<(One, Dyn, One), E, D>, LossError> {
    Ok(w.try_reshape_to((One, Dyn(w.numel()), One))?)
}

/// NLL (or, with `log_softmax`, cross-entropy) with class-index targets;
/// `Tg` is the shape of the unreduced loss (the input without its class axis).
fn index_loss<R: Reduction, S: Shape, Tg: Shape, T: Shape, E: Float, D: Device<E>>(
    op: &'static str,
    input: &Tensor<S, E, D>,
    target: &Tensor<T, i64, D>,
    log_softmax: bool,
    o: Options<'_, E, D>,
    reduction: R,
) -> Result<Tensor<R::Output<Tg>, E, D>, LossError> {
    let _ = reduction;
    let (n, c, d, tdims) = split_dims(&input.dims());
    check_dims(op, &tdims, &target.dims())?;
    let weights = check_options(op, c, &o)?;
    let dev = input.device();
    let x3 = input.try_reshape_to((Dyn(n), Dyn(c), Dyn(d)))?;
    let logp = if log_softmax {
        x3.log_softmax::<1>()
    } else {
        x3
    };

    // Per target: the class to pick (0 for an ignored one, masked below), its
    // weight (0 when ignored) and whether it is ignored.
    let classes = target.try_to_vec()?;
    let m = classes.len();
    let (mut idx, mut wt, mut ignored) = (
        Vec::with_capacity(m),
        Vec::with_capacity(m),
        Vec::with_capacity(m),
    );
    let mut total = 0.0;
    for &k in &classes {
        if k == o.ignore_index {
            idx.push(0);
            wt.push(E::from_f64(0.0));
            ignored.push(true);
        } else if k < 0 || k as usize >= c {
            return Err(LossError::ClassOutOfRange {
                op,
                index: k,
                classes: c,
                ignore_index: o.ignore_index,
            });
        } else {
            let w = weights.as_ref().map_or(1.0, |w| w[k as usize]);
            idx.push(k);
            wt.push(E::from_f64(w));
            ignored.push(false);
            total += w;
        }
    }
    let any_ignored = ignored.iter().any(|&i| i);

    let idx = Tensor::<(Dyn, Dyn, Dyn), i64, D>::from_vec_on(idx, (Dyn(n), Dyn(1), Dyn(d)), dev)?;
    let picked = logp
        .try_gather::<1, (Dyn, Dyn, Dyn)>(&idx)?
        .try_reshape_to((Dyn(m),))?;
    let mut per = -&picked;
    if weights.is_some() {
        per = &per * &Tensor::from_vec_on(wt, (Dyn(m),), dev)?;
    }
    let mask = if any_ignored {
        Some(Tensor::<(Dyn,), bool, D>::from_vec_on(
            ignored,
            (Dyn(m),),
            dev,
        )?)
    } else {
        None
    };
    if let Some(mask) = &mask {
        // A fill rather than the zero weight, so an ignored row holding -inf
        // gives 0 and not 0 * inf.
        per = per.masked_fill(mask, 0.0);
    }
    if o.label_smoothing > 0.0 {
        // PyTorch: (1 - ls) * nll + ls / C * (-sum_c w_c log p_c), both parts
        // zero where ignored and divided by the same total weight for `mean`.
        let ls = o.label_smoothing;
        let scaled = match o.weight {
            Some(w) => &logp * &class_weight(w)?,
            None => logp.clone(),
        };
        let mut smooth = -&scaled.sum::<1>().try_reshape_to((Dyn(m),))?;
        if let Some(mask) = &mask {
            smooth = smooth.masked_fill(mask, 0.0);
        }
        per = &per.mul_scalar(1.0 - ls) + &smooth.mul_scalar(ls / c as f64);
    }
    reduce::<R, Tg, E, D>(op, per, &tdims, Some(total))
}

/// Cross-entropy with class-probability targets of the input's shape; `Tg`
/// is the shape of the unreduced loss (the input without its class axis).
fn prob_loss<R: Reduction, S: Shape, Tg: Shape, T: Shape, E: Float, D: Device<E>>(
    op: &'static str,
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E, D>,
    o: Options<'_, E, D>,
    reduction: R,
) -> Result<Tensor<R::Output<Tg>, E, D>, LossError> {
    let _ = reduction;
    if o.ignore_index >= 0 {
        return Err(LossError::option(
            op,
            "ignore_index is not supported with class-probability targets",
        ));
    }
    let dims = input.dims();
    check_dims(op, &dims, &target.dims())?;
    let (n, c, d, tdims) = split_dims(&dims);
    check_options(op, c, &o)?;
    let logp = input
        .try_reshape_to((Dyn(n), Dyn(c), Dyn(d)))?
        .log_softmax::<1>();
    let mut t = target.try_reshape_to((Dyn(n), Dyn(c), Dyn(d)))?;
    let ls = o.label_smoothing;
    if ls > 0.0 {
        t = t.mul_scalar(1.0 - ls).add_scalar(ls / c as f64);
    }
    let mut prod = &logp * &t;
    if let Some(w) = o.weight {
        prod = &prod * &class_weight(w)?;
    }
    let per = -&prod.sum::<1>().try_reshape_to((Dyn(n * d),))?;
    // PyTorch's mean divides by the number of samples, `numel / C`.
    reduce::<R, Tg, E, D>(op, per, &tdims, Some((n * d) as f64))
}

/// Cross-entropy of logits `[B, C, ...]` against class indices `[B, ...]`,
/// like `F.cross_entropy(input, target, reduction=...)` with PyTorch's
/// defaults (no weight, `ignore_index=-100`, no label smoothing); for those
/// options use [`CrossEntropyLoss`].
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::loss::{cross_entropy, Mean};
/// let logits = Tensor::<(Dyn, C<2>)>::from_vec(vec![0.0, 0.0, 0.0, 0.0], (Dyn(2), C)).unwrap();
/// let target = Tensor::<(Dyn,), i64>::from_vec(vec![1, 0], (Dyn(2),)).unwrap();
/// let loss = cross_entropy(&logits, &target, Mean);
/// assert!((loss.item() - 2f32.ln()).abs() < 1e-6);
/// ```
///
/// # Panics
/// For a class index outside `0..C` (other than -100) or a `Dyn` size of the
/// target that differs (see [`try_cross_entropy`]).
#[track_caller]
pub fn cross_entropy<S: Shape, T: Shape, R: Reduction, E: Float, D: Device<E>>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, i64, D>,
    reduction: R,
) -> Tensor<R::Output<<S as ClassTargets>::Targets>, E, D>
where
    S: ClassInput<op::cross_entropy>,
    <S as ClassTargets>::Targets: LossShape<T, op::cross_entropy>,
{
    ok(try_cross_entropy(input, target, reduction))
}

/// Fallible [`cross_entropy`].
///
/// # Errors
/// [`LossError::ClassOutOfRange`] for a class index outside `0..C` other
/// than -100; [`LossError::Core`] when a `Dyn` size of the target differs.
pub fn try_cross_entropy<S: Shape, T: Shape, R: Reduction, E: Float, D: Device<E>>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, i64, D>,
    reduction: R,
) -> Result<Tensor<R::Output<<S as ClassTargets>::Targets>, E, D>, LossError>
where
    S: ClassInput<op::cross_entropy>,
    <S as ClassTargets>::Targets: LossShape<T, op::cross_entropy>,
{
    CrossEntropyLoss::<E, D, Mean>::default()
        .reduction(reduction)
        .try_forward(input, target)
}

/// Cross-entropy of logits against class probabilities of the same shape,
/// like `F.cross_entropy(input, probs)`; differentiable in both.
///
/// # Panics
/// If a `Dyn` size of the target differs (see [`try_cross_entropy_probs`]).
#[track_caller]
pub fn cross_entropy_probs<S: Shape, T: Shape, R: Reduction, E: Float, D: Device<E>>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E, D>,
    reduction: R,
) -> Tensor<R::Output<<S as ClassTargets>::Targets>, E, D>
where
    S: ClassInput<op::cross_entropy> + LossShape<T, op::cross_entropy>,
{
    ok(try_cross_entropy_probs(input, target, reduction))
}

/// Fallible [`cross_entropy_probs`].
///
/// # Errors
/// [`LossError::Core`] when a `Dyn` size of the target differs.
pub fn try_cross_entropy_probs<S: Shape, T: Shape, R: Reduction, E: Float, D: Device<E>>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E, D>,
    reduction: R,
) -> Result<Tensor<R::Output<<S as ClassTargets>::Targets>, E, D>, LossError>
where
    S: ClassInput<op::cross_entropy> + LossShape<T, op::cross_entropy>,
{
    CrossEntropyLoss::<E, D, Mean>::default()
        .reduction(reduction)
        .try_forward_probs(input, target)
}

/// Negative log-likelihood of log-probabilities `[B, C, ...]` at class
/// indices `[B, ...]`, like `F.nll_loss(input, target, reduction=...)` with
/// PyTorch's defaults; for a class weight or another `ignore_index` use
/// [`NllLoss`].
///
/// # Panics
/// As [`cross_entropy`] (see [`try_nll_loss`]).
#[track_caller]
pub fn nll_loss<S: Shape, T: Shape, R: Reduction, E: Float, D: Device<E>>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, i64, D>,
    reduction: R,
) -> Tensor<R::Output<<S as ClassTargets>::Targets>, E, D>
where
    S: ClassInput<op::nll_loss>,
    <S as ClassTargets>::Targets: LossShape<T, op::nll_loss>,
{
    ok(try_nll_loss(input, target, reduction))
}

/// Fallible [`nll_loss`].
///
/// # Errors
/// As [`try_cross_entropy`].
pub fn try_nll_loss<S: Shape, T: Shape, R: Reduction, E: Float, D: Device<E>>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, i64, D>,
    reduction: R,
) -> Result<Tensor<R::Output<<S as ClassTargets>::Targets>, E, D>, LossError>
where
    S: ClassInput<op::nll_loss>,
    <S as ClassTargets>::Targets: LossShape<T, op::nll_loss>,
{
    NllLoss::<E, D, Mean>::default()
        .reduction(reduction)
        .try_forward(input, target)
}

/// Cross-entropy with its options, like `nn.CrossEntropyLoss(weight=...,
/// ignore_index=..., reduction=..., label_smoothing=...)`: built with
/// PyTorch's defaults by [`CrossEntropyLoss::new`], changed by the builder
/// methods.
///
/// With class indices, `mean` divides by the total weight of the targets
/// that are not ignored (their count, without a weight), as PyTorch does; an
/// all-ignored batch gives NaN. With probabilities, `mean` divides by the
/// number of samples.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::loss::{CrossEntropyLoss, Sum};
/// let logits = Tensor::<(Dyn, C<3>)>::zeros_with((Dyn(3), C));
/// let target = Tensor::<(Dyn,), i64>::from_vec(vec![2, -1, 0], (Dyn(3),)).unwrap();
/// let w = Tensor::<(C<3>,)>::from_vec(vec![1.0, 1.0, 2.0], (C,)).unwrap();
/// let loss = CrossEntropyLoss::new().weight(&w).ignore_index(-1).reduction(Sum);
/// let l = loss.forward(&logits, &target).item();
/// assert!((l - 3.0 * 3f32.ln()).abs() < 1e-5);   // 2 ln 3 + 1 ln 3, the -1 skipped
/// ```
#[derive(Clone, Debug)]
pub struct CrossEntropyLoss<E: Float = f32, D: Device<E> = Cpu, R: Reduction = Mean, K: Dim = Dyn> {
    weight: Option<Tensor<(Dyn,), E, D>>,
    ignore_index: i64,
    label_smoothing: f64,
    reduction: R,
    /// The weight's length (`Dyn` without a weight), checked against the
    /// input's classes at compile time where both are static.
    classes: PhantomData<K>,
}

impl<E: Float, D: Device<E>> CrossEntropyLoss<E, D, Mean> {
    /// PyTorch's defaults: no weight, `ignore_index=-100`, no smoothing, `mean`.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<E: Float, D: Device<E>, R: Reduction> Default for CrossEntropyLoss<E, D, R> {
    fn default() -> Self {
        CrossEntropyLoss {
            weight: None,
            ignore_index: IGNORE_INDEX,
            label_smoothing: 0.0,
            reduction: R::default(),
            classes: PhantomData,
        }
    }
}

impl<E: Float, D: Device<E>, R: Reduction, K: Dim> CrossEntropyLoss<E, D, R, K> {
    /// A weight per class (`[C]`, a constant: no gradient reaches it). Its
    /// length is part of the loss's type: a static one that differs from a
    /// static class axis of the input is a compile error, a `Dyn` one an
    /// error when the loss runs.
    pub fn weight<W: Dim>(self, weight: &Tensor<(W,), E, D>) -> CrossEntropyLoss<E, D, R, W> {
        CrossEntropyLoss {
            weight: Some(weight.detach().flatten_all()),
            ignore_index: self.ignore_index,
            label_smoothing: self.label_smoothing,
            reduction: self.reduction,
            classes: PhantomData,
        }
    }

    /// The target class to skip (default -100); it adds nothing to the loss
    /// nor to the mean's denominator.
    pub fn ignore_index(mut self, ignore_index: i64) -> Self {
        self.ignore_index = ignore_index;
        self
    }

    /// Mixes the target with the uniform distribution: `(1 - p) * target + p / C`
    /// (default 0; must be in `[0, 1]`).
    pub fn label_smoothing(mut self, p: f64) -> Self {
        self.label_smoothing = p;
        self
    }

    /// The same loss with another reduction.
    pub fn reduction<R2: Reduction>(self, reduction: R2) -> CrossEntropyLoss<E, D, R2, K> {
        CrossEntropyLoss {
            weight: self.weight,
            ignore_index: self.ignore_index,
            label_smoothing: self.label_smoothing,
            reduction,
            classes: PhantomData,
        }
    }

    fn options(&self) -> Options<'_, E, D> {
        Options {
            weight: self.weight.as_ref(),
            ignore_index: self.ignore_index,
            label_smoothing: self.label_smoothing,
        }
    }

    /// The loss of logits `[B, C, ...]` at class indices `[B, ...]`.
    ///
    /// # Errors
    /// [`LossError::ClassOutOfRange`] for a class index outside `0..C` that is
    /// not `ignore_index`; [`LossError::InvalidOption`] for a label smoothing
    /// outside `[0, 1]` or a weight without one value per class;
    /// [`LossError::Core`] when a `Dyn` size of the target differs.
    pub fn try_forward<S: Shape, T: Shape>(
        &self,
        input: &Tensor<S, E, D>,
        target: &Tensor<T, i64, D>,
    ) -> Result<Tensor<R::Output<<S as ClassTargets>::Targets>, E, D>, LossError>
    where
        S: ClassInput<op::cross_entropy>,
        <S as ClassTargets>::Classes: ClassWeight<K, op::cross_entropy>,
        <S as ClassTargets>::Targets: LossShape<T, op::cross_entropy>,
    {
        index_loss::<R, S, <S as ClassTargets>::Targets, T, E, D>(
            "cross_entropy",
            input,
            target,
            true,
            self.options(),
            self.reduction,
        )
    }

    /// [`Self::try_forward`] that panics on its errors.
    ///
    /// # Panics
    /// Where [`Self::try_forward`] errs.
    #[track_caller]
    pub fn forward<S: Shape, T: Shape>(
        &self,
        input: &Tensor<S, E, D>,
        target: &Tensor<T, i64, D>,
    ) -> Tensor<R::Output<<S as ClassTargets>::Targets>, E, D>
    where
        S: ClassInput<op::cross_entropy>,
        <S as ClassTargets>::Classes: ClassWeight<K, op::cross_entropy>,
        <S as ClassTargets>::Targets: LossShape<T, op::cross_entropy>,
    {
        ok(self.try_forward(input, target))
    }

    /// The loss of one unbatched sample, logits `[C]` at a class index `[]`
    /// (PyTorch's `cross_entropy` on a 1-d input): a scalar for every
    /// reduction, with the options' meaning unchanged (a weighted mean of
    /// one sample is its loss; an ignored one gives NaN with `Mean`, as in
    /// PyTorch). [`Self::forward`] takes `[C]` too; this form only says so in
    /// its types.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::loss::{CrossEntropyLoss, NoReduction};
    /// let logits = Tensor::<(C<3>,)>::from_vec(vec![0.0, 0.0, 0.0], (C,)).unwrap();
    /// let target = Tensor::<(), i64>::from_vec(vec![2], ()).unwrap();
    /// let loss = CrossEntropyLoss::new().reduction(NoReduction).forward_unbatched(&logits, &target);
    /// assert!((loss.item() - 3f32.ln()).abs() < 1e-6);
    /// ```
    ///
    /// # Errors
    /// As [`Self::try_forward`].
    pub fn try_forward_unbatched<Cd: Dim>(
        &self,
        input: &Tensor<(Cd,), E, D>,
        target: &Tensor<(), i64, D>,
    ) -> Result<Tensor<R::Output<()>, E, D>, LossError>
    where
        Cd: ClassWeight<K, op::cross_entropy>,
    {
        self.try_forward(input, target)
    }

    /// [`Self::try_forward_unbatched`] that panics on its errors.
    ///
    /// # Panics
    /// Where [`Self::try_forward_unbatched`] errs.
    #[track_caller]
    pub fn forward_unbatched<Cd: Dim>(
        &self,
        input: &Tensor<(Cd,), E, D>,
        target: &Tensor<(), i64, D>,
    ) -> Tensor<R::Output<()>, E, D>
    where
        Cd: ClassWeight<K, op::cross_entropy>,
    {
        ok(self.try_forward_unbatched(input, target))
    }

    /// The loss of logits against class probabilities of the same shape
    /// (differentiable in both).
    ///
    /// # Errors
    /// [`LossError::InvalidOption`] for a label smoothing outside `[0, 1]`, a
    /// weight without one value per class, or a non-negative `ignore_index`
    /// (PyTorch rejects it with probabilities); [`LossError::Core`] when a
    /// `Dyn` size of the target differs.
    pub fn try_forward_probs<S: Shape, T: Shape>(
        &self,
        input: &Tensor<S, E, D>,
        target: &Tensor<T, E, D>,
    ) -> Result<Tensor<R::Output<<S as ClassTargets>::Targets>, E, D>, LossError>
    where
        S: ClassInput<op::cross_entropy> + LossShape<T, op::cross_entropy>,
        <S as ClassTargets>::Classes: ClassWeight<K, op::cross_entropy>,
    {
        prob_loss::<R, S, <S as ClassTargets>::Targets, T, E, D>(
            "cross_entropy",
            input,
            target,
            self.options(),
            self.reduction,
        )
    }

    /// [`Self::try_forward_probs`] that panics on its errors.
    ///
    /// # Panics
    /// Where [`Self::try_forward_probs`] errs.
    #[track_caller]
    pub fn forward_probs<S: Shape, T: Shape>(
        &self,
        input: &Tensor<S, E, D>,
        target: &Tensor<T, E, D>,
    ) -> Tensor<R::Output<<S as ClassTargets>::Targets>, E, D>
    where
        S: ClassInput<op::cross_entropy> + LossShape<T, op::cross_entropy>,
        <S as ClassTargets>::Classes: ClassWeight<K, op::cross_entropy>,
    {
        ok(self.try_forward_probs(input, target))
    }
}

/// NLL loss with its options, like `nn.NLLLoss(weight=..., ignore_index=...,
/// reduction=...)`; `mean` divides by the total weight of the targets that are
/// not ignored.
#[derive(Clone, Debug)]
pub struct NllLoss<E: Float = f32, D: Device<E> = Cpu, R: Reduction = Mean, K: Dim = Dyn> {
    weight: Option<Tensor<(Dyn,), E, D>>,
    ignore_index: i64,
    reduction: R,
    /// The weight's length (`Dyn` without a weight), checked against the
    /// input's classes at compile time where both are static.
    classes: PhantomData<K>,
}

impl<E: Float, D: Device<E>> NllLoss<E, D, Mean> {
    /// PyTorch's defaults: no weight, `ignore_index=-100`, `mean`.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<E: Float, D: Device<E>, R: Reduction> Default for NllLoss<E, D, R> {
    fn default() -> Self {
        NllLoss {
            weight: None,
            ignore_index: IGNORE_INDEX,
            reduction: R::default(),
            classes: PhantomData,
        }
    }
}

impl<E: Float, D: Device<E>, R: Reduction, K: Dim> NllLoss<E, D, R, K> {
    /// A weight per class (`[C]`, a constant: no gradient reaches it). Its
    /// length is part of the loss's type: a static one that differs from a
    /// static class axis of the input is a compile error, a `Dyn` one an
    /// error when the loss runs.
    pub fn weight<W: Dim>(self, weight: &Tensor<(W,), E, D>) -> NllLoss<E, D, R, W> {
        NllLoss {
            weight: Some(weight.detach().flatten_all()),
            ignore_index: self.ignore_index,
            reduction: self.reduction,
            classes: PhantomData,
        }
    }

    /// The target class to skip (default -100).
    pub fn ignore_index(mut self, ignore_index: i64) -> Self {
        self.ignore_index = ignore_index;
        self
    }

    /// The same loss with another reduction.
    pub fn reduction<R2: Reduction>(self, reduction: R2) -> NllLoss<E, D, R2, K> {
        NllLoss {
            weight: self.weight,
            ignore_index: self.ignore_index,
            reduction,
            classes: PhantomData,
        }
    }

    /// The loss of log-probabilities `[B, C, ...]` at class indices `[B, ...]`.
    ///
    /// # Errors
    /// As [`CrossEntropyLoss::try_forward`].
    pub fn try_forward<S: Shape, T: Shape>(
        &self,
        input: &Tensor<S, E, D>,
        target: &Tensor<T, i64, D>,
    ) -> Result<Tensor<R::Output<<S as ClassTargets>::Targets>, E, D>, LossError>
    where
        S: ClassInput<op::nll_loss>,
        <S as ClassTargets>::Classes: ClassWeight<K, op::nll_loss>,
        <S as ClassTargets>::Targets: LossShape<T, op::nll_loss>,
    {
        let o = Options {
            weight: self.weight.as_ref(),
            ignore_index: self.ignore_index,
            label_smoothing: 0.0,
        };
        index_loss::<R, S, <S as ClassTargets>::Targets, T, E, D>(
            "nll_loss",
            input,
            target,
            false,
            o,
            self.reduction,
        )
    }

    /// [`Self::try_forward`] that panics on its errors.
    ///
    /// # Panics
    /// Where [`Self::try_forward`] errs.
    #[track_caller]
    pub fn forward<S: Shape, T: Shape>(
        &self,
        input: &Tensor<S, E, D>,
        target: &Tensor<T, i64, D>,
    ) -> Tensor<R::Output<<S as ClassTargets>::Targets>, E, D>
    where
        S: ClassInput<op::nll_loss>,
        <S as ClassTargets>::Classes: ClassWeight<K, op::nll_loss>,
        <S as ClassTargets>::Targets: LossShape<T, op::nll_loss>,
    {
        ok(self.try_forward(input, target))
    }
    /// The loss of one unbatched sample, log-probabilities `[C]` at a class
    /// index `[]`, like PyTorch's `nll_loss` on a 1-d input: a scalar for
    /// every reduction ([`Self::forward`] on a `[C]` input).
    ///
    /// # Errors
    /// As [`Self::try_forward`].
    pub fn try_forward_unbatched<Cd: Dim>(
        &self,
        input: &Tensor<(Cd,), E, D>,
        target: &Tensor<(), i64, D>,
    ) -> Result<Tensor<R::Output<()>, E, D>, LossError>
    where
        Cd: ClassWeight<K, op::nll_loss>,
    {
        self.try_forward(input, target)
    }

    /// [`Self::try_forward_unbatched`] that panics on its errors.
    ///
    /// # Panics
    /// Where [`Self::try_forward_unbatched`] errs.
    #[track_caller]
    pub fn forward_unbatched<Cd: Dim>(
        &self,
        input: &Tensor<(Cd,), E, D>,
        target: &Tensor<(), i64, D>,
    ) -> Tensor<R::Output<()>, E, D>
    where
        Cd: ClassWeight<K, op::nll_loss>,
    {
        ok(self.try_forward_unbatched(input, target))
    }
}
