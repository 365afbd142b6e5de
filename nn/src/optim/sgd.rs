//! Stochastic gradient descent with momentum, dampening, Nesterov momentum
//! and weight decay, like `torch.optim.SGD`.

use super::fused;
use super::options::options;
use super::{non_negative, Algorithm, Flat, GroupedOptimizer, OptimError, ParamState};
use forma_core::device::Device;
use forma_core::ops::update::{Lane, UpdateOp};
use forma_core::Float;
use forma_cpu::Cpu;

options! {
    /// The options of [`Sgd`], with `torch.optim.SGD`'s defaults.
    ///
    /// Per step, with `g` the gradient (negated when `maximize`):
    /// `g += weight_decay * p`; with momentum, `buf = g` at the first step and
    /// `buf = momentum * buf + (1 - dampening) * g` after, then
    /// `g = g + momentum * buf` (Nesterov) or `g = buf`; finally `p -= lr * g`.
    SgdOptions {
        /// Learning rate.
        lr: f64 = 1e-3,
        /// Momentum factor.
        momentum: f64 = 0.0,
        /// Dampening for momentum.
        dampening: f64 = 0.0,
        /// L2 penalty added to the gradient.
        weight_decay: f64 = 0.0,
        /// Nesterov momentum (needs `momentum > 0` and `dampening == 0`).
        nesterov: bool = false,
        /// Maximize the objective instead of minimizing it.
        maximize: bool = false,
    }
}

/// SGD, like `torch.optim.SGD`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::{Optimizer, Sgd, SgdOptions};
///
/// // One parameter, loss = sum(w^2): the gradient is 2w.
/// let w = Tensor::<(C<2>,)>::from_vec(vec![1.0, -2.0], (C,)).unwrap().requires_grad();
/// let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(0.25));
/// (&w * &w).sum_all().backward();
/// opt.step(&w);
/// assert_eq!(w.to_vec(), [0.5, -1.0]);   // w - 0.25 * 2w
/// ```
pub type Sgd<E = f32, D = Cpu> = GroupedOptimizer<SgdOptions, E, D>;

impl Algorithm for SgdOptions {
    const NAME: &'static str = "SGD";
    const BUFFERS: &'static [&'static str] = &["momentum_buffer"];

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn momentum(&self) -> Option<f64> {
        Some(self.momentum)
    }

    fn set_momentum(&mut self, momentum: f64) {
        self.momentum = momentum;
    }

    fn validate(&self) -> Result<(), OptimError> {
        non_negative("SGD", "lr", self.lr)?;
        non_negative("SGD", "momentum", self.momentum)?;
        non_negative("SGD", "weight_decay", self.weight_decay)?;
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(OptimError::invalid(
                "SGD",
                "nesterov",
                true,
                "Nesterov momentum requires a momentum and zero dampening",
            ));
        }
        Ok(())
    }

    fn update<E: Float, D: Device<E>>(
        &self,
        state: &mut ParamState<E, D>,
        param: &Flat<E, D>,
        grad: Flat<E, D>,
    ) -> Result<(), OptimError> {
        state.step += 1;
        // PyTorch's first step copies the gradient into the buffer.
        let first = state.buffer("momentum_buffer").is_none();
        let op = SgdStep {
            maximize: self.maximize,
            l2: (self.weight_decay != 0.0).then_some(self.weight_decay),
            momentum: self.momentum,
            one_minus_dampening: 1.0 - self.dampening,
            first,
            nesterov: self.nesterov,
            neg_lr: -self.lr,
        };
        if self.momentum != 0.0 {
            let buf = state.buffer_init("momentum_buffer", || param.zeros_like());
            fused::update(op, &grad, [param, &buf])
        } else {
            fused::update(op, &grad, [param])
        }
    }
}

/// One SGD step on one element, in PyTorch's order of operations. The state is `[param]`, and `momentum_buffer`
/// second with momentum.
#[derive(Clone, Copy, Debug)]
struct SgdStep {
    maximize: bool,
    /// The L2 `weight_decay`, when it decays.
    l2: Option<f64>,
    momentum: f64,
    one_minus_dampening: f64,
    /// The buffer's first step, which sets it to the gradient.
    first: bool,
    nesterov: bool,
    neg_lr: f64,
}

impl SgdStep {
    /// The gradient after maximize and weight decay.
    #[inline(always)]
    fn grad<R: Lane>(&self, grad: R, p: R) -> R {
        let g = if self.maximize { -grad } else { grad };
        match self.l2 {
            Some(wd) => g + p * R::c(wd),
            None => g,
        }
    }
}

impl UpdateOp<1> for SgdStep {
    const NAME: &'static str = "sgd";

    #[inline(always)]
    fn apply<R: Lane>(&self, grad: R, state: &mut [R; 1]) {
        let [p] = state;
        let g = self.grad(grad, *p);
        *p = *p + g * R::c(self.neg_lr);
    }
}

impl UpdateOp<2> for SgdStep {
    const NAME: &'static str = "sgd";

    #[inline(always)]
    fn apply<R: Lane>(&self, grad: R, state: &mut [R; 2]) {
        let [p, buf] = state;
        let g = self.grad(grad, *p);
        *buf = if self.first {
            g
        } else {
            *buf * R::c(self.momentum) + g * R::c(self.one_minus_dampening)
        };
        let g = if self.nesterov {
            g + *buf * R::c(self.momentum)
        } else {
            *buf
        };
        *p = *p + g * R::c(self.neg_lr);
    }
}
