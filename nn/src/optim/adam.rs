//! Adam and AdamW (decoupled weight decay), like `torch.optim.Adam` and
//! `torch.optim.AdamW`, with AMSGrad.

use super::fused::{self, Lerp};
use super::options::options;
use super::{non_negative, Algorithm, Flat, GroupedOptimizer, OptimError, ParamState};
use forma_core::device::Device;

use forma_core::ops::update::{Lane, UpdateOp};
use forma_core::Float;
use forma_cpu::Cpu;

options! {
    /// The options of [`Adam`], with `torch.optim.Adam`'s defaults.
    ///
    /// Per step `t` (from 1), with `g` the gradient (negated when
    /// `maximize`): `g += weight_decay * p`;
    /// `m = lerp(m, g, 1 - beta1)`; `v = beta2 * v + (1 - beta2) * g * g`;
    /// with AMSGrad `v_max = max(v_max, v)` replaces `v` below;
    /// `p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)`.
    AdamOptions {
        /// Learning rate.
        lr: f64 = 1e-3,
        /// Decay rates of the first and second moment averages.
        betas: (f64, f64) = (0.9, 0.999),
        /// Added to the denominator for numerical stability.
        eps: f64 = 1e-8,
        /// L2 penalty added to the gradient.
        weight_decay: f64 = 0.0,
        /// The AMSGrad variant (normalize by the running maximum of `v`).
        amsgrad: bool = false,
        /// Maximize the objective instead of minimizing it.
        maximize: bool = false,
    }
}

options! {
    /// The options of [`AdamW`], with `torch.optim.AdamW`'s defaults: Adam's
    /// update, with weight decay applied to the parameter
    /// (`p *= 1 - lr * weight_decay`) before it instead of to the gradient.
    AdamWOptions {
        /// Learning rate.
        lr: f64 = 1e-3,
        /// Decay rates of the first and second moment averages.
        betas: (f64, f64) = (0.9, 0.999),
        /// Added to the denominator for numerical stability.
        eps: f64 = 1e-8,
        /// Decoupled weight decay coefficient.
        weight_decay: f64 = 1e-2,
        /// The AMSGrad variant (normalize by the running maximum of `v`).
        amsgrad: bool = false,
        /// Maximize the objective instead of minimizing it.
        maximize: bool = false,
    }
}

/// Adam, like `torch.optim.Adam`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::{Adam, AdamOptions, Optimizer};
///
/// let w = Tensor::<(C<2>,)>::from_vec(vec![1.0, -2.0], (C,)).unwrap().requires_grad();
/// let mut opt: Adam = Adam::new(AdamOptions::default().lr(0.1));
/// (&w * &w).sum_all().backward();
/// opt.step(&w);
/// // The first step moves each weight by about `lr` against its gradient's sign.
/// let v = w.to_vec();
/// assert!((v[0] - 0.9).abs() < 1e-6 && (v[1] + 1.9).abs() < 1e-6);
/// ```
pub type Adam<E = f32, D = Cpu> = GroupedOptimizer<AdamOptions, E, D>;

/// AdamW, like `torch.optim.AdamW`: Adam with decoupled weight decay.
pub type AdamW<E = f32, D = Cpu> = GroupedOptimizer<AdamWOptions, E, D>;

/// The options both variants share, and which weight decay they apply.
struct Rule {
    owner: &'static str,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    amsgrad: bool,
    maximize: bool,
    decoupled: bool,
}

const BUFFERS: &[&str] = &["exp_avg", "exp_avg_sq", "max_exp_avg_sq"];

impl Rule {
    fn validate(&self) -> Result<(), OptimError> {
        non_negative(self.owner, "lr", self.lr)?;
        non_negative(self.owner, "eps", self.eps)?;
        non_negative(self.owner, "weight_decay", self.weight_decay)?;
        for (name, b) in [("beta1", self.betas.0), ("beta2", self.betas.1)] {
            if !(0.0..1.0).contains(&b) {
                return Err(OptimError::invalid(
                    self.owner,
                    name,
                    b,
                    "it must be in [0, 1)",
                ));
            }
        }
        Ok(())
    }

    fn update<E: Float, D: Device<E>>(
        &self,
        state: &mut ParamState<E, D>,
        param: &Flat<E, D>,
        grad: Flat<E, D>,
    ) -> Result<(), OptimError> {
        let (beta1, beta2) = self.betas;
        state.step += 1;
        // PyTorch reads the step back as a Python float.
        let step = state.step as f64;
        let bias_correction1 = 1.0 - beta1.powf(step);
        let bias_correction2 = 1.0 - beta2.powf(step);
        let step_size = self.lr / bias_correction1;
        let bias_correction2_sqrt = bias_correction2.powf(0.5);
        let op = AdamStep {
            maximize: self.maximize,
            decay: (self.weight_decay != 0.0 && self.decoupled)
                .then_some(1.0 - self.lr * self.weight_decay),
            l2: (self.weight_decay != 0.0 && !self.decoupled).then_some(self.weight_decay),
            lerp: Lerp::new::<E>(1.0 - beta1),
            beta2,
            one_minus_beta2: 1.0 - beta2,
            bias_correction2_sqrt,
            eps: self.eps,
            neg_step_size: -step_size,
        };
        let m = state.buffer_init("exp_avg", || param.zeros_like());
        let v = state.buffer_init("exp_avg_sq", || param.zeros_like());
        if self.amsgrad {
            let max = state.buffer_init("max_exp_avg_sq", || param.zeros_like());
            fused::update(op, &grad, [param, &m, &v, &max])
        } else {
            fused::update(op, &grad, [param, &m, &v])
        }
    }
}

/// One Adam step on one element, in PyTorch's order of operations. The state is `[param, exp_avg, exp_avg_sq]`, and
/// `max_exp_avg_sq` last with AMSGrad.
#[derive(Clone, Copy, Debug)]
struct AdamStep {
    maximize: bool,
    /// AdamW's `1 - lr * weight_decay`, when it decays.
    decay: Option<f64>,
    /// Adam's L2 `weight_decay`, when it decays.
    l2: Option<f64>,
    lerp: Lerp,
    beta2: f64,
    one_minus_beta2: f64,
    bias_correction2_sqrt: f64,
    eps: f64,
    neg_step_size: f64,
}

impl AdamStep {
    /// The moments' update; returns the (decayed) parameter.
    #[inline(always)]
    fn moments<R: Lane>(&self, grad: R, p: R, m: &mut R, v: &mut R) -> R {
        let mut g = if self.maximize { -grad } else { grad };
        let mut p = p;
        if let Some(d) = self.decay {
            p = p * R::c(d);
        }
        if let Some(wd) = self.l2 {
            g = g + p * R::c(wd);
        }
        *m = self.lerp.apply(*m, g);
        *v = *v * R::c(self.beta2) + g * R::c(self.one_minus_beta2) * g;
        p
    }

    /// The parameter's update from the decayed parameter, `exp_avg` and the
    /// second moment used.
    #[inline(always)]
    fn param<R: Lane>(&self, p: R, m: R, second: R) -> R {
        let denom = second.sqrt() / R::c(self.bias_correction2_sqrt) + R::c(self.eps);
        p + m * R::c(self.neg_step_size) / denom
    }
}

impl UpdateOp<3> for AdamStep {
    const NAME: &'static str = "adam";

    #[inline(always)]
    fn apply<R: Lane>(&self, grad: R, state: &mut [R; 3]) {
        let [p, m, v] = state;
        let q = self.moments(grad, *p, m, v);
        *p = self.param(q, *m, *v);
    }
}

impl UpdateOp<4> for AdamStep {
    const NAME: &'static str = "adam";

    #[inline(always)]
    fn apply<R: Lane>(&self, grad: R, state: &mut [R; 4]) {
        let [p, m, v, max] = state;
        let q = self.moments(grad, *p, m, v);
        *max = max.maximum(*v);
        *p = self.param(q, *m, *max);
    }
}

macro_rules! adam_algorithm {
    ($options:ident, $name:literal, $decoupled:literal) => {
        impl $options {
            fn rule(&self) -> Rule {
                Rule {
                    owner: $name,
                    lr: self.lr,
                    betas: self.betas,
                    eps: self.eps,
                    weight_decay: self.weight_decay,
                    amsgrad: self.amsgrad,
                    maximize: self.maximize,
                    decoupled: $decoupled,
                }
            }
        }

        impl Algorithm for $options {
            const NAME: &'static str = $name;
            const BUFFERS: &'static [&'static str] = BUFFERS;

            fn lr(&self) -> f64 {
                self.lr
            }

            fn set_lr(&mut self, lr: f64) {
                self.lr = lr;
            }

            fn momentum(&self) -> Option<f64> {
                Some(self.betas.0)
            }

            fn set_momentum(&mut self, momentum: f64) {
                self.betas.0 = momentum;
            }

            fn validate(&self) -> Result<(), OptimError> {
                self.rule().validate()
            }

            fn update<E: Float, D: Device<E>>(
                &self,
                state: &mut ParamState<E, D>,
                param: &Flat<E, D>,
                grad: Flat<E, D>,
            ) -> Result<(), OptimError> {
                self.rule().update(state, param, grad)
            }
        }
    };
}

adam_algorithm!(AdamOptions, "Adam", false);
adam_algorithm!(AdamWOptions, "AdamW", true);
