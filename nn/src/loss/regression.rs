//! Regression losses on elementwise differences: [`mse_loss`], [`l1_loss`],
//! [`smooth_l1_loss`] and [`huber_loss`], differentiable in the input and the
//! target, with PyTorch's conventions at the kinks (`|x - y| == beta` takes
//! the linear branch, whose gradient there equals the quadratic one's; the
//! gradient of `|d|` at 0 is 0).

use super::op;
use super::{flat_pair, ok, reduce, LossError, LossShape, Mean, Reduction};
use forma_core::device::Device;
use forma_core::ops::cmp::where_cond;
use forma_core::shape::op::SameDtype;
use forma_core::{Dyn, Float, Shape, Tensor};

/// Mean squared error `(x - y)^2`, like `F.mse_loss(input, target, reduction=...)`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::loss::{mse_loss, Mean, NoReduction};
/// let x = Tensor::<(C<2>,)>::from_vec(vec![1.0, 2.0], (C,)).unwrap();
/// let y = Tensor::<(C<2>,)>::from_vec(vec![0.0, 4.0], (C,)).unwrap();
/// assert_eq!(mse_loss(&x, &y, Mean).item(), 2.5);
/// assert_eq!(mse_loss(&x, &y, NoReduction).to_vec(), [1.0, 4.0]);
/// ```
///
/// # Panics
/// If a `Dyn` size of the target differs from the input's (see [`try_mse_loss`]).
#[track_caller]
pub fn mse_loss<
    S: Shape,
    T: Shape,
    R: Reduction,
    E: Float,
    D: Device<E>,
    E2: SameDtype<E, op::mse_loss>,
>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E2, D>,
    reduction: R,
) -> Tensor<R::Output<S>, E, D>
where
    S: LossShape<T, op::mse_loss>,
{
    ok(try_mse_loss(input, target, reduction))
}

/// Fallible [`mse_loss`].
///
/// # Errors
/// [`LossError::Core`] when a `Dyn` size of the target differs from the input's.
pub fn try_mse_loss<
    S: Shape,
    T: Shape,
    R: Reduction,
    E: Float,
    D: Device<E>,
    E2: SameDtype<E, op::mse_loss>,
>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E2, D>,
    reduction: R,
) -> Result<Tensor<R::Output<S>, E, D>, LossError>
where
    S: LossShape<T, op::mse_loss>,
{
    let target = E2::same(target);
    let _ = reduction;
    let (x, y) = flat_pair("mse_loss", input, target)?;
    reduce::<R, S, E, D>("mse_loss", (&x - &y).square(), &input.dims(), None)
}

/// Mean absolute error `|x - y|`, like `F.l1_loss`.
///
/// # Panics
/// If a `Dyn` size of the target differs from the input's (see [`try_l1_loss`]).
#[track_caller]
pub fn l1_loss<
    S: Shape,
    T: Shape,
    R: Reduction,
    E: Float,
    D: Device<E>,
    E2: SameDtype<E, op::l1_loss>,
>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E2, D>,
    reduction: R,
) -> Tensor<R::Output<S>, E, D>
where
    S: LossShape<T, op::l1_loss>,
{
    ok(try_l1_loss(input, target, reduction))
}

/// Fallible [`l1_loss`].
///
/// # Errors
/// [`LossError::Core`] when a `Dyn` size of the target differs from the input's.
pub fn try_l1_loss<
    S: Shape,
    T: Shape,
    R: Reduction,
    E: Float,
    D: Device<E>,
    E2: SameDtype<E, op::l1_loss>,
>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E2, D>,
    reduction: R,
) -> Result<Tensor<R::Output<S>, E, D>, LossError>
where
    S: LossShape<T, op::l1_loss>,
{
    let target = E2::same(target);
    let _ = reduction;
    let (x, y) = flat_pair("l1_loss", input, target)?;
    reduce::<R, S, E, D>("l1_loss", (&x - &y).abs(), &input.dims(), None)
}

/// `0.5 d^2 * scale` where `|d| < cut`, else `(|d| - 0.5 cut) * slope`: the
/// shared shape of smooth L1 (`scale = 1 / beta`, `slope = 1`) and Huber
/// (`scale = 1`, `slope = delta`), written in PyTorch's order of operations.
fn piecewise<E: Float, D: Device<E>>(
    d: &Tensor<(Dyn,), E, D>,
    cut: f64,
    quadratic: impl Fn(Tensor<(Dyn,), E, D>) -> Tensor<(Dyn,), E, D>,
    linear: impl Fn(Tensor<(Dyn,), E, D>) -> Tensor<(Dyn,), E, D>,
) -> Tensor<(Dyn,), E, D> {
    let a = d.abs();
    let cut_t = Tensor::<(), E, D>::full_on((), E::from_f64(cut), d.device());
    let inside = a.lt(&cut_t);
    where_cond(
        &inside,
        &quadratic(d.square().mul_scalar(0.5)),
        &linear(a.add_scalar(-0.5 * cut)),
    )
}

/// Smooth L1: `0.5 (x - y)^2 / beta` where `|x - y| < beta`, else
/// `|x - y| - 0.5 beta`, like `F.smooth_l1_loss(..., beta=beta)` (PyTorch's
/// default `beta` is 1). `beta = 0` is [`l1_loss`].
///
/// # Panics
/// If `beta` is negative or a `Dyn` size differs (see [`try_smooth_l1_loss`]).
#[track_caller]
pub fn smooth_l1_loss<
    S: Shape,
    T: Shape,
    R: Reduction,
    E: Float,
    D: Device<E>,
    E2: SameDtype<E, op::smooth_l1_loss>,
>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E2, D>,
    beta: f64,
    reduction: R,
) -> Tensor<R::Output<S>, E, D>
where
    S: LossShape<T, op::smooth_l1_loss>,
{
    ok(try_smooth_l1_loss(input, target, beta, reduction))
}

/// Fallible [`smooth_l1_loss`].
///
/// # Errors
/// [`LossError::InvalidOption`] for a negative (or NaN) `beta`;
/// [`LossError::Core`] when a `Dyn` size of the target differs.
pub fn try_smooth_l1_loss<
    S: Shape,
    T: Shape,
    R: Reduction,
    E: Float,
    D: Device<E>,
    E2: SameDtype<E, op::smooth_l1_loss>,
>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E2, D>,
    beta: f64,
    reduction: R,
) -> Result<Tensor<R::Output<S>, E, D>, LossError>
where
    S: LossShape<T, op::smooth_l1_loss>,
{
    let target = E2::same(target);
    const OP: &str = "smooth_l1_loss";
    if beta.is_nan() || beta < 0.0 {
        return Err(LossError::option(
            OP,
            format!("beta must be non-negative, got {beta}"),
        ));
    }
    if beta == 0.0 {
        // PyTorch's special case (the quadratic branch would divide by
        // zero): the L1 loss.
        let _ = reduction;
        let (x, y) = flat_pair(OP, input, target)?;
        return reduce::<R, S, E, D>(OP, (&x - &y).abs(), &input.dims(), None);
    }
    let (x, y) = flat_pair(OP, input, target)?;
    let per = piecewise(&(&x - &y), beta, |q| q.div_scalar(beta), |l| l);
    reduce::<R, S, E, D>(OP, per, &input.dims(), None)
}

/// Huber loss: `0.5 (x - y)^2` where `|x - y| < delta`, else
/// `delta (|x - y| - 0.5 delta)`, like `F.huber_loss(..., delta=delta)`
/// (PyTorch's default `delta` is 1).
///
/// # Panics
/// If `delta` is not positive or a `Dyn` size differs (see [`try_huber_loss`]).
#[track_caller]
pub fn huber_loss<
    S: Shape,
    T: Shape,
    R: Reduction,
    E: Float,
    D: Device<E>,
    E2: SameDtype<E, op::huber_loss>,
>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E2, D>,
    delta: f64,
    reduction: R,
) -> Tensor<R::Output<S>, E, D>
where
    S: LossShape<T, op::huber_loss>,
{
    ok(try_huber_loss(input, target, delta, reduction))
}

/// Fallible [`huber_loss`].
///
/// # Errors
/// [`LossError::InvalidOption`] for a `delta` that is not positive;
/// [`LossError::Core`] when a `Dyn` size of the target differs.
pub fn try_huber_loss<
    S: Shape,
    T: Shape,
    R: Reduction,
    E: Float,
    D: Device<E>,
    E2: SameDtype<E, op::huber_loss>,
>(
    input: &Tensor<S, E, D>,
    target: &Tensor<T, E2, D>,
    delta: f64,
    reduction: R,
) -> Result<Tensor<R::Output<S>, E, D>, LossError>
where
    S: LossShape<T, op::huber_loss>,
{
    let target = E2::same(target);
    const OP: &str = "huber_loss";
    let _ = reduction;
    if delta.is_nan() || delta <= 0.0 {
        return Err(LossError::option(
            OP,
            format!("delta must be positive, got {delta}"),
        ));
    }
    let (x, y) = flat_pair(OP, input, target)?;
    let per = piecewise(&(&x - &y), delta, |q| q, |l| l.mul_scalar(delta));
    reduce::<R, S, E, D>(OP, per, &input.dims(), None)
}

macro_rules! elementwise_loss_struct {
    (
        $(#[$doc:meta])*
        $name:ident { $($field:ident : $default:expr => $fdoc:literal),* } => $try_f:ident($($arg:ident),*) as $op:ident
    ) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct $name<R: Reduction = Mean> {
            $($field: f64,)*
            reduction: R,
        }

        impl $name<Mean> {
            /// The loss with PyTorch's defaults (`reduction='mean'`).
            pub fn new() -> Self {
                Self::default()
            }
        }

        impl<R: Reduction> Default for $name<R> {
            fn default() -> Self {
                $name { $($field: $default,)* reduction: R::default() }
            }
        }

        impl<R: Reduction> $name<R> {
            $(
                #[doc = $fdoc]
                pub fn $field(mut self, $field: f64) -> Self {
                    self.$field = $field;
                    self
                }
            )*

            /// The same loss with another reduction.
            pub fn reduction<R2: Reduction>(self, reduction: R2) -> $name<R2> {
                $name { $($field: self.$field,)* reduction }
            }

            /// Computes the loss.
            ///
            /// # Errors
            /// As the functional form.
            pub fn try_forward<S: Shape, T: Shape, E: Float, D: Device<E>>(
                &self,
                input: &Tensor<S, E, D>,
                target: &Tensor<T, E, D>,
            ) -> Result<Tensor<R::Output<S>, E, D>, LossError>
            where
                S: LossShape<T, op::$op>,
            {
                $try_f(input, target, $(self.$arg,)* self.reduction)
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
                S: LossShape<T, op::$op>,
            {
                ok(self.try_forward(input, target))
            }
        }
    };
}

elementwise_loss_struct! {
    /// [`mse_loss`] as a struct holding its reduction, like `nn.MSELoss`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::loss::{MseLoss, Sum};
    /// let x = Tensor::<(C<2>,)>::from_vec(vec![1.0, 2.0], (C,)).unwrap();
    /// let y = Tensor::<(C<2>,)>::from_vec(vec![0.0, 4.0], (C,)).unwrap();
    /// assert_eq!(MseLoss::new().reduction(Sum).forward(&x, &y).item(), 5.0);
    /// ```
    MseLoss {} => try_mse_loss() as mse_loss
}

elementwise_loss_struct! {
    /// [`l1_loss`] as a struct holding its reduction, like `nn.L1Loss`.
    L1Loss {} => try_l1_loss() as l1_loss
}

elementwise_loss_struct! {
    /// [`smooth_l1_loss`] as a struct holding its options, like `nn.SmoothL1Loss`.
    SmoothL1Loss { beta: 1.0 => "Sets `beta` (default 1), where the loss turns from quadratic to linear." } => try_smooth_l1_loss(beta) as smooth_l1_loss
}

elementwise_loss_struct! {
    /// [`huber_loss`] as a struct holding its options, like `nn.HuberLoss`.
    HuberLoss { delta: 1.0 => "Sets `delta` (default 1), where the loss turns from quadratic to linear." } => try_huber_loss(delta) as huber_loss
}
