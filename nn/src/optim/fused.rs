//! What the update rules share: how a rule runs, and the per-element
//! helpers they are written with.
//!
//! Each rule is one [`UpdateOp`], written once over a [`Lane`]. [`update`]
//! tries one fused in-place pass ([`forma_core::Tensor::try_fused_update`])
//! and, when the backend declines (CUDA, a view that is not dense, shared
//! storages) or for half types, runs the same `apply` as composed tensor ops
//! ([`forma_core::Tensor::try_composed_update`]): the same operations in the
//! same order on the same scalars, so for f32 and f64, whose accumulation
//! type is their own, the two paths give bit-identical parameters and
//! buffers.

use super::{kernel_scalar, Flat, OptimError};
use forma_core::device::Device;
use forma_core::ops::update::{Lane, UpdateOp};
use forma_core::{DType, Float};

/// Runs the rule `op` over `grad` and `state` (`state[0]` the parameter,
/// then the rule's buffers), in place: fused where [`enabled`] and the
/// backend can, else as composed ops.
///
/// # Errors
/// A device failure, or operands of other sizes than the gradient.
pub(crate) fn update<const N: usize, Op: UpdateOp<N>, E: Float, D: Device<E>>(
    op: Op,
    grad: &Flat<E, D>,
    state: [&Flat<E, D>; N],
) -> Result<(), OptimError> {
    Ok(Flat::try_update(op, grad, state, enabled::<E>())?)
}

/// Whether rules over `E` try the fused path. Half types stay on the
/// composed ops: there every op rounds to the half type as PyTorch's
/// single-tensor path does, where the fused pass would round once.
pub(crate) fn enabled<E: Float>() -> bool {
    matches!(E::DTYPE, DType::F32 | DType::F64) && !composed_only()
}

#[cfg(not(test))]
fn composed_only() -> bool {
    false
}

#[cfg(test)]
thread_local! {
    static COMPOSED_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
fn composed_only() -> bool {
    COMPOSED_ONLY.with(std::cell::Cell::get)
}

/// Runs `f` with the fused path switched off on this thread (tests compare
/// the two paths).
#[cfg(test)]
pub(crate) fn with_composed_only<T>(f: impl FnOnce() -> T) -> T {
    COMPOSED_ONLY.with(|c| c.set(true));
    let out = f();
    COMPOSED_ONLY.with(|c| c.set(false));
    out
}

/// `torch.lerp(start, end, weight)` with PyTorch's two formulas (the one
/// used depends on `|weight| < 0.5`, as in its kernel), with `1 - weight`
/// computed from the weight as the kernel rounds it (for element type `E`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lerp {
    /// The weight as the kernel rounds it.
    w: f64,
    /// `1 - w`, exact in f64.
    one_minus_w: f64,
    /// Which of PyTorch's two formulas applies (`|w| < 0.5`).
    small: bool,
}

impl Lerp {
    /// The lerp of weight `weight` for element type `E`.
    pub(crate) fn new<E: Float>(weight: f64) -> Self {
        let w = kernel_scalar::<E>(weight);
        Lerp {
            w,
            one_minus_w: 1.0 - w,
            small: w.abs() < 0.5,
        }
    }

    /// `lerp(start, end)`.
    #[inline(always)]
    pub(crate) fn apply<R: Lane>(&self, start: R, end: R) -> R {
        let diff = end - start;
        if self.small {
            start + diff * R::c(self.w)
        } else {
            end - diff * R::c(self.one_minus_w)
        }
    }
}
