//! Optimizers (SGD, Adam, AdamW, RMSprop, Adagrad) with parameter groups,
//! and gradient clipping, with PyTorch's update formulas and step counting
//! (its default single-tensor CPU path).
//!
//! An optimizer does not own the model: [`Optimizer::step`] takes it, walks
//! its parameters ([`crate::module::parameters`]) and updates each in place
//! from its accumulated gradient. Parameter groups select parameters by their
//! dotted names ([`Select`]); state is kept per parameter name, so
//! [`Optimizer::state_dict`] exports it as named tensors plus plain values
//! that [`Optimizer::load_state_dict`] takes back for a bit-identical resume.
//!
//! Each rule is written once, as a per-element [`UpdateOp`]
//! (`forma_core::ops::update`). On the CPU, f32 and f64 parameters are
//! updated by one fused pass over the parameter, its gradient and its
//! buffers, in place ([`forma_core::Tensor::try_fused_update`]); elsewhere
//! (other devices, half types) the same rule runs as composed tensor ops
//! ([`forma_core::Tensor::try_composed_update`]). The two give the same bits.
//!
//! [`UpdateOp`]: forma_core::ops::update::UpdateOp
//!
//! ```
//! use forma::prelude::*;
//! use forma::nn::layers::Linear;
//! use forma::nn::optim::{Optimizer, Sgd, SgdOptions};
//!
//! let mut rng = Rng::seed_from(0);
//! let model = Linear::<2, 1>::new(&Cpu, &mut rng);
//! let mut opt = Sgd::new(SgdOptions::default().lr(0.1).momentum(0.9));
//! let x = Tensor::<(Dyn, C<2>)>::from_vec(vec![1., 2., 3., 4.], (Dyn(2), C)).unwrap();
//! let before = model.weight.to_vec();
//! for _ in 0..3 {
//!     opt.zero_grad(&model);
//!     let loss = model.forward(x.clone()).square().mean_all();
//!     loss.backward();
//!     opt.step(&model);
//! }
//! assert_ne!(model.weight.to_vec(), before);
//! ```

mod adagrad;
mod adam;
mod clip;
mod error;
mod fused;
mod group;
mod grouped;
pub(crate) mod options;
mod rmsprop;
mod scaler;
mod sgd;

pub use adagrad::{Adagrad, AdagradOptions};
pub use adam::{Adam, AdamOptions, AdamW, AdamWOptions};
pub use clip::{
    clip_grad_norm_, clip_grad_norm_on, clip_grad_norm_with, clip_grad_value_, clip_grad_value_on,
};
pub use error::OptimError;
pub use group::{ParamGroup, Select};
pub use grouped::{Flat, GroupedOptimizer, NewOptimizer, ParamState};
pub use options::{OptionFields, OptionValue};
pub use rmsprop::{RmsProp, RmsPropOptions};
pub use scaler::GradScaler;
pub use sgd::{Sgd, SgdOptions};

use crate::module::Module;
use crate::state::StateDict;
use forma_core::device::Device;
use forma_core::Float;
use std::collections::BTreeMap;

/// The learning rate (and momentum) of each parameter group: what
/// schedulers ([`crate::sched`]) read and write. Group indices follow the
/// order the groups were given in.
///
/// # Panics
/// Each method panics for a group index out of range, like slice indexing.
pub trait LrGroups {
    /// Number of parameter groups.
    fn num_groups(&self) -> usize;
    /// The learning rate of `group`.
    fn lr(&self, group: usize) -> f64;
    /// Sets the learning rate of `group`.
    fn set_lr(&mut self, group: usize, lr: f64);
    /// The learning rate a scheduler started from, PyTorch's
    /// `group["initial_lr"]` (set by the first scheduler attached).
    fn initial_lr(&self, group: usize) -> Option<f64>;
    /// Sets `group["initial_lr"]`.
    fn set_initial_lr(&mut self, group: usize, lr: f64);
    /// The momentum of `group` (`beta1` for Adam and AdamW; `None` for an
    /// optimizer without one, Adagrad).
    fn momentum(&self, group: usize) -> Option<f64>;
    /// Sets the momentum of `group` (`beta1` for Adam); ignored by an
    /// optimizer without one.
    fn set_momentum(&mut self, group: usize, momentum: f64);
}

/// An optimizer over a model's parameters, like `torch.optim.Optimizer`.
pub trait Optimizer: LrGroups {
    /// Updates every parameter of `model` that has a gradient, in place,
    /// like `optimizer.step()`.
    ///
    /// # Errors
    /// An option made invalid since construction, a loaded state whose
    /// sizes do not fit the parameter, or a device failure. Nothing is
    /// written when an option or a state is refused.
    fn try_step<M: Module>(&mut self, model: &M) -> Result<(), OptimError>;

    /// [`Optimizer::try_step`], panicking on its errors.
    ///
    /// # Panics
    /// When [`Optimizer::try_step`] fails.
    fn step<M: Module>(&mut self, model: &M) {
        if let Err(e) = self.try_step(model) {
            panic!("optimizer step: {e}");
        }
    }

    /// Clears the gradient of every parameter of `model`, like
    /// `optimizer.zero_grad()` (PyTorch's default `set_to_none=True`).
    fn zero_grad<M: Module>(&self, model: &M) {
        model.zero_grad();
    }

    /// The optimizer's state: per-parameter buffers and step counts, and
    /// every group's options, like `optimizer.state_dict()`.
    ///
    /// # Errors
    /// A device copy failed.
    fn try_state_dict(&self) -> Result<OptimizerState, OptimError>;

    /// [`Optimizer::try_state_dict`], panicking on a device failure.
    ///
    /// # Panics
    /// When a device copy fails.
    fn state_dict(&self) -> OptimizerState {
        self.try_state_dict()
            .unwrap_or_else(|e| panic!("optimizer state_dict: {e}"))
    }

    /// Restores a state exported by [`Optimizer::state_dict`] of the same
    /// kind of optimizer with the same number of groups, like
    /// `optimizer.load_state_dict(sd)`: group options (learning rates
    /// included), step counts and buffers, uploaded next to `model`'s
    /// parameters. The groups' selections stay this optimizer's own.
    ///
    /// With a scheduler, as in PyTorch: build the optimizer, then the
    /// scheduler (which sets the learning rates), then load the optimizer's
    /// state, then the scheduler's.
    ///
    /// # Errors
    /// Another kind of optimizer, another number of groups, a missing or
    /// unparsable option, an entry for a parameter `model` lacks, or a buffer
    /// of the wrong size. Nothing is changed on error.
    fn load_state_dict<M: Module>(
        &mut self,
        model: &M,
        state: &OptimizerState,
    ) -> Result<(), OptimError>;
}

/// An optimizer's exported state.
///
/// - `tensors`: `state.<param>.<buffer>` (e.g. `state.fc.weight.exp_avg`),
///   each flat (one row of the parameter's element count) in the
///   parameter's dtype;
/// - `meta`: plain values as text, which a checkpoint can keep in its
///   header: `optimizer` (the kind, `SGD`, `Adam`, ...), `param_groups`
///   (the count), `param_groups.<i>.<option>` (every option of every group,
///   and `initial_lr` when a scheduler set it) and `state.<param>.step`.
///
/// Numbers are written in their shortest exact form, so an export and
/// import round-trips bit for bit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptimizerState {
    /// Per-parameter buffers.
    pub tensors: StateDict,
    /// Plain values (kind, group options, step counts) as text.
    pub meta: BTreeMap<String, String>,
}

/// An update rule with its options: what makes a [`GroupedOptimizer`] SGD or
/// Adam. The options struct implements it.
pub trait Algorithm: OptionFields + Clone + std::fmt::Debug + Send + Sync + 'static {
    /// PyTorch's class name (`SGD`, `Adam`, ...), recorded in exported state.
    const NAME: &'static str;
    /// The names of the per-parameter buffers the rule may keep.
    const BUFFERS: &'static [&'static str];

    /// The learning rate.
    fn lr(&self) -> f64;
    /// Sets the learning rate.
    fn set_lr(&mut self, lr: f64);
    /// The momentum (Adam's `beta1`), if the rule has one.
    fn momentum(&self) -> Option<f64> {
        None
    }
    /// Sets the momentum (Adam's `beta1`); ignored by a rule without one.
    fn set_momentum(&mut self, momentum: f64) {
        let _ = momentum;
    }

    /// Checks the options as PyTorch's constructor does.
    ///
    /// # Errors
    /// [`OptimError::InvalidOption`] for the first invalid option.
    fn validate(&self) -> Result<(), OptimError>;

    /// One step for one parameter: `param` and the buffers of its `state`
    /// updated in place from `grad` (by `fused::update`, which runs the
    /// rule fused or composed).
    /// Runs under no-grad.
    ///
    /// # Errors
    /// A device failure.
    fn update<E: Float, D: Device<E>>(
        &self,
        state: &mut ParamState<E, D>,
        param: &Flat<E, D>,
        grad: Flat<E, D>,
    ) -> Result<(), OptimError>;
}

/// Checks `value >= 0` (and not NaN), PyTorch's usual option check.
pub(crate) fn non_negative(
    owner: &'static str,
    option: &'static str,
    value: f64,
) -> Result<(), OptimError> {
    if value >= 0.0 {
        Ok(())
    } else {
        Err(OptimError::invalid(owner, option, value, "it must be >= 0"))
    }
}

/// A Python float as PyTorch's kernels see it for element type `E`: in the
/// kernels' compute type (f32 for f32, f16 and bf16; f64 for f64), back as an
/// exact f64.
pub(crate) fn kernel_scalar<E: Float>(v: f64) -> f64 {
    if E::DTYPE == forma_core::DType::F64 {
        v
    } else {
        f64::from(v as f32)
    }
}

#[cfg(test)]
mod fused_tests;
#[cfg(test)]
mod tests;
