//! Learning-rate schedulers, stepping an optimizer's groups like PyTorch's
//! `torch.optim.lr_scheduler`: the same recursive ("chainable") formulas, the
//! same initial step at construction, the same `last_epoch` counting.
//!
//! A scheduler does not hold its optimizer: it takes it (as
//! [`LrGroups`]) at construction, where it records each group's
//! `initial_lr` and sets the first learning rate as PyTorch does, and at each
//! [`LrScheduler::step`], called after the optimizer's step, once per epoch
//! or per iteration as the schedule intends.
//!
//! ```
//! use forma::prelude::*;
//! use forma::nn::optim::{LrGroups, Sgd, SgdOptions};
//! use forma::nn::sched::{LrScheduler, StepLR};
//!
//! let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(0.1));
//! let mut sched = StepLR::new(&mut opt, 2, 0.5);
//! let mut lrs = vec![opt.lr(0)];
//! for _ in 0..4 {
//!     // ... the epoch's optimizer steps ...
//!     sched.step(&mut opt);
//!     lrs.push(sched.get_last_lr()[0]);
//! }
//! assert_eq!(lrs, [0.1, 0.1, 0.05, 0.05, 0.025]);
//! ```

mod chainable;
mod one_cycle;
mod sequential;

pub use chainable::{CosineAnnealingLR, ExponentialLR, LinearLR, MultiStepLR, StepLR};
pub use one_cycle::{Anneal, OneCycleLR, OneCycleOptions};
pub use sequential::{ChainedScheduler, SequentialLR};

use crate::optim::options::decode_value;
use crate::optim::{LrGroups, OptimError, OptionValue};
use std::collections::BTreeMap;
use std::fmt;

/// A learning-rate scheduler, like `torch.optim.lr_scheduler.LRScheduler`.
pub trait LrScheduler: fmt::Debug + Send {
    /// Advances the schedule by one epoch (or iteration) and writes the new
    /// learning rates into `opt`'s groups, like `scheduler.step()`.
    ///
    /// # Errors
    /// `opt` has another number of groups than the scheduler was built
    /// with, or a schedule of fixed length ([`OneCycleLR`]) is past its end.
    fn try_step(&mut self, opt: &mut dyn LrGroups) -> Result<(), OptimError>;

    /// [`LrScheduler::try_step`], panicking on its errors.
    ///
    /// # Panics
    /// When [`LrScheduler::try_step`] fails.
    fn step(&mut self, opt: &mut dyn LrGroups) {
        if let Err(e) = self.try_step(opt) {
            panic!("scheduler step: {e}");
        }
    }

    /// The learning rates the last step (or the construction) set, one per
    /// group, like `scheduler.get_last_lr()`.
    fn get_last_lr(&self) -> &[f64];

    /// The index of the last epoch, like `scheduler.last_epoch` (0 after
    /// construction).
    fn last_epoch(&self) -> i64;

    /// The scheduler's state (counters, base learning rates and its
    /// configuration), like `scheduler.state_dict()`.
    fn state_dict(&self) -> SchedulerState;

    /// Restores a state exported by [`LrScheduler::state_dict`] of the same
    /// kind of scheduler, like `scheduler.load_state_dict(sd)` (the
    /// configuration is restored too). The optimizer's learning rates are the
    /// optimizer's state: load them with its own `load_state_dict`.
    ///
    /// # Errors
    /// Another kind of scheduler, a missing, unknown or unparsable entry.
    /// Nothing is changed on error.
    fn load_state_dict(&mut self, state: &SchedulerState) -> Result<(), OptimError>;

    /// Starts the schedule over: the step a scheduler takes at construction
    /// (PyTorch's `_initial_step`). [`SequentialLR`] calls it on its first
    /// scheduler.
    ///
    /// # Errors
    /// As [`LrScheduler::try_step`].
    fn restart(&mut self, opt: &mut dyn LrGroups) -> Result<(), OptimError>;

    /// Sets `last_epoch` to `epoch` and the learning rates to the schedule's
    /// closed form there (PyTorch's `_update_lr(epoch)`): how
    /// [`SequentialLR`] starts the next scheduler at a milestone.
    ///
    /// # Errors
    /// As [`LrScheduler::try_step`]; a scheduler made of others
    /// ([`SequentialLR`]) has no closed form.
    fn jump_to(&mut self, opt: &mut dyn LrGroups, epoch: i64) -> Result<(), OptimError>;

    /// Undoes the epoch count of the construction step (`last_epoch -= 1`,
    /// PyTorch's `recursive_undo`), as [`SequentialLR`] does to the
    /// schedulers it is built from.
    fn rewind(&mut self);
}

/// A scheduler's exported state: plain values as text, which a checkpoint
/// can keep in its header. Keys: `scheduler` (the kind), `last_epoch`,
/// `step_count`, `base_lrs` and `last_lr` (`;`-separated, one per group),
/// and the configuration (`gamma`, `T_max`, ...); [`SequentialLR`] nests its
/// schedulers' states under `schedulers.<i>.`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedulerState {
    /// The values, by key.
    pub meta: BTreeMap<String, String>,
}

impl SchedulerState {
    fn get(&self, key: &str) -> Result<&str, OptimError> {
        self.meta
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| OptimError::MissingKey(key.into()))
    }

    fn value<T: OptionValue>(&self, key: &str) -> Result<T, OptimError> {
        decode_value(key, self.get(key)?)
    }

    fn put<T: OptionValue>(&mut self, key: impl Into<String>, value: &T) {
        self.meta.insert(key.into(), value.encode());
    }

    fn check_kind(&self, expected: &'static str) -> Result<(), OptimError> {
        let found = self.get("scheduler")?;
        if found != expected {
            return Err(OptimError::WrongKind {
                expected,
                found: found.into(),
            });
        }
        Ok(())
    }
}

/// What every scheduler derived from PyTorch's `LRScheduler` keeps.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Base {
    base_lrs: Vec<f64>,
    last_epoch: i64,
    step_count: u64,
    last_lr: Vec<f64>,
}

impl Base {
    /// Attaches to `opt` as `LRScheduler.__init__` does with `last_epoch=-1`:
    /// each group's `initial_lr` defaults to its current `lr`, and the base
    /// learning rates are the `initial_lr`s.
    fn attach(opt: &mut dyn LrGroups) -> Base {
        let base_lrs = (0..opt.num_groups())
            .map(|i| match opt.initial_lr(i) {
                Some(lr) => lr,
                None => {
                    let lr = opt.lr(i);
                    opt.set_initial_lr(i, lr);
                    lr
                }
            })
            .collect();
        Base {
            base_lrs,
            last_epoch: -1,
            step_count: 0,
            last_lr: Vec::new(),
        }
    }

    fn check_groups(&self, opt: &dyn LrGroups) -> Result<(), OptimError> {
        if opt.num_groups() != self.base_lrs.len() {
            return Err(OptimError::GroupCount {
                what: "scheduler step",
                expected: self.base_lrs.len(),
                found: opt.num_groups(),
            });
        }
        Ok(())
    }

    fn export(&self, kind: &'static str, out: &mut SchedulerState) {
        out.meta.insert("scheduler".into(), kind.into());
        out.put("last_epoch", &self.last_epoch);
        out.put("step_count", &self.step_count);
        out.put("base_lrs", &self.base_lrs);
        out.put("last_lr", &self.last_lr);
    }

    fn import(state: &SchedulerState) -> Result<Base, OptimError> {
        Ok(Base {
            last_epoch: state.value("last_epoch")?,
            step_count: state.value("step_count")?,
            base_lrs: state.value("base_lrs")?,
            last_lr: state.value("last_lr")?,
        })
    }
}

const BASE_KEYS: &[&str] = &[
    "scheduler",
    "last_epoch",
    "step_count",
    "base_lrs",
    "last_lr",
];

/// A scheduler built on [`Base`]: its rule for the next learning rates.
/// `rule_plumbing!` writes the parts that only name fields.
pub(crate) trait Rule: Clone {
    const NAME: &'static str;
    fn base(&self) -> &Base;
    fn base_mut(&mut self) -> &mut Base;
    /// PyTorch's `get_lr()`, with `initial` its `_is_initial`.
    fn get_lr(&mut self, opt: &mut dyn LrGroups, initial: bool) -> Result<Vec<f64>, OptimError>;
    /// PyTorch's `_get_closed_form_lr()`, where the scheduler has one.
    fn closed_form(&self) -> Option<Vec<f64>> {
        None
    }
    /// The configuration as named values.
    fn config(&self) -> Vec<(&'static str, String)>;
    /// Sets one configuration value; `Ok(false)` for an unknown name.
    fn set_config(&mut self, name: &str, text: &str) -> Result<bool, OptimError>;
}

/// Rejects a zero step count or period: the schedules divide by it.
fn at_least_one(owner: &'static str, option: &'static str, value: u64) -> Result<(), OptimError> {
    if value == 0 {
        return Err(OptimError::invalid(
            owner,
            option,
            0,
            "it must be at least 1",
        ));
    }
    Ok(())
}

/// The tail of every [`Rule`] scheduler's `try_new`, after its checks:
/// attaches to `opt` (what `make` builds holds the [`Base`]) and takes
/// PyTorch's initial step.
fn start<R: Rule>(opt: &mut dyn LrGroups, make: impl FnOnce(Base) -> R) -> Result<R, OptimError> {
    let mut s = make(Base::attach(opt));
    initial_step(&mut s, opt)?;
    Ok(s)
}

/// The parts of a [`Rule`] impl that only name fields: `base`/`base_mut` on
/// the `base` field and, given `"key" => field` pairs, `config`/`set_config`
/// reading and writing those fields under those keys (one list, so a key
/// cannot be exported without being restored).
macro_rules! rule_plumbing {
    () => {
        fn base(&self) -> &$crate::sched::Base {
            &self.base
        }

        fn base_mut(&mut self) -> &mut $crate::sched::Base {
            &mut self.base
        }
    };
    ($($key:literal => $field:ident),+ $(,)?) => {
        $crate::sched::rule_plumbing!();

        fn config(&self) -> Vec<(&'static str, String)> {
            vec![$(($key, $crate::optim::OptionValue::encode(&self.$field))),+]
        }

        fn set_config(
            &mut self,
            name: &str,
            text: &str,
        ) -> Result<bool, $crate::optim::OptimError> {
            match name {
                $($key => self.$field = $crate::optim::options::decode_value(name, text)?,)+
                _ => return Ok(false),
            }
            Ok(true)
        }
    };
}
pub(crate) use rule_plumbing;

/// A scheduler's panicking `new`, forwarding its arguments to `try_new`:
/// `new_from_try!(/// docs Type, (arg: Ty, ...))`.
macro_rules! new_from_try {
    ($(#[$doc:meta])* $t:ty, ($($arg:ident: $ty:ty),* $(,)?)) => {
        impl $t {
            $(#[$doc])*
            pub fn new(opt: &mut dyn $crate::optim::LrGroups, $($arg: $ty),*) -> Self {
                Self::try_new(opt, $($arg),*).unwrap_or_else(|e| panic!("{e}"))
            }
        }
    };
}
pub(crate) use new_from_try;

/// PyTorch's `_update_lr(epoch)`.
fn update_lr<R: Rule>(
    r: &mut R,
    opt: &mut dyn LrGroups,
    epoch: Option<i64>,
    initial: bool,
) -> Result<(), OptimError> {
    r.base().check_groups(opt)?;
    let values = match epoch {
        None => {
            r.base_mut().last_epoch += 1;
            r.get_lr(opt, initial)?
        }
        Some(e) => {
            r.base_mut().last_epoch = e;
            match r.closed_form() {
                Some(v) => v,
                None => r.get_lr(opt, initial)?,
            }
        }
    };
    for (i, lr) in values.into_iter().enumerate() {
        opt.set_lr(i, lr);
    }
    r.base_mut().last_lr = (0..opt.num_groups()).map(|i| opt.lr(i)).collect();
    Ok(())
}

/// PyTorch's `step()`.
fn step_rule<R: Rule>(r: &mut R, opt: &mut dyn LrGroups, initial: bool) -> Result<(), OptimError> {
    r.base_mut().step_count += 1;
    update_lr(r, opt, None, initial)
}

/// PyTorch's `_initial_step()`.
fn initial_step<R: Rule>(r: &mut R, opt: &mut dyn LrGroups) -> Result<(), OptimError> {
    r.base_mut().step_count = 0;
    step_rule(r, opt, true)
}

fn export_rule<R: Rule>(r: &R) -> SchedulerState {
    let mut out = SchedulerState::default();
    r.base().export(R::NAME, &mut out);
    for (k, v) in r.config() {
        out.meta.insert(k.into(), v);
    }
    out
}

fn import_rule<R: Rule>(r: &mut R, state: &SchedulerState) -> Result<(), OptimError> {
    state.check_kind(R::NAME)?;
    let mut next = r.clone();
    *next.base_mut() = Base::import(state)?;
    let config = r.config();
    for (name, _) in &config {
        let text = state.get(name)?;
        next.set_config(name, text)?;
    }
    if let Some(key) = state
        .meta
        .keys()
        .find(|k| !BASE_KEYS.contains(&k.as_str()) && !config.iter().any(|(n, _)| n == k))
    {
        return Err(OptimError::UnexpectedKey {
            key: key.clone(),
            reason: format!("not a setting of {}", R::NAME),
        });
    }
    *r = next;
    Ok(())
}

/// Implements [`LrScheduler`] for a [`Rule`].
macro_rules! rule_scheduler {
    ($t:ty) => {
        impl $crate::sched::LrScheduler for $t {
            fn try_step(
                &mut self,
                opt: &mut dyn $crate::optim::LrGroups,
            ) -> Result<(), $crate::optim::OptimError> {
                $crate::sched::step_rule(self, opt, false)
            }

            fn get_last_lr(&self) -> &[f64] {
                &$crate::sched::Rule::base(self).last_lr
            }

            fn last_epoch(&self) -> i64 {
                $crate::sched::Rule::base(self).last_epoch
            }

            fn state_dict(&self) -> $crate::sched::SchedulerState {
                $crate::sched::export_rule(self)
            }

            fn load_state_dict(
                &mut self,
                state: &$crate::sched::SchedulerState,
            ) -> Result<(), $crate::optim::OptimError> {
                $crate::sched::import_rule(self, state)
            }

            fn restart(
                &mut self,
                opt: &mut dyn $crate::optim::LrGroups,
            ) -> Result<(), $crate::optim::OptimError> {
                $crate::sched::initial_step(self, opt)
            }

            fn jump_to(
                &mut self,
                opt: &mut dyn $crate::optim::LrGroups,
                epoch: i64,
            ) -> Result<(), $crate::optim::OptimError> {
                $crate::sched::update_lr(self, opt, Some(epoch), false)
            }

            fn rewind(&mut self) {
                $crate::sched::Rule::base_mut(self).last_epoch -= 1;
            }
        }
    };
}
pub(crate) use rule_scheduler;

/// The learning rates of `opt`'s groups.
fn group_lrs(opt: &dyn LrGroups) -> Vec<f64> {
    (0..opt.num_groups()).map(|i| opt.lr(i)).collect()
}

#[cfg(test)]
mod tests;
