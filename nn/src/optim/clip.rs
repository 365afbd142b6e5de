//! Gradient clipping by total norm and by value, like
//! `torch.nn.utils.clip_grad_norm_` and `clip_grad_value_`: each rewrites the
//! accumulated gradients of a model's parameters (of element type `E` on
//! device `D`) between `backward` and the optimizer's step.

use super::{Flat, OptimError};
use crate::module::{downcast_ref, parameters, Cx, Module, Role, Visitor};
use forma_core::device::{Backend, Device};
use forma_core::{Dtype, Dyn, Float, Shape, Tensor};

/// Scales the gradients of `model`'s parameters so that their total
/// `norm_type`-norm (over all gradients, as if concatenated) is at most
/// `max_norm`, like `torch.nn.utils.clip_grad_norm_(model.parameters(),
/// max_norm, norm_type)`; returns the total norm before clipping.
///
/// As in PyTorch, the norm is the norm of the per-parameter norms, every
/// gradient is multiplied by `min(max_norm / (total + 1e-6), 1)` in the
/// gradients' dtype, and a non-finite total is returned (and spreads into
/// the gradients) rather than refused. Parameters without a gradient are
/// ignored; with none at all the result is 0 and nothing changes.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::clip_grad_norm_;
///
/// let w = Tensor::<(C<2>,)>::from_vec(vec![3.0, 4.0], (C,)).unwrap().requires_grad();
/// (&w * &w).sum_all().mul_scalar(0.5).backward();        // grad = w = [3, 4]
/// let total = clip_grad_norm_::<f32, Cpu>(&w, 1.0, 2.0).unwrap();
/// assert_eq!(total, 5.0);
/// let g = w.grad().unwrap().to_vec();
/// assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6);
/// ```
///
/// # Errors
/// [`OptimError::InvalidOption`] for a `norm_type` that is not positive
/// (`f64::INFINITY` is the max-norm); a device failure.
pub fn clip_grad_norm_<E: Float, D: Device<E>>(
    model: &impl Module,
    max_norm: f64,
    norm_type: f64,
) -> Result<f64, OptimError> {
    if norm_type.is_nan() || norm_type <= 0.0 {
        return Err(OptimError::invalid(
            "clip_grad_norm_",
            "norm_type",
            norm_type,
            "it must be positive (or infinite for the max-norm)",
        ));
    }
    let grads: Vec<Flat<E, D>> = unique_params::<E, D>(model)
        .into_iter()
        .filter_map(|p| p.grad)
        .collect();
    let Some(first) = grads.first() else {
        return Ok(0.0);
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
    let total: E = norm(&stacked).try_to_vec()?[0];
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

/// Clamps every gradient of `model`'s parameters into `[-clip, clip]`, like
/// `torch.nn.utils.clip_grad_value_(model.parameters(), clip)`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::clip_grad_value_;
///
/// let w = Tensor::<(C<3>,)>::from_vec(vec![-3.0, 0.5, 4.0], (C,)).unwrap().requires_grad();
/// (&w * &w).sum_all().mul_scalar(0.5).backward();        // grad = w
/// clip_grad_value_::<f32, Cpu>(&w, 1.0).unwrap();
/// assert_eq!(w.grad().unwrap().to_vec(), [-1.0, 0.5, 1.0]);
/// ```
///
/// # Errors
/// A device failure.
pub fn clip_grad_value_<E: Float, D: Device<E>>(
    model: &impl Module,
    clip: f64,
) -> Result<(), OptimError> {
    rewrite::<E, D>(model, Rewrite::Clamp(clip))
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
enum Rewrite {
    Scale(f64),
    Clamp(f64),
}

/// Rewrites the gradient of every (unique) parameter of `model` of type `E`
/// on `D` in place.
fn rewrite<E: Float, D: Device<E>>(model: &impl Module, op: Rewrite) -> Result<(), OptimError> {
    struct Each<E: Float, D: Device<E>> {
        op: Rewrite,
        seen: Vec<Flat<E, D>>,
        err: Option<forma_core::Error>,
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
    };
    model.visit(&mut Cx::new(), &mut each);
    match each.err {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
