//! The 1cycle policy, like `torch.optim.lr_scheduler.OneCycleLR`: the
//! learning rate rises from `max_lr / div_factor` to `max_lr`, then anneals
//! to `initial_lr / final_div_factor`, with the momentum (Adam's `beta1`)
//! cycled inversely.

use super::{at_least_one, new_from_try, rule_plumbing, rule_scheduler, start, Base, Rule};
use crate::optim::options::decode_value;
use crate::optim::{LrGroups, OptimError, OptionValue};
use std::f64::consts::PI;

/// How [`OneCycleLR`] interpolates within a phase (`anneal_strategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Anneal {
    /// Cosine annealing (`"cos"`, PyTorch's default).
    #[default]
    Cos,
    /// Linear annealing (`"linear"`).
    Linear,
}

impl Anneal {
    fn apply(self, start: f64, end: f64, pct: f64) -> f64 {
        match self {
            Anneal::Cos => {
                let cos_out = (PI * pct).cos() + 1.0;
                end + (start - end) / 2.0 * cos_out
            }
            Anneal::Linear => (end - start) * pct + start,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Anneal::Cos => "cos",
            Anneal::Linear => "linear",
        }
    }
}

/// The options of [`OneCycleLR`], with PyTorch's defaults. Per-group values
/// (`max_lr`, `base_momentum`, `max_momentum`) hold one value for every
/// group or one per group.
#[derive(Clone, Debug, PartialEq)]
pub struct OneCycleOptions {
    /// The peak learning rate(s).
    pub max_lr: Vec<f64>,
    /// The number of steps in the cycle (PyTorch's `total_steps`, or
    /// `epochs * steps_per_epoch`).
    pub total_steps: u64,
    /// The fraction of the cycle spent raising the learning rate.
    pub pct_start: f64,
    /// Cosine or linear annealing.
    pub anneal_strategy: Anneal,
    /// Cycle the momentum (Adam's `beta1`) inversely to the learning rate.
    pub cycle_momentum: bool,
    /// The lowest momentum (at the learning rate's peak).
    pub base_momentum: Vec<f64>,
    /// The highest momentum (at the start and the end).
    pub max_momentum: Vec<f64>,
    /// `initial_lr = max_lr / div_factor`.
    pub div_factor: f64,
    /// `min_lr = initial_lr / final_div_factor`.
    pub final_div_factor: f64,
    /// Three phases (up, down to `initial_lr`, then down to `min_lr`) as in
    /// the paper, instead of fastai's two.
    pub three_phase: bool,
}

impl OneCycleOptions {
    /// A cycle of `total_steps` steps peaking at `max_lr`, with PyTorch's
    /// other defaults (`pct_start` 0.3, cosine, momentum cycled between 0.85
    /// and 0.95, `div_factor` 25, `final_div_factor` 1e4, two phases).
    pub fn new(max_lr: f64, total_steps: u64) -> Self {
        OneCycleOptions {
            max_lr: vec![max_lr],
            total_steps,
            pct_start: 0.3,
            anneal_strategy: Anneal::Cos,
            cycle_momentum: true,
            base_momentum: vec![0.85],
            max_momentum: vec![0.95],
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
        }
    }

    /// Sets one peak learning rate per group.
    #[must_use]
    pub fn max_lrs(mut self, max_lrs: Vec<f64>) -> Self {
        self.max_lr = max_lrs;
        self
    }

    /// Sets `pct_start`.
    #[must_use]
    pub fn pct_start(mut self, pct_start: f64) -> Self {
        self.pct_start = pct_start;
        self
    }

    /// Sets the annealing strategy.
    #[must_use]
    pub fn anneal_strategy(mut self, anneal: Anneal) -> Self {
        self.anneal_strategy = anneal;
        self
    }

    /// Sets `cycle_momentum`.
    #[must_use]
    pub fn cycle_momentum(mut self, cycle: bool) -> Self {
        self.cycle_momentum = cycle;
        self
    }

    /// Sets the momentum range `[base, max]` for every group.
    #[must_use]
    pub fn momentum_range(mut self, base: f64, max: f64) -> Self {
        self.base_momentum = vec![base];
        self.max_momentum = vec![max];
        self
    }

    /// Sets `div_factor`.
    #[must_use]
    pub fn div_factor(mut self, div_factor: f64) -> Self {
        self.div_factor = div_factor;
        self
    }

    /// Sets `final_div_factor`.
    #[must_use]
    pub fn final_div_factor(mut self, final_div_factor: f64) -> Self {
        self.final_div_factor = final_div_factor;
        self
    }

    /// Sets `three_phase`.
    #[must_use]
    pub fn three_phase(mut self, three_phase: bool) -> Self {
        self.three_phase = three_phase;
        self
    }
}

/// One phase: where it ends and which per-group values it moves between
/// (indices into [`Group::lrs`] and [`Group::momenta`]).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Phase {
    end_step: f64,
    lr: (usize, usize),
    momentum: (usize, usize),
}

// Indices of the per-group learning rates and momenta.
const INITIAL: usize = 0;
const MAX: usize = 1;
const MIN: usize = 2;
const BASE_M: usize = 0;
const MAX_M: usize = 1;

/// The per-group values PyTorch keeps in the optimizer's groups
/// (`initial_lr`, `max_lr`, `min_lr`, `base_momentum`, `max_momentum`).
#[derive(Clone, Debug, PartialEq)]
struct Group {
    lrs: [f64; 3],
    momenta: [f64; 2],
}

/// The 1cycle learning-rate policy, like
/// `torch.optim.lr_scheduler.OneCycleLR`; step it after every batch.
/// Not chainable: each step sets the learning rates from the schedule alone.
///
/// With `cycle_momentum` (the default) it also sets each group's momentum
/// (SGD's and RMSprop's `momentum`, Adam's and AdamW's `beta1`) at every
/// step, as PyTorch does; an optimizer without momentum (Adagrad) needs
/// `cycle_momentum(false)`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::{Sgd, SgdOptions};
/// use forma::nn::sched::{LrScheduler, OneCycleLR, OneCycleOptions};
///
/// let mut opt: Sgd = Sgd::new(SgdOptions::default().momentum(0.9));
/// let mut sched = OneCycleLR::new(&mut opt, OneCycleOptions::new(1.0, 10));
/// assert!((sched.get_last_lr()[0] - 0.04).abs() < 1e-12);     // max_lr / 25
/// for _ in 0..2 {
///     sched.step(&mut opt);
/// }
/// assert!((sched.get_last_lr()[0] - 1.0).abs() < 1e-12);      // the peak, at 30%
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct OneCycleLR {
    base: Base,
    total_steps: u64,
    phases: Vec<Phase>,
    anneal: Anneal,
    cycle_momentum: bool,
    groups: Vec<Group>,
    options: OneCycleOptions,
}

fn per_group(name: &'static str, v: &[f64], n: usize) -> Result<Vec<f64>, OptimError> {
    match v.len() {
        1 => Ok(vec![v[0]; n]),
        k if k == n => Ok(v.to_vec()),
        k => Err(OptimError::invalid(
            "OneCycleLR",
            name,
            format!("{v:?}"),
            format!("expected one value or one per group ({n}), got {k}"),
        )),
    }
}

fn phases(total_steps: u64, pct_start: f64, three_phase: bool) -> Vec<Phase> {
    let total = total_steps as f64;
    if three_phase {
        vec![
            Phase {
                end_step: pct_start * total - 1.0,
                lr: (INITIAL, MAX),
                momentum: (MAX_M, BASE_M),
            },
            Phase {
                end_step: 2.0 * pct_start * total - 2.0,
                lr: (MAX, INITIAL),
                momentum: (BASE_M, MAX_M),
            },
            Phase {
                end_step: total - 1.0,
                lr: (INITIAL, MIN),
                momentum: (MAX_M, MAX_M),
            },
        ]
    } else {
        vec![
            Phase {
                end_step: pct_start * total - 1.0,
                lr: (INITIAL, MAX),
                momentum: (MAX_M, BASE_M),
            },
            Phase {
                end_step: total - 1.0,
                lr: (MAX, MIN),
                momentum: (BASE_M, MAX_M),
            },
        ]
    }
}

impl OneCycleLR {
    /// Attaches to `opt` as `OneCycleLR(opt, ...)` does: sets each group's
    /// `initial_lr` to `max_lr / div_factor` (and its momentum to
    /// `max_momentum` when cycling it) and takes the initial step.
    ///
    /// # Errors
    /// [`OptimError::InvalidOption`] for `total_steps == 0`, `pct_start`
    /// outside `[0, 1]`, a per-group list of the wrong length, or momentum
    /// cycling on an optimizer without momentum.
    pub fn try_new(opt: &mut dyn LrGroups, options: OneCycleOptions) -> Result<Self, OptimError> {
        let o = &options;
        at_least_one("OneCycleLR", "total_steps", o.total_steps)?;
        if !(0.0..=1.0).contains(&o.pct_start) {
            return Err(OptimError::invalid(
                "OneCycleLR",
                "pct_start",
                o.pct_start,
                "it must be in [0, 1]",
            ));
        }
        let n = opt.num_groups();
        let max_lrs = per_group("max_lr", &o.max_lr, n)?;
        let max_m = per_group("max_momentum", &o.max_momentum, n)?;
        let base_m = per_group("base_momentum", &o.base_momentum, n)?;
        if o.cycle_momentum && (0..n).any(|i| opt.momentum(i).is_none()) {
            return Err(OptimError::invalid(
                "OneCycleLR",
                "cycle_momentum",
                true,
                "the optimizer has no momentum or beta1 to cycle",
            ));
        }
        let mut groups = Vec::with_capacity(n);
        for i in 0..n {
            let initial = max_lrs[i] / o.div_factor;
            opt.set_initial_lr(i, initial);
            if o.cycle_momentum {
                opt.set_momentum(i, max_m[i]);
            }
            groups.push(Group {
                lrs: [initial, max_lrs[i], initial / o.final_div_factor],
                momenta: [base_m[i], max_m[i]],
            });
        }
        start(opt, |base| OneCycleLR {
            base,
            total_steps: o.total_steps,
            phases: phases(o.total_steps, o.pct_start, o.three_phase),
            anneal: o.anneal_strategy,
            cycle_momentum: o.cycle_momentum,
            groups,
            options: options.clone(),
        })
    }
}

new_from_try!(
    /// [`OneCycleLR::try_new`], panicking on an invalid option.
    ///
    /// # Panics
    /// On the errors of [`OneCycleLR::try_new`].
    OneCycleLR,
    (options: OneCycleOptions)
);

impl Rule for OneCycleLR {
    const NAME: &'static str = "OneCycleLR";
    rule_plumbing!();

    fn get_lr(&mut self, opt: &mut dyn LrGroups, _initial: bool) -> Result<Vec<f64>, OptimError> {
        let step = self.base.last_epoch;
        if step > self.total_steps as i64 {
            return Err(OptimError::PastTheEnd {
                owner: "OneCycleLR",
                step,
                total: self.total_steps,
            });
        }
        let step = step as f64;
        let mut lrs = Vec::with_capacity(self.groups.len());
        for (i, g) in self.groups.iter().enumerate() {
            let mut start_step = 0.0;
            let last = self.phases.len() - 1;
            for (k, phase) in self.phases.iter().enumerate() {
                if step <= phase.end_step || k == last {
                    let pct = (step - start_step) / (phase.end_step - start_step);
                    lrs.push(self.anneal.apply(g.lrs[phase.lr.0], g.lrs[phase.lr.1], pct));
                    if self.cycle_momentum {
                        let m = self.anneal.apply(
                            g.momenta[phase.momentum.0],
                            g.momenta[phase.momentum.1],
                            pct,
                        );
                        opt.set_momentum(i, m);
                    }
                    break;
                }
                start_step = phase.end_step;
            }
        }
        Ok(lrs)
    }

    fn config(&self) -> Vec<(&'static str, String)> {
        let per = |f: &dyn Fn(&Group) -> f64| self.groups.iter().map(f).collect::<Vec<f64>>();
        vec![
            ("total_steps", self.total_steps.encode()),
            ("pct_start", self.options.pct_start.encode()),
            ("three_phase", self.options.three_phase.encode()),
            ("anneal_strategy", self.anneal.name().to_string()),
            ("cycle_momentum", self.cycle_momentum.encode()),
            ("initial_lr", per(&|g| g.lrs[INITIAL]).encode()),
            ("max_lr", per(&|g| g.lrs[MAX]).encode()),
            ("min_lr", per(&|g| g.lrs[MIN]).encode()),
            ("base_momentum", per(&|g| g.momenta[BASE_M]).encode()),
            ("max_momentum", per(&|g| g.momenta[MAX_M]).encode()),
        ]
    }

    fn set_config(&mut self, name: &str, text: &str) -> Result<bool, OptimError> {
        let n = self.groups.len();
        let list = || -> Result<Vec<f64>, OptimError> {
            let v: Vec<f64> = decode_value(name, text)?;
            if v.len() != n {
                return Err(OptimError::GroupCount {
                    what: "OneCycleLR state",
                    expected: n,
                    found: v.len(),
                });
            }
            Ok(v)
        };
        match name {
            "total_steps" => self.total_steps = decode_value(name, text)?,
            "pct_start" => self.options.pct_start = decode_value(name, text)?,
            "three_phase" => self.options.three_phase = decode_value(name, text)?,
            "cycle_momentum" => self.cycle_momentum = decode_value(name, text)?,
            "anneal_strategy" => {
                self.anneal = match text {
                    "cos" => Anneal::Cos,
                    "linear" => Anneal::Linear,
                    _ => {
                        return Err(OptimError::BadValue {
                            key: name.into(),
                            value: text.into(),
                            expected: "`cos` or `linear`",
                        })
                    }
                }
            }
            "initial_lr" | "max_lr" | "min_lr" => {
                let k = match name {
                    "initial_lr" => INITIAL,
                    "max_lr" => MAX,
                    _ => MIN,
                };
                let values = list()?;
                for (g, v) in self.groups.iter_mut().zip(values) {
                    g.lrs[k] = v;
                }
            }
            "base_momentum" | "max_momentum" => {
                let k = if name == "base_momentum" {
                    BASE_M
                } else {
                    MAX_M
                };
                let values = list()?;
                for (g, v) in self.groups.iter_mut().zip(values) {
                    g.momenta[k] = v;
                }
            }
            _ => return Ok(false),
        }
        // The phases follow from the (possibly restored) length and shape.
        self.options.total_steps = self.total_steps;
        self.phases = phases(
            self.total_steps,
            self.options.pct_start,
            self.options.three_phase,
        );
        Ok(true)
    }
}

rule_scheduler!(OneCycleLR);
