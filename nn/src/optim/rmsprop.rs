//! RMSprop, like `torch.optim.RMSprop`: plain, centered, with momentum.

use super::options::options;
use super::{lerp, non_negative, Algorithm, Flat, GroupedOptimizer, OptimError, ParamState};
use forma_core::device::Device;
use forma_core::Float;
use forma_cpu::Cpu;

options! {
    /// The options of [`RmsProp`], with `torch.optim.RMSprop`'s defaults.
    ///
    /// Per step, with `g` the gradient (negated when `maximize`):
    /// `g += weight_decay * p`; `v = alpha * v + (1 - alpha) * g * g`;
    /// centered: `ga = lerp(ga, g, 1 - alpha)` and `avg = sqrt(v - ga * ga)`,
    /// else `avg = sqrt(v)`; `avg += eps`; with momentum
    /// `buf = momentum * buf + g / avg` and `p -= lr * buf`, else
    /// `p -= lr * g / avg`.
    RmsPropOptions {
        /// Learning rate.
        lr: f64 = 1e-2,
        /// Smoothing constant of the squared-gradient average.
        alpha: f64 = 0.99,
        /// Added to the denominator for numerical stability.
        eps: f64 = 1e-8,
        /// L2 penalty added to the gradient.
        weight_decay: f64 = 0.0,
        /// Momentum factor.
        momentum: f64 = 0.0,
        /// Normalize by an estimate of the gradient's variance.
        centered: bool = false,
        /// Maximize the objective instead of minimizing it.
        maximize: bool = false,
    }
}

/// RMSprop, like `torch.optim.RMSprop`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::optim::{Optimizer, RmsProp, RmsPropOptions};
///
/// let w = Tensor::<(C<1>,)>::from_vec(vec![1.0], (C,)).unwrap().requires_grad();
/// let mut opt: RmsProp = RmsProp::new(RmsPropOptions::default().lr(0.01));
/// (&w * &w).sum_all().backward();
/// opt.step(&w);
/// // v = 0.01 * 2^2, so the step is lr * 2 / sqrt(0.04) = 10 * lr.
/// assert!((w.to_vec()[0] - 0.9).abs() < 1e-6);
/// ```
pub type RmsProp<E = f32, D = Cpu> = GroupedOptimizer<RmsPropOptions, E, D>;

impl Algorithm for RmsPropOptions {
    const NAME: &'static str = "RMSprop";
    const BUFFERS: &'static [&'static str] = &["square_avg", "grad_avg", "momentum_buffer"];

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
        non_negative("RMSprop", "lr", self.lr)?;
        non_negative("RMSprop", "eps", self.eps)?;
        non_negative("RMSprop", "momentum", self.momentum)?;
        non_negative("RMSprop", "weight_decay", self.weight_decay)?;
        non_negative("RMSprop", "alpha", self.alpha)
    }

    fn update<E: Float, D: Device<E>>(
        &self,
        state: &mut ParamState<E, D>,
        param: &Flat<E, D>,
        grad: Flat<E, D>,
    ) -> Result<(), OptimError> {
        state.step += 1;
        let mut g = if self.maximize { -&grad } else { grad };
        if self.weight_decay != 0.0 {
            g = &g + &param.mul_scalar(self.weight_decay);
        }
        let v = state.buffer_or("square_avg", || param.zeros_like());
        let v = &v.mul_scalar(self.alpha) + &(&g.mul_scalar(1.0 - self.alpha) * &g);
        let avg = if self.centered {
            let ga = state.buffer_or("grad_avg", || param.zeros_like());
            let ga = lerp(&ga, &g, 1.0 - self.alpha);
            // `square_avg.addcmul(grad_avg, grad_avg, value=-1)`.
            let avg = (&v + &(&ga.mul_scalar(-1.0) * &ga)).sqrt();
            state.set_buffer("grad_avg", ga);
            avg
        } else {
            v.sqrt()
        };
        let avg = avg.add_scalar(self.eps);
        let p = if self.momentum > 0.0 {
            let buf = state.buffer_or("momentum_buffer", || param.zeros_like());
            let buf = &buf.mul_scalar(self.momentum) + &(&g / &avg);
            let p = param + &buf.mul_scalar(-self.lr);
            state.set_buffer("momentum_buffer", buf);
            p
        } else {
            param + &(&g.mul_scalar(-self.lr) / &avg)
        };
        param.try_assign(&p)?;
        state.set_buffer("square_avg", v);
        Ok(())
    }
}
