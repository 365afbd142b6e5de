//! Stochastic gradient descent with momentum, dampening, Nesterov momentum
//! and weight decay, like `torch.optim.SGD`.

use super::options::options;
use super::{non_negative, Algorithm, Flat, GroupedOptimizer, OptimError, ParamState};
use forma_core::device::Device;
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
        let mut g = if self.maximize { -&grad } else { grad };
        if self.weight_decay != 0.0 {
            g = &g + &param.mul_scalar(self.weight_decay);
        }
        if self.momentum != 0.0 {
            let buf = match state.buffer("momentum_buffer") {
                None => g.clone(),
                Some(b) => &b.mul_scalar(self.momentum) + &g.mul_scalar(1.0 - self.dampening),
            };
            g = if self.nesterov {
                &g + &buf.mul_scalar(self.momentum)
            } else {
                buf.clone()
            };
            state.set_buffer("momentum_buffer", buf);
        }
        param.try_assign(&(param + &g.mul_scalar(-self.lr)))?;
        state.step += 1;
        Ok(())
    }
}
