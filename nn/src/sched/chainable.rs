//! The chainable schedulers: each step derives the next learning rate from
//! the group's current one (so several schedulers, or a manual
//! `set_lr`, compose), exactly as PyTorch's `get_lr()`; a jump to an epoch
//! (inside [`super::SequentialLR`]) uses the closed form, as PyTorch's
//! `_get_closed_form_lr()`.

use super::{at_least_one, group_lrs, new_from_try, rule_plumbing, rule_scheduler, start};
use super::{Base, Rule};
use crate::optim::{LrGroups, OptimError};
use std::f64::consts::PI;

/// Multiplies each group's learning rate by `gamma` every `step_size`
/// epochs, like `torch.optim.lr_scheduler.StepLR`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::{Sgd, SgdOptions};
/// use forma::nn::sched::{LrScheduler, StepLR};
///
/// let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(1.0));
/// let mut sched = StepLR::new(&mut opt, 3, 0.1);
/// let lrs: Vec<f64> = (0..7).map(|_| { sched.step(&mut opt); sched.get_last_lr()[0] }).collect();
/// assert_eq!(lrs[..3], [1.0, 1.0, 0.1]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct StepLR {
    base: Base,
    step_size: u64,
    gamma: f64,
}

impl StepLR {
    /// Attaches to `opt` (recording each group's `initial_lr`) and takes the
    /// initial step, like `StepLR(opt, step_size, gamma)`.
    ///
    /// # Errors
    /// [`OptimError::InvalidOption`] for `step_size == 0`.
    pub fn try_new(opt: &mut dyn LrGroups, step_size: u64, gamma: f64) -> Result<Self, OptimError> {
        at_least_one("StepLR", "step_size", step_size)?;
        start(opt, |base| StepLR {
            base,
            step_size,
            gamma,
        })
    }
}

new_from_try!(
    /// [`StepLR::try_new`], panicking on an invalid option.
    ///
    /// # Panics
    /// For `step_size == 0`.
    StepLR,
    (step_size: u64, gamma: f64)
);

impl Rule for StepLR {
    const NAME: &'static str = "StepLR";
    rule_plumbing!("step_size" => step_size, "gamma" => gamma);

    fn get_lr(&mut self, opt: &mut dyn LrGroups, _initial: bool) -> Result<Vec<f64>, OptimError> {
        let e = self.base.last_epoch;
        let lrs = group_lrs(opt);
        if e == 0 || e.rem_euclid(self.step_size as i64) != 0 {
            return Ok(lrs);
        }
        Ok(lrs.into_iter().map(|lr| lr * self.gamma).collect())
    }

    fn closed_form(&self) -> Option<Vec<f64>> {
        let k = self.base.last_epoch.div_euclid(self.step_size as i64) as f64;
        Some(
            self.base
                .base_lrs
                .iter()
                .map(|b| b * self.gamma.powf(k))
                .collect(),
        )
    }
}

rule_scheduler!(StepLR);

/// Multiplies each group's learning rate by `gamma` at each milestone epoch
/// (by `gamma^n` at a milestone listed `n` times), like
/// `torch.optim.lr_scheduler.MultiStepLR`.
#[derive(Clone, Debug, PartialEq)]
pub struct MultiStepLR {
    base: Base,
    milestones: Vec<i64>,
    gamma: f64,
}

impl MultiStepLR {
    /// Attaches to `opt` and takes the initial step, like
    /// `MultiStepLR(opt, milestones, gamma)`.
    ///
    /// # Errors
    /// Never for now; the form matches the other schedulers'.
    pub fn try_new(
        opt: &mut dyn LrGroups,
        milestones: impl IntoIterator<Item = i64>,
        gamma: f64,
    ) -> Result<Self, OptimError> {
        let mut milestones: Vec<i64> = milestones.into_iter().collect();
        milestones.sort_unstable();
        start(opt, |base| MultiStepLR {
            base,
            milestones,
            gamma,
        })
    }
}

new_from_try!(
    /// [`MultiStepLR::try_new`].
    ///
    /// # Panics
    /// Never for now.
    MultiStepLR,
    (milestones: impl IntoIterator<Item = i64>, gamma: f64)
);

impl Rule for MultiStepLR {
    const NAME: &'static str = "MultiStepLR";
    rule_plumbing!("milestones" => milestones, "gamma" => gamma);

    fn get_lr(&mut self, opt: &mut dyn LrGroups, _initial: bool) -> Result<Vec<f64>, OptimError> {
        let e = self.base.last_epoch;
        let n = self.milestones.iter().filter(|&&m| m == e).count();
        let lrs = group_lrs(opt);
        if n == 0 {
            return Ok(lrs);
        }
        Ok(lrs
            .into_iter()
            .map(|lr| lr * self.gamma.powf(n as f64))
            .collect())
    }

    fn closed_form(&self) -> Option<Vec<f64>> {
        // `bisect_right(sorted(milestones), last_epoch)`.
        let k = self
            .milestones
            .iter()
            .filter(|&&m| m <= self.base.last_epoch)
            .count() as f64;
        Some(
            self.base
                .base_lrs
                .iter()
                .map(|b| b * self.gamma.powf(k))
                .collect(),
        )
    }
}

rule_scheduler!(MultiStepLR);

/// Multiplies each group's learning rate by `gamma` every epoch, like
/// `torch.optim.lr_scheduler.ExponentialLR`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExponentialLR {
    base: Base,
    gamma: f64,
}

impl ExponentialLR {
    /// Attaches to `opt` and takes the initial step, like
    /// `ExponentialLR(opt, gamma)`.
    ///
    /// # Errors
    /// Never for now; the form matches the other schedulers'.
    pub fn try_new(opt: &mut dyn LrGroups, gamma: f64) -> Result<Self, OptimError> {
        start(opt, |base| ExponentialLR { base, gamma })
    }
}

new_from_try!(
    /// [`ExponentialLR::try_new`].
    ///
    /// # Panics
    /// Never for now.
    ExponentialLR,
    (gamma: f64)
);

impl Rule for ExponentialLR {
    const NAME: &'static str = "ExponentialLR";
    rule_plumbing!("gamma" => gamma);

    fn get_lr(&mut self, opt: &mut dyn LrGroups, initial: bool) -> Result<Vec<f64>, OptimError> {
        let lrs = group_lrs(opt);
        if initial {
            return Ok(lrs);
        }
        Ok(lrs.into_iter().map(|lr| lr * self.gamma).collect())
    }

    fn closed_form(&self) -> Option<Vec<f64>> {
        let e = self.base.last_epoch as f64;
        Some(
            self.base
                .base_lrs
                .iter()
                .map(|b| b * self.gamma.powf(e))
                .collect(),
        )
    }
}

rule_scheduler!(ExponentialLR);

/// Scales each group's learning rate by a factor that moves linearly from
/// `start_factor` to `end_factor` over `total_iters` steps, like
/// `torch.optim.lr_scheduler.LinearLR`: the usual warmup.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearLR {
    base: Base,
    start_factor: f64,
    end_factor: f64,
    total_iters: u64,
}

impl LinearLR {
    /// Attaches to `opt` and takes the initial step (which scales the
    /// learning rates by `start_factor`), like
    /// `LinearLR(opt, start_factor, end_factor, total_iters)`; PyTorch's
    /// defaults are `1/3`, `1.0` and `5`.
    ///
    /// # Errors
    /// [`OptimError::InvalidOption`] for `start_factor` outside `(0, 1]`,
    /// `end_factor` outside `[0, 1]` or `total_iters == 0`.
    pub fn try_new(
        opt: &mut dyn LrGroups,
        start_factor: f64,
        end_factor: f64,
        total_iters: u64,
    ) -> Result<Self, OptimError> {
        if !(start_factor > 0.0 && start_factor <= 1.0) {
            return Err(OptimError::invalid(
                "LinearLR",
                "start_factor",
                start_factor,
                "it must be in (0, 1]",
            ));
        }
        if !(0.0..=1.0).contains(&end_factor) {
            return Err(OptimError::invalid(
                "LinearLR",
                "end_factor",
                end_factor,
                "it must be in [0, 1]",
            ));
        }
        at_least_one("LinearLR", "total_iters", total_iters)?;
        start(opt, |base| LinearLR {
            base,
            start_factor,
            end_factor,
            total_iters,
        })
    }
}

new_from_try!(
    /// [`LinearLR::try_new`], panicking on an invalid option.
    ///
    /// # Panics
    /// On a factor out of range or `total_iters == 0`.
    LinearLR,
    (start_factor: f64, end_factor: f64, total_iters: u64)
);

impl Rule for LinearLR {
    const NAME: &'static str = "LinearLR";
    rule_plumbing!(
        "start_factor" => start_factor,
        "end_factor" => end_factor,
        "total_iters" => total_iters,
    );

    fn get_lr(&mut self, opt: &mut dyn LrGroups, initial: bool) -> Result<Vec<f64>, OptimError> {
        let e = self.base.last_epoch;
        let lrs = group_lrs(opt);
        if e == 0 {
            return Ok(lrs.into_iter().map(|lr| lr * self.start_factor).collect());
        }
        if initial || e > self.total_iters as i64 {
            return Ok(lrs);
        }
        let (s, f) = (self.start_factor, self.end_factor);
        let factor = 1.0 + (f - s) / (self.total_iters as f64 * s + (e - 1) as f64 * (f - s));
        Ok(lrs.into_iter().map(|lr| lr * factor).collect())
    }

    fn closed_form(&self) -> Option<Vec<f64>> {
        let (s, f) = (self.start_factor, self.end_factor);
        let done = (self.total_iters as i64).min(self.base.last_epoch) as f64;
        let factor = s + (f - s) * done / self.total_iters as f64;
        Some(self.base.base_lrs.iter().map(|b| b * factor).collect())
    }
}

rule_scheduler!(LinearLR);

/// Cosine annealing from each group's base learning rate down to `eta_min`
/// over `t_max` epochs, like `torch.optim.lr_scheduler.CosineAnnealingLR`
/// (PyTorch's recursive formula, which keeps going up after `t_max` along
/// the cosine; no restarts).
#[derive(Clone, Debug, PartialEq)]
pub struct CosineAnnealingLR {
    base: Base,
    t_max: u64,
    eta_min: f64,
}

impl CosineAnnealingLR {
    /// Attaches to `opt` and takes the initial step, like
    /// `CosineAnnealingLR(opt, T_max, eta_min)`.
    ///
    /// # Errors
    /// [`OptimError::InvalidOption`] for `t_max == 0`.
    pub fn try_new(opt: &mut dyn LrGroups, t_max: u64, eta_min: f64) -> Result<Self, OptimError> {
        at_least_one("CosineAnnealingLR", "T_max", t_max)?;
        start(opt, |base| CosineAnnealingLR {
            base,
            t_max,
            eta_min,
        })
    }
}

new_from_try!(
    /// [`CosineAnnealingLR::try_new`], panicking on an invalid option.
    ///
    /// # Panics
    /// For `t_max == 0`.
    CosineAnnealingLR,
    (t_max: u64, eta_min: f64)
);

impl Rule for CosineAnnealingLR {
    const NAME: &'static str = "CosineAnnealingLR";
    rule_plumbing!("T_max" => t_max, "eta_min" => eta_min);

    fn get_lr(&mut self, opt: &mut dyn LrGroups, initial: bool) -> Result<Vec<f64>, OptimError> {
        let (e, t, eta) = (self.base.last_epoch, self.t_max as i64, self.eta_min);
        let (ef, tf) = (e as f64, t as f64);
        let lrs = group_lrs(opt);
        if initial {
            return Ok(lrs);
        }
        if self.base.step_count == 1 && e > 0 {
            return Ok(self
                .base
                .base_lrs
                .iter()
                .map(|b| eta + (b - eta) * (1.0 + (ef * PI / tf).cos()) / 2.0)
                .collect());
        }
        if (e - 1 - t).rem_euclid(2 * t) == 0 {
            return Ok(lrs
                .iter()
                .zip(&self.base.base_lrs)
                .map(|(lr, b)| lr + (b - eta) * (1.0 - (PI / tf).cos()) / 2.0)
                .collect());
        }
        let ratio = (1.0 + (PI * ef / tf).cos()) / (1.0 + (PI * (ef - 1.0) / tf).cos());
        Ok(lrs.into_iter().map(|lr| ratio * (lr - eta) + eta).collect())
    }

    fn closed_form(&self) -> Option<Vec<f64>> {
        let (ef, tf, eta) = (self.base.last_epoch as f64, self.t_max as f64, self.eta_min);
        Some(
            self.base
                .base_lrs
                .iter()
                .map(|b| eta + (b - eta) * (1.0 + (PI * ef / tf).cos()) / 2.0)
                .collect(),
        )
    }
}

rule_scheduler!(CosineAnnealingLR);
