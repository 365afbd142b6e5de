//! Automatic mixed precision, like `torch.autocast`: inside an [`autocast`]
//! guard, the ops that gain from a 16-bit float type (matmul, linear,
//! convolutions, attention) compute from operands rounded to it and round
//! their result to it, while every other op keeps the tensors' own type.
//!
//! **How it fits static dtypes.** A tensor's element type is part of its
//! type (`Tensor<S, f32>`), and a model's `forward` names it, so autocast
//! cannot hand back a `Tensor<S, bf16>` where the signature says `f32`.
//! Instead the listed ops work as PyTorch's do under autocast — cast each
//! f32 (or other half) operand to the low type, multiply with f32
//! accumulation, give a low-type result — and store that result, exactly,
//! in the tensor's own type. Their backward does the same as PyTorch's: the
//! incoming gradient is rounded to the low type (it is the gradient of a
//! low-type tensor there), the products are taken, and each operand's
//! gradient is rounded to the low type before the cast back hands it on.
//! Parameters stay f32 (master weights) and their gradients arrive in f32.
//!
//! The op policy, against PyTorch's CPU and CUDA lists:
//!
//! - **Low precision**: `matmul` (and so `bmm`-shaped products), `linear`,
//!   `conv1d`/`conv2d`, `conv_transpose2d`, `scaled_dot_product_attention`.
//! - **f32**: everything else keeps the tensors' type, so for an f32 model
//!   softmax, log-softmax, the norms, losses, reductions, `exp`/`log` run in
//!   f32, as PyTorch's f32 list says.
//! - **Where Forma differs**: ops outside both lists (activations, adds,
//!   reshapes) take their input's type in PyTorch, so after a linear layer
//!   PyTorch runs `relu`/`gelu`/`+` in bf16 and Forma in f32 on the same
//!   (bf16-exact) values: Forma's result is the more precise one, within a
//!   bf16 rounding of PyTorch's. Binary ops therefore always see "the widest
//!   input" (the tensor's own type). f64 tensors are never cast, as in
//!   PyTorch.
//!
//! A backend with a low-precision product ([`crate::ops::matmul::MatmulKernel::matmul_low`],
//! the CPU's on AMX tiles) runs matmul and linear, forward and backward, as
//! one kernel that rounds as it reads and writes; the other ops and backends
//! round their operands and result as ops of their own. The values are the
//! same but for the order of the f32 sums.
//!
//! Guards nest, and [`autocast_disabled`] turns it off inside an autocast
//! region (PyTorch's `autocast(enabled=False)`). The state is per thread, as
//! PyTorch's is. Backward ignores it: the backward of an op recorded under
//! autocast computes as its forward did, whatever guard is active when
//! `backward` runs.
//!
//! ```
//! use forma::prelude::*;
//! use forma::core::autocast::autocast;
//! use forma::core::DType;
//!
//! let x = Tensor::<(C<1>, C<2>)>::from_vec(vec![1.0 + 1.0 / 512.0, 1.0], (C, C)).unwrap();
//! let w = Tensor::<(C<2>, C<1>)>::ones();
//! let exact = x.matmul(&w).to_vec()[0];
//! let low = {
//!     let _amp = autocast(DType::BF16);
//!     x.matmul(&w).to_vec()[0]
//! };
//! assert_eq!(exact, 2.0 + 1.0 / 512.0);
//! assert_eq!(low, 2.0); // 1 + 2^-9 rounds to 1 in bf16 (8 significant bits)
//! ```

use crate::device::{Backend, Device};
use crate::dtype::{DType, Dtype, Float};
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tape::Raw;
use crate::tensor::{ok, Tensor};
use std::cell::{Cell, RefCell};

thread_local! {
    /// The autocast settings of this thread.
    static POLICY: RefCell<Policy> = RefCell::new(Policy::default());
    /// Whether some device has autocast on and no op is running its
    /// low-precision body (a fast check before any lookup).
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
}

/// Which low type each kind of device computes in.
#[derive(Clone, Debug, Default)]
struct Policy {
    /// For every device kind without its own entry.
    all: Option<DType>,
    /// Per device kind (`cpu`, `cuda`): `None` is off for that kind.
    kinds: Vec<(String, Option<DType>)>,
}

impl Policy {
    fn for_kind(&self, kind: &str) -> Option<DType> {
        match self.kinds.iter().find(|(k, _)| k == kind) {
            Some((_, d)) => *d,
            None => self.all,
        }
    }

    fn any(&self) -> bool {
        self.all.is_some() || self.kinds.iter().any(|(_, d)| d.is_some())
    }
}

/// Restores the previous autocast settings when dropped (a guard, like
/// [`crate::tape::no_grad`]'s).
#[derive(Debug)]
#[must_use = "autocast is on only while the guard lives"]
pub struct AutocastGuard {
    prev: Policy,
    prev_active: bool,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        let prev = std::mem::take(&mut self.prev);
        POLICY.with(|p| *p.borrow_mut() = prev);
        ACTIVE.with(|a| a.set(self.prev_active));
    }
}

fn enter(change: impl FnOnce(&mut Policy)) -> AutocastGuard {
    let prev_active = ACTIVE.with(Cell::get);
    let prev = POLICY.with(|p| {
        let mut p = p.borrow_mut();
        let prev = p.clone();
        change(&mut p);
        prev
    });
    let any = POLICY.with(|p| p.borrow().any());
    ACTIVE.with(|a| a.set(any));
    AutocastGuard { prev, prev_active }
}

fn check_low(dtype: DType) -> Result<()> {
    match dtype {
        DType::BF16 | DType::F16 => Ok(()),
        other => Err(Error::invalid(
            "autocast",
            format!(
                "autocast computes in bfloat16 or float16, not {other}; \
                 use `autocast_disabled()` for a region in the tensors' own type"
            ),
        )),
    }
}

/// Turns autocast on for every device on this thread until the guard drops,
/// like `with torch.autocast(device, dtype)`: the low-precision ops compute
/// in `dtype` (`DType::BF16`, PyTorch's CPU default, or `DType::F16`).
///
/// # Panics
/// For a `dtype` other than bf16 and f16 (see [`try_autocast`]).
#[track_caller]
pub fn autocast(dtype: DType) -> AutocastGuard {
    ok(try_autocast(dtype))
}

/// Fallible [`autocast`].
///
/// # Errors
/// For a `dtype` other than bf16 and f16.
pub fn try_autocast(dtype: DType) -> Result<AutocastGuard> {
    check_low(dtype)?;
    Ok(enter(|p| {
        p.all = Some(dtype);
        p.kinds.clear();
    }))
}

/// Sets autocast for one kind of device (`"cpu"`, `"cuda"`: a device's
/// [`Backend::name`] before any `:`), leaving the others as they are, like
/// `torch.autocast("cuda", dtype, enabled)`; `None` turns it off there.
///
/// # Errors
/// For a `dtype` other than bf16 and f16.
pub fn autocast_device(kind: &str, dtype: Option<DType>) -> Result<AutocastGuard> {
    if let Some(d) = dtype {
        check_low(d)?;
    }
    Ok(enter(|p| {
        match p.kinds.iter_mut().find(|(k, _)| k == kind) {
            Some(entry) => entry.1 = dtype,
            None => p.kinds.push((kind.to_string(), dtype)),
        }
    }))
}

/// Turns autocast off on every device until the guard drops, like
/// `torch.autocast(device, enabled=False)` inside an autocast region: for a
/// part of a model that must run in its own type.
pub fn autocast_disabled() -> AutocastGuard {
    enter(|p| *p = Policy::default())
}

/// The low type autocast computes in on `device` on this thread (`None`
/// when it is off there), like `torch.get_autocast_dtype` together with
/// `torch.is_autocast_enabled`.
pub fn autocast_dtype<D: Backend>(device: &D) -> Option<DType> {
    if !ACTIVE.with(Cell::get) {
        return None;
    }
    let name = device.name();
    let kind = name.split(':').next().unwrap_or_default();
    POLICY.with(|p| p.borrow().for_kind(kind))
}

/// The type a low-precision op on `E` tensors on `device` rounds to: `None`
/// when autocast is off there, for f64 (never cast, as in PyTorch) and when
/// the tensors already have the low type.
pub(crate) fn target<E: Dtype, D: Backend>(device: &D) -> Option<DType> {
    if !ACTIVE.with(Cell::get) || !matches!(E::DTYPE, DType::F32 | DType::F16 | DType::BF16) {
        return None;
    }
    autocast_dtype(device).filter(|&low| low != E::DTYPE)
}

/// Turns autocast off until dropped, keeping the settings: while an op runs
/// its low-precision body (so its inner ops do not round again) and while
/// backward runs.
pub(crate) struct Suspend(bool);

pub(crate) fn suspend() -> Suspend {
    Suspend(ACTIVE.with(|a| a.replace(false)))
}

impl Drop for Suspend {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(self.0));
    }
}

/// `r` rounded to `low` and back: the values a cast to `low` would hold.
pub(crate) fn round_raw<E: Dtype, D: Backend>(r: &Raw<E, D>, low: DType) -> Result<Raw<E, D>> {
    let dev = &r.device;
    let s = match low {
        DType::BF16 => {
            let h = dev.cast::<E, half::bf16>(&r.storage(), &r.layout)?;
            dev.cast::<half::bf16, E>(&h, &crate::layout::Layout::contiguous(&r.layout.dims))?
        }
        DType::F16 => {
            let h = dev.cast::<E, half::f16>(&r.storage(), &r.layout)?;
            dev.cast::<half::f16, E>(&h, &crate::layout::Layout::contiguous(&r.layout.dims))?
        }
        other => unreachable!("autocast rounds to bf16 or f16, not {other}"),
    };
    Ok(Raw::new(s, &r.layout.dims, dev.clone()))
}

impl<S: Shape, E: Float, D: Device<E>> Tensor<S, E, D> {
    /// This tensor rounded to `low` (bf16 or f16), kept in its own type: the
    /// autocast cast of an operand. Its backward rounds the gradient the
    /// same way (the gradient of a low-type tensor is low-type).
    pub(crate) fn try_round_to(&self, low: DType) -> Result<Self> {
        let r = round_raw(&self.raw(), low)?;
        let y: Self = Tensor::from_raw(r)?;
        Ok(y.record(
            "autocast_round",
            std::slice::from_ref(&self.var),
            vec![],
            move |g| Ok(vec![Some(round_raw(g, low)?)]),
        ))
    }
}
