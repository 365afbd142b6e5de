//! Gradient clipping by total norm and by value, like
//! `torch.nn.utils.clip_grad_norm_` and `clip_grad_value_`: each rewrites the
//! accumulated gradients of a model's parameters between `backward` and the
//! optimizer's step. The plain functions take every float parameter on the
//! CPU; the `_on::<E, D>` forms name an element type and device.

use super::{Flat, OptimError};
use crate::module::{downcast_ref, parameters, Cx, Module, Role, Visitor};
use forma_core::device::{Backend, Device};
use forma_core::{DType, Dtype, Dyn, Float, Shape, Tensor};
use forma_cpu::Cpu;
use std::any::TypeId;

/// Runs `$body` with `$E` the float type of `$dtype` (one of
/// [`cpu_grad_dtypes`]' answers).
macro_rules! for_cpu_dtype {
    ($dtype:expr, $E:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $E = f32;
                $body
            }
            DType::F64 => {
                type $E = f64;
                $body
            }
            DType::F16 => {
                type $E = half::f16;
                $body
            }
            DType::BF16 => {
                type $E = half::bf16;
                $body
            }
            other => unreachable!("{other:?} is not a float type"),
        }
    };
}
pub(super) use for_cpu_dtype;

/// Scales the gradients of `model`'s parameters so that their total 2-norm
/// (over all gradients, as if concatenated) is at most `max_norm`, like
/// `torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`; returns
/// the total norm before clipping. [`clip_grad_norm_with`] takes PyTorch's
/// `norm_type`.
///
/// As in PyTorch, the norm is the norm of the per-parameter norms, every
/// gradient is multiplied by `min(max_norm / (total + 1e-6), 1)` in the
/// gradients' dtype, and a non-finite total is returned (and spreads into
/// the gradients) rather than refused. Parameters without a gradient are
/// ignored; with none at all the result is 0 and nothing changes.
///
/// This covers the parameters of every float type on the CPU; parameters on
/// another device are clipped by [`clip_grad_norm_on`], which names the
/// element type and device (`clip_grad_norm_on::<f32, Cuda>(..)`).
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::clip_grad_norm_;
///
/// let w = Tensor::<(C<2>,)>::from_vec(vec![3.0, 4.0], (C,)).unwrap().requires_grad();
/// (&w * &w).sum_all().mul_scalar(0.5).backward();        // grad = w = [3, 4]
/// let total = clip_grad_norm_(&w, 1.0).unwrap();
/// assert_eq!(total, 5.0);
/// let g = w.grad().unwrap().to_vec();
/// assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6);
/// ```
///
/// # Errors
/// [`OptimError::OtherDevice`] for a parameter with a gradient off the
/// CPU (nothing is changed); a device failure.
pub fn clip_grad_norm_(model: &impl Module, max_norm: f64) -> Result<f64, OptimError> {
    clip_grad_norm_with(model, max_norm, 2.0)
}

/// [`clip_grad_norm_`] with PyTorch's `norm_type`: the `norm_type`-norm
/// (`f64::INFINITY` for the largest absolute value).
///
/// With parameters of several float types, each type's total is taken in
/// that type and the totals are combined in f64 (PyTorch stacks them in the
/// promoted type).
///
/// # Errors
/// [`OptimError::InvalidOption`] for a `norm_type` that is not positive;
/// [`OptimError::OtherDevice`] for a parameter with a gradient off the CPU
/// (nothing is changed on these two); a device failure.
pub fn clip_grad_norm_with(
    model: &impl Module,
    max_norm: f64,
    norm_type: f64,
) -> Result<f64, OptimError> {
    check_norm_type(norm_type)?;
    let dtypes = cpu_grad_dtypes(model, "clip_grad_norm_on")?;
    if let [one] = dtypes[..] {
        return for_cpu_dtype!(one, E => clip_grad_norm_on::<E, Cpu>(model, max_norm, norm_type));
    }
    let mut totals = Vec::new();
    for &dt in &dtypes {
        let total =
            for_cpu_dtype!(dt, E => total_norm::<E, Cpu>(model, norm_type)?.map(Dtype::to_f64));
        totals.push(total.unwrap_or(0.0));
    }
    let total = if norm_type == f64::INFINITY {
        totals.iter().copied().fold(0.0, f64::max)
    } else {
        totals
            .iter()
            .map(|t| t.powf(norm_type))
            .sum::<f64>()
            .powf(1.0 / norm_type)
    };
    // Clamped to 1 with NaN kept (`f64::min` would drop it), as the typed form.
    let coef = max_norm / (total + 1e-6);
    let coef = if coef > 1.0 { 1.0 } else { coef };
    for &dt in &dtypes {
        for_cpu_dtype!(dt, E => rewrite::<E, Cpu>(model, Rewrite::Scale(coef)))?;
    }
    Ok(total)
}

/// [`clip_grad_norm_with`] for the parameters of element type `E` on device
/// `D` (others are left alone): the form for a model off the CPU.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::clip_grad_norm_on;
///
/// let w = Tensor::<(C<2>,)>::from_vec(vec![3.0, 4.0], (C,)).unwrap().requires_grad();
/// (&w * &w).sum_all().mul_scalar(0.5).backward();
/// assert_eq!(clip_grad_norm_on::<f32, Cpu>(&w, 1.0, f64::INFINITY).unwrap(), 4.0);
/// ```
///
/// # Errors
/// [`OptimError::InvalidOption`] for a `norm_type` that is not positive
/// (`f64::INFINITY` is the max-norm); a device failure.
pub fn clip_grad_norm_on<E: Float, D: Device<E>>(
    model: &impl Module,
    max_norm: f64,
    norm_type: f64,
) -> Result<f64, OptimError> {
    check_norm_type(norm_type)?;
    let Some(total) = total_norm::<E, D>(model, norm_type)? else {
        return Ok(0.0);
    };
    // `max_norm / (total + 1e-6)`, clamped to 1 (NaN stays NaN), in `E`.
    let coef = E::from_f64(max_norm) / (total + E::from_f64(1e-6));
    let coef = if coef > E::from_f64(1.0) {
        E::from_f64(1.0)
    } else {
        coef
    };
    let coef = Dtype::to_f64(coef);
    rewrite::<E, D>(model, Rewrite::Scale(coef))?;
    Ok(Dtype::to_f64(total))
}

fn check_norm_type(norm_type: f64) -> Result<(), OptimError> {
    if norm_type.is_nan() || norm_type <= 0.0 {
        return Err(OptimError::invalid(
            "clip_grad_norm_",
            "norm_type",
            norm_type,
            "it must be positive (or infinite for the max-norm)",
        ));
    }
    Ok(())
}

/// The `norm_type`-norm of the per-parameter norms of the gradients of the
/// parameters of type `E` on `D`, in `E`; `None` when none has a gradient.
fn total_norm<E: Float, D: Device<E>>(
    model: &impl Module,
    norm_type: f64,
) -> Result<Option<E>, OptimError> {
    let grads: Vec<Flat<E, D>> = unique_params::<E, D>(model)
        .into_iter()
        .filter_map(|p| p.grad)
        .collect();
    let Some(first) = grads.first() else {
        return Ok(None);
    };
    let device = first.device().clone();
    let norm = |g: &Flat<E, D>| -> Tensor<(), E, D> {
        if norm_type == f64::INFINITY {
            g.abs().max_all()
        } else if norm_type == 2.0 {
            g.square().sum_all().sqrt()
        } else {
            g.abs()
                .pow_scalar(norm_type)
                .sum_all()
                .pow_scalar(1.0 / norm_type)
        }
    };
    let norms: Vec<E> = grads
        .iter()
        .map(|g| norm(g).try_to_vec().map(|v| v[0]))
        .collect::<Result<_, _>>()?;
    let n = norms.len();
    let stacked = Flat::<E, D>::from_vec_on(norms, (Dyn(n),), &device)?;
    Ok(Some(norm(&stacked).try_to_vec()?[0]))
}

/// Clamps every gradient of `model`'s parameters into `[-clip, clip]`, like
/// `torch.nn.utils.clip_grad_value_(model.parameters(), clip)`, for the
/// parameters of every float type on the CPU ([`clip_grad_value_on`] for
/// another device).
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::clip_grad_value_;
///
/// let w = Tensor::<(C<3>,)>::from_vec(vec![-3.0, 0.5, 4.0], (C,)).unwrap().requires_grad();
/// (&w * &w).sum_all().mul_scalar(0.5).backward();        // grad = w
/// clip_grad_value_(&w, 1.0).unwrap();
/// assert_eq!(w.grad().unwrap().to_vec(), [-1.0, 0.5, 1.0]);
/// ```
///
/// # Errors
/// [`OptimError::OtherDevice`] for a parameter with a gradient off the
/// CPU (nothing is changed); a device failure.
pub fn clip_grad_value_(model: &impl Module, clip: f64) -> Result<(), OptimError> {
    for dt in cpu_grad_dtypes(model, "clip_grad_value_on")? {
        for_cpu_dtype!(dt, E => rewrite::<E, Cpu>(model, Rewrite::Clamp(clip)))?;
    }
    Ok(())
}

/// [`clip_grad_value_`] for the parameters of element type `E` on device
/// `D` (others are left alone).
///
/// # Errors
/// A device failure.
pub fn clip_grad_value_on<E: Float, D: Device<E>>(
    model: &impl Module,
    clip: f64,
) -> Result<(), OptimError> {
    rewrite::<E, D>(model, Rewrite::Clamp(clip)).map(|_| ())
}

/// The float types of the CPU parameters of `model` that have a gradient,
/// in the order first met; a parameter with a gradient on another device
/// is refused, pointing to `typed` (the function that names the device).
pub(super) fn cpu_grad_dtypes(
    model: &impl Module,
    typed: &'static str,
) -> Result<Vec<DType>, OptimError> {
    struct Kinds {
        dtypes: Vec<DType>,
        elsewhere: Option<(String, String)>,
    }
    impl Visitor for Kinds {
        fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, D>) {
            if cx.role() != Role::Parameter || !E::DTYPE.is_float() || t.grad().is_none() {
                return;
            }
            if TypeId::of::<D>() != TypeId::of::<Cpu>() {
                self.elsewhere
                    .get_or_insert_with(|| (cx.path().to_string(), t.device().name()));
            } else if !self.dtypes.contains(&E::DTYPE) {
                self.dtypes.push(E::DTYPE);
            }
        }
    }
    let mut kinds = Kinds {
        dtypes: Vec::new(),
        elsewhere: None,
    };
    model.visit(&mut Cx::new(), &mut kinds);
    match kinds.elsewhere {
        Some((param, device)) => Err(OptimError::OtherDevice {
            param,
            device,
            typed,
        }),
        None => Ok(kinds.dtypes),
    }
}

/// The parameters of `model` of type `E` on `D`, a tensor registered under
/// two names (tied weights) once, as `model.parameters()` yields it.
fn unique_params<E: Float, D: Device<E>>(
    model: &impl Module,
) -> Vec<crate::module::ParamRef<E, D>> {
    let mut out: Vec<crate::module::ParamRef<E, D>> = Vec::new();
    for p in parameters::<_, E, D>(model) {
        if !out.iter().any(|q| same_tensor(&q.value, &p.value)) {
            out.push(p);
        }
    }
    out
}

fn same_tensor<E: Float, D: Device<E>>(a: &Flat<E, D>, b: &Flat<E, D>) -> bool {
    a.shares_storage(b) && a.layout() == b.layout()
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Rewrite {
    Scale(f64),
    Clamp(f64),
    /// A loss scaler's unscale: multiplies by the inverse scale and notes
    /// whether a gradient held a NaN or an infinity before.
    Unscale(f64),
}

/// Rewrites the gradient of every (unique) parameter of `model` of type `E`
/// on `D` in place; returns whether a gradient held a NaN or an infinity
/// (checked for [`Rewrite::Unscale`] only).
pub(super) fn rewrite<E: Float, D: Device<E>>(
    model: &impl Module,
    op: Rewrite,
) -> Result<bool, OptimError> {
    struct Each<E: Float, D: Device<E>> {
        op: Rewrite,
        seen: Vec<Flat<E, D>>,
        err: Option<forma_core::Error>,
        found_inf: bool,
    }
    impl<E: Float, D: Device<E>> Visitor for Each<E, D> {
        fn tensor<S: Shape, E2: Dtype, D2: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E2, D2>) {
            if cx.role() != Role::Parameter || self.err.is_some() {
                return;
            }
            let Some(t) = downcast_ref::<S, E2, D2, E, D>(t) else {
                return;
            };
            let Some(g) = t.grad() else { return };
            let flat = t.detach().flatten_all();
            if self.seen.iter().any(|s| same_tensor(s, &flat)) {
                return;
            }
            self.seen.push(flat);
            let _no_grad = forma_core::tape::no_grad();
            let new = match self.op {
                Rewrite::Scale(c) => g.mul_scalar(c),
                Rewrite::Clamp(c) => g.clamp(-c, c),
                Rewrite::Unscale(c) => {
                    // `0 * x` is NaN exactly for a NaN or infinite `x`: one
                    // pass on the gradient's own device.
                    let probe = g.mul_scalar(0.0).sum_all().to_vec()[0];
                    self.found_inf |= !probe.is_finite();
                    g.mul_scalar(c)
                }
            };
            if let Err(e) = t.try_set_grad(&new) {
                self.err = Some(e);
            }
        }
    }
    let mut each = Each::<E, D> {
        op,
        seen: Vec::new(),
        err: None,
        found_inf: false,
    };
    model.visit(&mut Cx::new(), &mut each);
    match each.err {
        Some(e) => Err(e.into()),
        None => Ok(each.found_inf),
    }
}
