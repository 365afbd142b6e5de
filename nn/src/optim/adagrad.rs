//! Adagrad, like `torch.optim.Adagrad`.

use super::fused;
use super::options::options;
use super::{non_negative, Algorithm, Flat, GroupedOptimizer, OptimError, ParamState};
use forma_core::device::Device;

use forma_core::ops::update::{Lane, UpdateOp};
use forma_core::Float;
use forma_cpu::Cpu;

options! {
    /// The options of [`Adagrad`], with `torch.optim.Adagrad`'s defaults.
    ///
    /// Per step `t` (from 1), with `g` the gradient (negated when
    /// `maximize`): `g += weight_decay * p`;
    /// `clr = lr / (1 + (t - 1) * lr_decay)`; `sum += g * g` (starting from
    /// `initial_accumulator_value`); `p -= clr * g / (sqrt(sum) + eps)`.
    AdagradOptions {
        /// Learning rate.
        lr: f64 = 1e-2,
        /// Learning-rate decay per step.
        lr_decay: f64 = 0.0,
        /// L2 penalty added to the gradient.
        weight_decay: f64 = 0.0,
        /// Starting value of the sum of squared gradients.
        initial_accumulator_value: f64 = 0.0,
        /// Added to the denominator for numerical stability.
        eps: f64 = 1e-10,
        /// Maximize the objective instead of minimizing it.
        maximize: bool = false,
    }
}

/// Adagrad, like `torch.optim.Adagrad`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::{Adagrad, AdagradOptions, Optimizer};
///
/// let w = Tensor::<(C<1>,)>::from_vec(vec![1.0], (C,)).unwrap().requires_grad();
/// let mut opt: Adagrad = Adagrad::new(AdagradOptions::default().lr(0.5));
/// (&w * &w).sum_all().backward();
/// opt.step(&w);
/// // sum = 2^2, so the step is lr * 2 / sqrt(4) = lr.
/// assert!((w.to_vec()[0] - 0.5).abs() < 1e-6);
/// ```
pub type Adagrad<E = f32, D = Cpu> = GroupedOptimizer<AdagradOptions, E, D>;

impl Algorithm for AdagradOptions {
    const NAME: &'static str = "Adagrad";
    const BUFFERS: &'static [&'static str] = &["sum"];

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn validate(&self) -> Result<(), OptimError> {
        non_negative("Adagrad", "lr", self.lr)?;
        non_negative("Adagrad", "lr_decay", self.lr_decay)?;
        non_negative("Adagrad", "weight_decay", self.weight_decay)?;
        non_negative(
            "Adagrad",
            "initial_accumulator_value",
            self.initial_accumulator_value,
        )?;
        non_negative("Adagrad", "eps", self.eps)
    }

    fn update<E: Float, D: Device<E>>(
        &self,
        state: &mut ParamState<E, D>,
        param: &Flat<E, D>,
        grad: Flat<E, D>,
    ) -> Result<(), OptimError> {
        state.step += 1;
        let step = state.step as f64;
        let clr = self.lr / (1.0 + (step - 1.0) * self.lr_decay);
        let init = || param.full_like(E::from_f64(self.initial_accumulator_value));
        let op = AdagradStep {
            maximize: self.maximize,
            l2: (self.weight_decay != 0.0).then_some(self.weight_decay),
            eps: self.eps,
            neg_clr: -clr,
        };
        let sum = state.buffer_init("sum", init);
        // `state_sum.addcmul_(grad, grad, value=1)` is `sum + g * 1 * g` in `apply`.
        fused::update(op, &grad, [param, &sum])
    }
}

/// One Adagrad step on one element, `[param, sum]`, in PyTorch's order of
/// operations.
#[derive(Clone, Copy, Debug)]
struct AdagradStep {
    maximize: bool,
    /// The L2 `weight_decay`, when it decays.
    l2: Option<f64>,
    eps: f64,
    neg_clr: f64,
}

impl UpdateOp<2> for AdagradStep {
    const NAME: &'static str = "adagrad";

    #[inline(always)]
    fn apply<R: Lane>(&self, grad: R, state: &mut [R; 2]) {
        let [p, sum] = state;
        let mut g = if self.maximize { -grad } else { grad };
        if let Some(wd) = self.l2 {
            g = g + *p * R::c(wd);
        }
        *sum = *sum + g * R::c(1.0) * g;
        let std = sum.sqrt() + R::c(self.eps);
        *p = *p + g * R::c(self.neg_clr) / std;
    }
}
