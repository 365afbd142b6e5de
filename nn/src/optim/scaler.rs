//! [`GradScaler`]: dynamic loss scaling for float16 training, like
//! `torch.amp.GradScaler`.
//!
//! Small float16 gradients underflow to zero. The scaler multiplies the loss
//! by a large factor before `backward`, so every gradient arrives scaled by
//! it, then divides the gradients back before the optimizer's step. When a
//! gradient overflowed (NaN or an infinity) the step is skipped and the
//! scale halved; after `growth_interval` clean steps in a row it doubles.

use super::clip::{cpu_grad_dtypes, for_cpu_dtype, rewrite, Rewrite};
use super::{OptimError, Optimizer};
use crate::module::Module;
use forma_core::device::Device;
use forma_core::{DType, Float, Shape, Tensor};
use forma_cpu::Cpu;
use std::collections::BTreeMap;

const OWNER: &str = "GradScaler";

/// Where one optimizer is between two [`GradScaler::update`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Unscaled,
    Stepped,
}

/// Dynamic loss scaling, like `torch.amp.GradScaler`, in PyTorch's order
/// of calls:
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::layers::Linear;
/// use forma::nn::optim::{clip_grad_norm_, GradScaler, Optimizer, Sgd, SgdOptions};
///
/// let mut rng = Rng::seed_from(0);
/// let model = Linear::<2, 1>::new(&Cpu, &mut rng);
/// let mut opt = Sgd::new(SgdOptions::default().lr(0.1));
/// let mut scaler = GradScaler::new();
/// let x = Tensor::<(Dyn, C<2>)>::from_vec(vec![1., 2., 3., 4.], (Dyn(2), C)).unwrap();
/// for _ in 0..3 {
///     opt.zero_grad(&model);
///     let loss = model.forward(x.clone()).square().mean_all();
///     scaler.scale(&loss).backward();
///     scaler.unscale_(&opt, &model).unwrap(); // only when clipping
///     clip_grad_norm_(&model, 1.0).unwrap();
///     scaler.step(&mut opt, &model).unwrap();
///     scaler.update().unwrap();
/// }
/// assert_eq!(scaler.get_scale(), 65536.0);
/// ```
///
/// The scale is kept in f32, as PyTorch keeps it in a float32 tensor, so
/// the sequence of scales is PyTorch's bit for bit. Each optimizer is
/// tracked by its address between two `update`s, as PyTorch tracks it by
/// `id(optimizer)`: do not move an optimizer between `unscale_`/`step`
/// and `update`.
#[derive(Clone, Debug)]
pub struct GradScaler {
    scale: f32,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: u64,
    growth_tracker: u64,
    enabled: bool,
    /// Per optimizer (by address): its stage and whether its gradients held
    /// a NaN or an infinity.
    optimizers: Vec<(usize, Stage, bool)>,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler {
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            growth_tracker: 0,
            enabled: true,
            optimizers: Vec::new(),
        }
    }
}

fn key<O>(opt: &O) -> usize {
    std::ptr::from_ref(opt) as *const () as usize
}

impl GradScaler {
    /// PyTorch's defaults: scale 2^16, doubled after 2000 clean steps,
    /// halved on an overflow.
    pub fn new() -> Self {
        Self::default()
    }

    /// The scale to start from (`init_scale`).
    ///
    /// # Errors
    /// A scale that is not finite and positive.
    pub fn init_scale(mut self, scale: f64) -> Result<Self, OptimError> {
        self.scale = checked_scale("init_scale", scale)?;
        Ok(self)
    }

    /// The factor applied after `growth_interval` clean steps (`growth_factor`).
    ///
    /// # Errors
    /// A factor that is not above 1.
    pub fn growth_factor(mut self, factor: f64) -> Result<Self, OptimError> {
        if !(factor > 1.0 && factor.is_finite()) {
            return Err(OptimError::invalid(
                OWNER,
                "growth_factor",
                factor,
                "it must be above 1",
            ));
        }
        self.growth_factor = factor;
        Ok(self)
    }

    /// The factor applied after an overflow (`backoff_factor`).
    ///
    /// # Errors
    /// A factor outside (0, 1).
    pub fn backoff_factor(mut self, factor: f64) -> Result<Self, OptimError> {
        if !(factor > 0.0 && factor < 1.0) {
            return Err(OptimError::invalid(
                OWNER,
                "backoff_factor",
                factor,
                "it must be between 0 and 1",
            ));
        }
        self.backoff_factor = factor;
        Ok(self)
    }

    /// How many clean steps in a row grow the scale (`growth_interval`).
    ///
    /// # Errors
    /// Zero.
    pub fn growth_interval(mut self, steps: u64) -> Result<Self, OptimError> {
        if steps == 0 {
            return Err(OptimError::invalid(
                OWNER,
                "growth_interval",
                steps,
                "it must be at least 1",
            ));
        }
        self.growth_interval = steps;
        Ok(self)
    }

    /// Turns scaling off (`enabled=False`): `scale` returns the loss,
    /// `unscale_` and `update` do nothing and `step` steps; one training
    /// loop then serves both precisions.
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Whether scaling is on.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The current scale (1 when disabled), like `get_scale()`.
    pub fn get_scale(&self) -> f64 {
        if self.enabled {
            f64::from(self.scale)
        } else {
            1.0
        }
    }

    /// The loss times the scale (on the tape), like `scaler.scale(loss)`;
    /// the loss itself when disabled.
    pub fn scale<S: Shape, E: Float, D: Device<E>>(
        &self,
        loss: &Tensor<S, E, D>,
    ) -> Tensor<S, E, D> {
        if !self.enabled {
            return loss.clone();
        }
        loss.mul_scalar(f64::from(self.scale))
    }

    fn stage(&self, k: usize) -> Option<Stage> {
        self.optimizers
            .iter()
            .find(|(o, ..)| *o == k)
            .map(|&(_, s, _)| s)
    }

    fn set(&mut self, k: usize, stage: Stage, found_inf: bool) {
        match self.optimizers.iter_mut().find(|(o, ..)| *o == k) {
            Some(entry) => *entry = (k, stage, found_inf),
            None => self.optimizers.push((k, stage, found_inf)),
        }
    }

    /// `1 / scale` as PyTorch computes it: in f64, then rounded to f32.
    fn inv_scale(&self) -> f64 {
        f64::from((1.0 / f64::from(self.scale)) as f32)
    }

    /// Divides the gradients of `model`'s parameters (every float type on
    /// the CPU; [`GradScaler::unscale_on`] for another device) by the
    /// scale, in place, and notes whether any held a NaN or an infinity,
    /// like `scaler.unscale_(optimizer)`: call it before clipping. `opt` is
    /// the optimizer that will step these parameters.
    ///
    /// # Errors
    /// A second call for `opt` since the last `update`, a call after its
    /// `step`, float16 gradients (the parameters must be f32 master
    /// weights, as PyTorch requires), a parameter off the CPU.
    pub fn unscale_<O: Optimizer, M: Module>(
        &mut self,
        opt: &O,
        model: &M,
    ) -> Result<(), OptimError> {
        self.unscale_with(key(opt), |inv| {
            let mut found_inf = false;
            for dt in cpu_grad_dtypes(model, "GradScaler::unscale_on")? {
                if dt == DType::F16 {
                    return Err(fp16_grads());
                }
                found_inf |=
                    for_cpu_dtype!(dt, E => rewrite::<E, Cpu>(model, Rewrite::Unscale(inv)))?;
            }
            Ok(found_inf)
        })
    }

    /// [`GradScaler::unscale_`] for the parameters of element type `E` on
    /// device `D` (the form for a model off the CPU).
    ///
    /// # Errors
    /// As [`GradScaler::unscale_`].
    pub fn unscale_on<E: Float, D: Device<E>, O: Optimizer, M: Module>(
        &mut self,
        opt: &O,
        model: &M,
    ) -> Result<(), OptimError> {
        self.unscale_with(key(opt), |inv| {
            if E::DTYPE == DType::F16 {
                return Err(fp16_grads());
            }
            rewrite::<E, D>(model, Rewrite::Unscale(inv))
        })
    }

    /// The unscale of the optimizer at `k`: `pass` divides the gradients by
    /// the scale (it gets `1 / scale`) and says whether one was not finite.
    fn unscale_with(
        &mut self,
        k: usize,
        pass: impl FnOnce(f64) -> Result<bool, OptimError>,
    ) -> Result<(), OptimError> {
        if !self.enabled {
            return Ok(());
        }
        match self.stage(k) {
            None => Ok(()),
            Some(Stage::Unscaled) => Err(out_of_order(
                "unscale_() has already been called on this optimizer since the last update()",
            )),
            Some(Stage::Stepped) => Err(out_of_order("unscale_() is being called after step()")),
        }?;
        let found_inf = pass(self.inv_scale())?;
        self.set(k, Stage::Unscaled, found_inf);
        Ok(())
    }

    /// Unscales the gradients (unless [`GradScaler::unscale_`] already did)
    /// and runs `opt.step(model)` when none held a NaN or an infinity, like
    /// `scaler.step(optimizer)`; returns whether the step ran. A skipped
    /// step leaves the parameters and the optimizer's state untouched.
    ///
    /// # Errors
    /// A second `step` for `opt` since the last `update`; the errors of
    /// `unscale_` and of the optimizer's step.
    pub fn step<O: Optimizer, M: Module>(
        &mut self,
        opt: &mut O,
        model: &M,
    ) -> Result<bool, OptimError> {
        self.step_with(opt, model, |s, opt| s.unscale_(opt, model))
    }

    /// [`GradScaler::step`] for parameters of element type `E` on device `D`.
    ///
    /// # Errors
    /// As [`GradScaler::step`].
    pub fn step_on<E: Float, D: Device<E>, O: Optimizer, M: Module>(
        &mut self,
        opt: &mut O,
        model: &M,
    ) -> Result<bool, OptimError> {
        self.step_with(opt, model, |s, opt| s.unscale_on::<E, D, O, M>(opt, model))
    }

    /// A step: `unscale` runs unless the optimizer's gradients were
    /// unscaled already, then the optimizer steps when they were finite.
    fn step_with<O: Optimizer, M: Module>(
        &mut self,
        opt: &mut O,
        model: &M,
        unscale: impl FnOnce(&mut Self, &O) -> Result<(), OptimError>,
    ) -> Result<bool, OptimError> {
        if !self.enabled {
            opt.try_step(model)?;
            return Ok(true);
        }
        let k = key(opt);
        match self.stage(k) {
            Some(Stage::Stepped) => {
                return Err(out_of_order(
                    "step() has already been called since the last update()",
                ))
            }
            Some(Stage::Unscaled) => {}
            None => unscale(self, &*opt)?,
        }
        let found_inf = self
            .optimizers
            .iter()
            .find(|(o, ..)| *o == k)
            .is_some_and(|&(.., f)| f);
        if !found_inf {
            opt.try_step(model)?;
        }
        self.set(k, Stage::Stepped, found_inf);
        Ok(!found_inf)
    }

    /// Updates the scale from this iteration's checks, like
    /// `scaler.update()`: times `backoff_factor` when any optimizer's
    /// gradients held a NaN or an infinity (and the clean-step count
    /// restarts), else times `growth_factor` once `growth_interval` clean
    /// steps have run in a row (unless that would overflow f32). Forgets
    /// every optimizer's stage.
    ///
    /// # Errors
    /// When neither `unscale_` nor `step` ran since the last update (there
    /// is nothing to update from).
    pub fn update(&mut self) -> Result<(), OptimError> {
        if !self.enabled {
            return Ok(());
        }
        if self.optimizers.is_empty() {
            return Err(out_of_order(
                "update() found no inf checks: call unscale_() or step() first",
            ));
        }
        let found_inf = self.optimizers.iter().any(|&(.., f)| f);
        self.optimizers.clear();
        if found_inf {
            self.scale = (f64::from(self.scale) * self.backoff_factor) as f32;
            self.growth_tracker = 0;
        } else {
            let clean = self.growth_tracker + 1;
            if clean == self.growth_interval {
                let grown = (f64::from(self.scale) * self.growth_factor) as f32;
                if grown.is_finite() {
                    self.scale = grown;
                }
                self.growth_tracker = 0;
            } else {
                self.growth_tracker = clean;
            }
        }
        Ok(())
    }

    /// Sets the scale (`update(new_scale)`), forgetting this iteration's
    /// checks.
    ///
    /// # Errors
    /// A scale that is not finite and positive.
    pub fn set_scale(&mut self, scale: f64) -> Result<(), OptimError> {
        self.scale = checked_scale("new_scale", scale)?;
        self.optimizers.clear();
        Ok(())
    }

    /// Clean steps since the last growth or overflow (`_growth_tracker`).
    pub fn growth_tracker(&self) -> u64 {
        self.growth_tracker
    }

    /// The scaler's state, as PyTorch's `state_dict()` names it: `scale`,
    /// `growth_factor`, `backoff_factor`, `growth_interval`,
    /// `_growth_tracker` (numbers in their shortest exact form); empty when
    /// disabled, as in PyTorch.
    pub fn state_dict(&self) -> BTreeMap<String, String> {
        if !self.enabled {
            return BTreeMap::new();
        }
        [
            ("scale", format!("{:?}", f64::from(self.scale))),
            ("growth_factor", format!("{:?}", self.growth_factor)),
            ("backoff_factor", format!("{:?}", self.backoff_factor)),
            ("growth_interval", self.growth_interval.to_string()),
            ("_growth_tracker", self.growth_tracker.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Restores a [`GradScaler::state_dict`].
    ///
    /// # Errors
    /// An empty state (saved by a disabled scaler), a missing key or a
    /// value that does not parse or is out of range; nothing changes then.
    pub fn load_state_dict(&mut self, state: &BTreeMap<String, String>) -> Result<(), OptimError> {
        if state.is_empty() {
            return Err(OptimError::MissingKey(
                "scale (the state was saved by a disabled GradScaler)".into(),
            ));
        }
        let get = |k: &str| state.get(k).ok_or_else(|| OptimError::MissingKey(k.into()));
        let float = |k: &str| -> Result<f64, OptimError> {
            let v = get(k)?;
            v.parse().map_err(|_| OptimError::BadValue {
                key: k.into(),
                value: v.clone(),
                expected: "a number",
            })
        };
        let int = |k: &str| -> Result<u64, OptimError> {
            let v = get(k)?;
            v.parse().map_err(|_| OptimError::BadValue {
                key: k.into(),
                value: v.clone(),
                expected: "a non-negative integer",
            })
        };
        let loaded = GradScaler::new()
            .init_scale(float("scale")?)?
            .growth_factor(float("growth_factor")?)?
            .backoff_factor(float("backoff_factor")?)?
            .growth_interval(int("growth_interval")?)?;
        *self = GradScaler {
            growth_tracker: int("_growth_tracker")?,
            ..loaded
        };
        Ok(())
    }
}

/// `scale` as the f32 the scaler keeps, when finite and positive.
fn checked_scale(option: &'static str, scale: f64) -> Result<f32, OptimError> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(OptimError::invalid(
            OWNER,
            option,
            scale,
            "it must be finite and positive",
        ));
    }
    Ok(scale as f32)
}

fn out_of_order(reason: &str) -> OptimError {
    OptimError::OutOfOrder {
        owner: OWNER,
        reason: reason.into(),
    }
}

fn fp16_grads() -> OptimError {
    OptimError::invalid(
        OWNER,
        "gradients",
        "float16",
        "unscaling float16 gradients loses them to underflow: keep the parameters in f32 \
         (master weights) and run the low-precision ops under autocast",
    )
}
