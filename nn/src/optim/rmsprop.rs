//! RMSprop, like `torch.optim.RMSprop`: plain, centered, with momentum.

use super::fused::{self, Lerp};
use super::options::options;
use super::{non_negative, Algorithm, Flat, GroupedOptimizer, OptimError, ParamState};
use forma_core::device::Device;

use forma_core::ops::update::{Lane, UpdateOp};
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
        let op = RmsPropStep {
            maximize: self.maximize,
            l2: (self.weight_decay != 0.0).then_some(self.weight_decay),
            alpha: self.alpha,
            one_minus_alpha: 1.0 - self.alpha,
            lerp: Lerp::new::<E>(1.0 - self.alpha),
            centered: self.centered,
            eps: self.eps,
            momentum: self.momentum,
            neg_lr: -self.lr,
        };
        let v = state.buffer_init("square_avg", || param.zeros_like());
        match (self.centered, self.momentum > 0.0) {
            (false, false) => fused::update(op, &grad, [param, &v]),
            (true, false) => {
                let ga = state.buffer_init("grad_avg", || param.zeros_like());
                fused::update(op, &grad, [param, &v, &ga])
            }
            (false, true) => {
                let buf = state.buffer_init("momentum_buffer", || param.zeros_like());
                fused::update(op, &grad, [param, &v, &buf])
            }
            (true, true) => {
                let ga = state.buffer_init("grad_avg", || param.zeros_like());
                let buf = state.buffer_init("momentum_buffer", || param.zeros_like());
                fused::update(op, &grad, [param, &v, &ga, &buf])
            }
        }
    }
}

/// One RMSprop step on one element, in PyTorch's order of operations. The state is `[param, square_avg]`, then
/// `grad_avg` when centered, then `momentum_buffer` with momentum.
#[derive(Clone, Copy, Debug)]
struct RmsPropStep {
    maximize: bool,
    /// The L2 `weight_decay`, when it decays.
    l2: Option<f64>,
    alpha: f64,
    one_minus_alpha: f64,
    lerp: Lerp,
    centered: bool,
    eps: f64,
    momentum: f64,
    neg_lr: f64,
}

impl RmsPropStep {
    /// Updates `square_avg` (and `grad_avg`); returns the gradient and the
    /// denominator `avg`.
    #[inline(always)]
    fn avg<R: Lane>(&self, grad: R, p: R, v: &mut R, ga: Option<&mut R>) -> (R, R) {
        let mut g = if self.maximize { -grad } else { grad };
        if let Some(wd) = self.l2 {
            g = g + p * R::c(wd);
        }
        *v = *v * R::c(self.alpha) + g * R::c(self.one_minus_alpha) * g;
        let avg = match ga {
            Some(ga) => {
                *ga = self.lerp.apply(*ga, g);
                (*v + *ga * R::c(-1.0) * *ga).sqrt()
            }
            None => v.sqrt(),
        };
        (g, avg + R::c(self.eps))
    }

    /// The parameter's update without momentum.
    #[inline(always)]
    fn plain<R: Lane>(&self, p: R, g: R, avg: R) -> R {
        p + g * R::c(self.neg_lr) / avg
    }

    /// The parameter's update with the momentum buffer.
    #[inline(always)]
    fn with_momentum<R: Lane>(&self, p: R, g: R, avg: R, buf: &mut R) -> R {
        *buf = *buf * R::c(self.momentum) + g / avg;
        p + *buf * R::c(self.neg_lr)
    }
}

impl UpdateOp<2> for RmsPropStep {
    const NAME: &'static str = "rmsprop";

    #[inline(always)]
    fn apply<R: Lane>(&self, grad: R, state: &mut [R; 2]) {
        let [p, v] = state;
        let (g, avg) = self.avg(grad, *p, v, None);
        *p = self.plain(*p, g, avg);
    }
}

impl UpdateOp<3> for RmsPropStep {
    const NAME: &'static str = "rmsprop";

    #[inline(always)]
    fn apply<R: Lane>(&self, grad: R, state: &mut [R; 3]) {
        // The third buffer is `grad_avg` when centered, else the momentum.
        let [p, v, x] = state;
        if self.centered {
            let (g, avg) = self.avg(grad, *p, v, Some(x));
            *p = self.plain(*p, g, avg);
        } else {
            let (g, avg) = self.avg(grad, *p, v, None);
            *p = self.with_momentum(*p, g, avg, x);
        }
    }
}

impl UpdateOp<4> for RmsPropStep {
    const NAME: &'static str = "rmsprop";

    #[inline(always)]
    fn apply<R: Lane>(&self, grad: R, state: &mut [R; 4]) {
        let [p, v, ga, buf] = state;
        let (g, avg) = self.avg(grad, *p, v, Some(ga));
        *p = self.with_momentum(*p, g, avg, buf);
    }
}
