//! Schedulers made of schedulers: [`SequentialLR`] runs them one after
//! another, switching at milestone epochs, like
//! `torch.optim.lr_scheduler.SequentialLR` (the usual way to put a warmup,
//! [`super::LinearLR`], before another schedule); [`ChainedScheduler`]
//! steps them all at each step, like `ChainedScheduler`.

use super::{new_from_try, LrScheduler, SchedulerState};
use crate::optim::{LrGroups, OptimError};

/// Runs `schedulers[0]` until `milestones[0]`, then `schedulers[1]` (started
/// at its epoch 0 from its closed form) until `milestones[1]`, and so on,
/// like `torch.optim.lr_scheduler.SequentialLR`.
///
/// Build the schedulers first, each on the same optimizer, then this; as in
/// PyTorch, construction resets each group's learning rate to its
/// `initial_lr`, rewinds every scheduler's construction step and restarts the
/// first scheduler.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::{Sgd, SgdOptions};
/// use forma::nn::sched::{CosineAnnealingLR, LinearLR, LrScheduler, SequentialLR};
///
/// let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(0.1));
/// let warmup = LinearLR::new(&mut opt, 0.1, 1.0, 3);
/// let cosine = CosineAnnealingLR::new(&mut opt, 10, 0.0);
/// let mut sched = SequentialLR::new(&mut opt, vec![Box::new(warmup), Box::new(cosine)], vec![3]);
/// let mut lrs = vec![sched.get_last_lr()[0]];
/// for _ in 0..4 {
///     sched.step(&mut opt);
///     lrs.push(sched.get_last_lr()[0]);
/// }
/// assert!((lrs[0] - 0.01).abs() < 1e-12);   // warmup from 0.1 * 0.1
/// assert!((lrs[3] - 0.1).abs() < 1e-12);    // the cosine starts at the base lr
/// assert!(lrs[4] < lrs[3]);
/// ```
#[derive(Debug)]
pub struct SequentialLR {
    schedulers: Vec<Box<dyn LrScheduler>>,
    milestones: Vec<i64>,
    last_epoch: i64,
    last_lr: Vec<f64>,
}

const NAME: &str = "SequentialLR";
/// SequentialLR's own keys in its state; the rest are its schedulers'.
const OWN_KEYS: [&str; 5] = [
    "scheduler",
    "last_epoch",
    "milestones",
    "last_lr",
    "schedulers",
];

impl SequentialLR {
    /// Chains `schedulers` (built on `opt`) at `milestones` (one fewer than
    /// the schedulers, ascending), like `SequentialLR(opt, schedulers,
    /// milestones)`.
    ///
    /// # Errors
    /// [`OptimError::InvalidOption`] for no scheduler, a milestone count
    /// that is not one fewer, or milestones out of order;
    /// [`OptimError::MissingKey`] when a group has no `initial_lr` (no
    /// scheduler was built on `opt`).
    pub fn try_new(
        opt: &mut dyn LrGroups,
        mut schedulers: Vec<Box<dyn LrScheduler>>,
        milestones: Vec<i64>,
    ) -> Result<Self, OptimError> {
        if schedulers.is_empty() {
            return Err(OptimError::invalid(
                NAME,
                "schedulers",
                "[]",
                "it needs at least one scheduler",
            ));
        }
        if milestones.len() + 1 != schedulers.len() {
            return Err(OptimError::invalid(
                NAME,
                "milestones",
                format!("{milestones:?}"),
                format!(
                    "expected one fewer milestone than schedulers ({})",
                    schedulers.len()
                ),
            ));
        }
        if milestones.windows(2).any(|w| w[0] > w[1]) {
            return Err(OptimError::invalid(
                NAME,
                "milestones",
                format!("{milestones:?}"),
                "they must be in ascending order",
            ));
        }
        let initial: Vec<f64> = (0..opt.num_groups())
            .map(|i| {
                opt.initial_lr(i)
                    .ok_or_else(|| OptimError::MissingKey(format!("param_groups.{i}.initial_lr")))
            })
            .collect::<Result<_, _>>()?;
        for (i, lr) in initial.into_iter().enumerate() {
            opt.set_lr(i, lr);
        }
        for s in &mut schedulers {
            s.rewind();
        }
        let idx = bisect_right(&milestones, 0);
        schedulers[idx].restart(opt)?;
        let last_lr = schedulers[idx].get_last_lr().to_vec();
        Ok(SequentialLR {
            schedulers,
            milestones,
            last_epoch: 0,
            last_lr,
        })
    }

    /// The schedulers, in order.
    pub fn schedulers(&self) -> &[Box<dyn LrScheduler>] {
        &self.schedulers
    }
}

new_from_try!(
    /// [`SequentialLR::try_new`], panicking on its errors.
    ///
    /// # Panics
    /// On the errors of [`SequentialLR::try_new`].
    SequentialLR,
    (schedulers: Vec<Box<dyn LrScheduler>>, milestones: Vec<i64>)
);

/// Python's `bisect_right`: how many milestones are `<= x`.
fn bisect_right(milestones: &[i64], x: i64) -> usize {
    milestones.iter().filter(|&&m| m <= x).count()
}

impl LrScheduler for SequentialLR {
    fn try_step(&mut self, opt: &mut dyn LrGroups) -> Result<(), OptimError> {
        self.last_epoch += 1;
        let idx = bisect_right(&self.milestones, self.last_epoch);
        let s = &mut self.schedulers[idx];
        if idx > 0 && self.milestones[idx - 1] == self.last_epoch {
            s.jump_to(opt, 0)?;
        } else {
            s.try_step(opt)?;
        }
        self.last_lr = s.get_last_lr().to_vec();
        Ok(())
    }

    fn get_last_lr(&self) -> &[f64] {
        &self.last_lr
    }

    fn last_epoch(&self) -> i64 {
        self.last_epoch
    }

    fn state_dict(&self) -> SchedulerState {
        let mut out = SchedulerState::default();
        out.meta.insert("scheduler".into(), NAME.into());
        out.put("last_epoch", &self.last_epoch);
        out.put("milestones", &self.milestones);
        out.put("last_lr", &self.last_lr);
        put_nested(&mut out, &self.schedulers);
        out
    }

    fn load_state_dict(&mut self, state: &SchedulerState) -> Result<(), OptimError> {
        state.check_kind(NAME)?;
        let subs = nested_states(NAME, state, &OWN_KEYS, self.schedulers.len())?;
        let last_epoch = state.value("last_epoch")?;
        let milestones: Vec<i64> = state.value("milestones")?;
        let last_lr = state.value("last_lr")?;
        if milestones.len() + 1 != self.schedulers.len() {
            return Err(OptimError::BadValue {
                key: "milestones".into(),
                value: state.get("milestones")?.into(),
                expected: "one fewer milestone than schedulers",
            });
        }
        load_all(&mut self.schedulers, &subs)?;
        self.last_epoch = last_epoch;
        self.milestones = milestones;
        self.last_lr = last_lr;
        Ok(())
    }

    fn restart(&mut self, opt: &mut dyn LrGroups) -> Result<(), OptimError> {
        self.try_step(opt)
    }

    fn jump_to(&mut self, opt: &mut dyn LrGroups, epoch: i64) -> Result<(), OptimError> {
        let _ = (opt, epoch);
        Err(OptimError::invalid(
            NAME,
            "milestones",
            epoch,
            "a SequentialLR inside another one cannot start at a milestone (it has no closed form, as in PyTorch)",
        ))
    }

    fn rewind(&mut self) {
        for s in &mut self.schedulers {
            s.rewind();
        }
    }
}

/// Writes the count of `schedulers` and each one's state under
/// `schedulers.<i>.`.
fn put_nested(out: &mut SchedulerState, schedulers: &[Box<dyn LrScheduler>]) {
    out.put("schedulers", &(schedulers.len() as u64));
    for (i, s) in schedulers.iter().enumerate() {
        for (k, v) in s.state_dict().meta {
            out.meta.insert(format!("schedulers.{i}.{k}"), v);
        }
    }
}

/// Splits a state written by [`put_nested`] into the `n` schedulers'
/// states, refusing another count or a key that is neither `own` nor a
/// scheduler's.
fn nested_states(
    name: &'static str,
    state: &SchedulerState,
    own: &[&str],
    n: usize,
) -> Result<Vec<SchedulerState>, OptimError> {
    let count: u64 = state.value("schedulers")?;
    if count as usize != n {
        return Err(OptimError::invalid(
            name,
            "schedulers",
            count,
            format!("this {name} has {n}"),
        ));
    }
    let mut subs: Vec<SchedulerState> = vec![SchedulerState::default(); n];
    for (k, v) in &state.meta {
        if own.contains(&k.as_str()) {
            continue;
        }
        let sub = k
            .strip_prefix("schedulers.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(i, rest)| Some((i.parse::<usize>().ok()?, rest)))
            .filter(|(i, _)| *i < subs.len());
        let Some((i, rest)) = sub else {
            return Err(OptimError::UnexpectedKey {
                key: k.clone(),
                reason: format!("not a setting of {name}"),
            });
        };
        subs[i].meta.insert(rest.to_string(), v.clone());
    }
    Ok(subs)
}

/// Loads each scheduler's state, all or nothing: on a failure the ones
/// already loaded get their previous states back.
fn load_all(
    schedulers: &mut [Box<dyn LrScheduler>],
    subs: &[SchedulerState],
) -> Result<(), OptimError> {
    let saved: Vec<SchedulerState> = schedulers.iter().map(|s| s.state_dict()).collect();
    for (i, sub) in subs.iter().enumerate() {
        if let Err(e) = schedulers[i].load_state_dict(sub) {
            for (s, old) in schedulers.iter_mut().zip(&saved).take(i) {
                // Their own exports always load back.
                let _ = s.load_state_dict(old);
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Steps every scheduler in turn at each step, like
/// `torch.optim.lr_scheduler.ChainedScheduler`: chainable schedulers
/// ([`super::StepLR`], [`super::ExponentialLR`], ...) built on one
/// optimizer compose, each scaling the rate the previous one left.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::{LrGroups, Sgd, SgdOptions};
/// use forma::nn::sched::{ChainedScheduler, ExponentialLR, LrScheduler, StepLR};
///
/// let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(1.0));
/// let step = StepLR::new(&mut opt, 2, 0.5);
/// let decay = ExponentialLR::new(&mut opt, 0.9);
/// let mut sched = ChainedScheduler::new(vec![Box::new(step), Box::new(decay)]);
/// sched.step(&mut opt);
/// sched.step(&mut opt);
/// assert!((opt.lr(0) - 0.5 * 0.9 * 0.9).abs() < 1e-12);
/// ```
#[derive(Debug)]
pub struct ChainedScheduler {
    schedulers: Vec<Box<dyn LrScheduler>>,
    last_lr: Vec<f64>,
}

const CHAINED: &str = "ChainedScheduler";

impl ChainedScheduler {
    /// Chains `schedulers`, all built on the same optimizer, like
    /// `ChainedScheduler(schedulers)`. The last learning rates are the last
    /// scheduler's.
    ///
    /// # Errors
    /// [`OptimError::InvalidOption`] for no scheduler.
    pub fn try_new(schedulers: Vec<Box<dyn LrScheduler>>) -> Result<Self, OptimError> {
        let Some(last) = schedulers.last() else {
            return Err(OptimError::invalid(
                CHAINED,
                "schedulers",
                "[]",
                "it needs at least one scheduler",
            ));
        };
        let last_lr = last.get_last_lr().to_vec();
        Ok(ChainedScheduler {
            schedulers,
            last_lr,
        })
    }

    /// [`ChainedScheduler::try_new`], panicking on its errors.
    ///
    /// # Panics
    /// With no scheduler.
    pub fn new(schedulers: Vec<Box<dyn LrScheduler>>) -> Self {
        Self::try_new(schedulers).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The schedulers, in order.
    pub fn schedulers(&self) -> &[Box<dyn LrScheduler>] {
        &self.schedulers
    }
}

impl LrScheduler for ChainedScheduler {
    fn try_step(&mut self, opt: &mut dyn LrGroups) -> Result<(), OptimError> {
        for s in &mut self.schedulers {
            s.try_step(opt)?;
        }
        self.last_lr = (0..opt.num_groups()).map(|i| opt.lr(i)).collect();
        Ok(())
    }

    fn get_last_lr(&self) -> &[f64] {
        &self.last_lr
    }

    /// The last scheduler's (PyTorch's ChainedScheduler keeps no count of its own).
    fn last_epoch(&self) -> i64 {
        self.schedulers.last().map_or(0, |s| s.last_epoch())
    }

    fn state_dict(&self) -> SchedulerState {
        let mut out = SchedulerState::default();
        out.meta.insert("scheduler".into(), CHAINED.into());
        out.put("last_lr", &self.last_lr);
        put_nested(&mut out, &self.schedulers);
        out
    }

    fn load_state_dict(&mut self, state: &SchedulerState) -> Result<(), OptimError> {
        state.check_kind(CHAINED)?;
        let own = ["scheduler", "last_lr", "schedulers"];
        let subs = nested_states(CHAINED, state, &own, self.schedulers.len())?;
        let last_lr = state.value("last_lr")?;
        load_all(&mut self.schedulers, &subs)?;
        self.last_lr = last_lr;
        Ok(())
    }

    fn restart(&mut self, opt: &mut dyn LrGroups) -> Result<(), OptimError> {
        for s in &mut self.schedulers {
            s.restart(opt)?;
        }
        self.last_lr = (0..opt.num_groups()).map(|i| opt.lr(i)).collect();
        Ok(())
    }

    fn jump_to(&mut self, opt: &mut dyn LrGroups, epoch: i64) -> Result<(), OptimError> {
        let _ = (opt, epoch);
        Err(OptimError::invalid(
            CHAINED,
            "schedulers",
            epoch,
            "a ChainedScheduler inside a SequentialLR cannot start at a milestone (it has no closed form)",
        ))
    }

    fn rewind(&mut self) {
        for s in &mut self.schedulers {
            s.rewind();
        }
    }
}
