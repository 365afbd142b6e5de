//! `BatchNorm2d` and `LayerNorm`, like PyTorch's.

use super::{filled, restore};
use crate::{Forward, Training};
use forma_core::device::Device;
use forma_core::tape::no_grad;
use forma_core::{Dim, Dyn, Float, One, Tensor, C};
use forma_cpu::Cpu;
use forma_macros::Module;

/// Formats a float like Python's `repr` (`1e-05`, `0.1`, `1.0`), as PyTorch's
/// reprs print hyper-parameters.
pub(crate) fn py_float(x: f64) -> String {
    if x != 0.0 && (x.abs() < 1e-4 || x.abs() >= 1e16) {
        let s = format!("{x:e}");
        match s.split_once('e') {
            Some((m, e)) => {
                let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
                format!("{m}e{sign}{digits:0>2}")
            }
            None => s,
        }
    } else if x.fract() == 0.0 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

/// Batch normalisation over the channels of `[n, CH, h, w]`, like
/// `nn.BatchNorm2d(CH)`: `weight` (ones) and `bias` (zeros) are parameters;
/// `running_mean`, `running_var` and `num_batches_tracked` are buffers. In
/// training mode it normalises with the batch statistics and updates the
/// running ones (momentum 0.1, unbiased variance); in eval mode it uses the
/// running statistics.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::BatchNorm2d, Forward, Module};
/// let bn = BatchNorm2d::<3>::new(&Cpu);
/// let keys: Vec<String> = bn.state_dict().keys().map(String::from).collect();
/// assert_eq!(keys, ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]);
/// ```
#[derive(Module, Clone, Debug)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct BatchNorm2d<const CH: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// The scale `gamma`, `[CH]`.
    pub weight: Tensor<(C<CH>,), E, D>,
    /// The shift `beta`, `[CH]`.
    pub bias: Tensor<(C<CH>,), E, D>,
    /// Running mean per channel.
    #[module(buffer)]
    pub running_mean: Tensor<(C<CH>,), E, D>,
    /// Running (unbiased) variance per channel.
    #[module(buffer)]
    pub running_var: Tensor<(C<CH>,), E, D>,
    /// Number of training batches seen.
    #[module(buffer)]
    pub num_batches_tracked: Tensor<(), i64, D>,
    /// Weight of the newest batch in the running statistics.
    pub momentum: f64,
    /// Added to the variance for stability.
    pub eps: f64,
    /// Train/eval mode.
    pub training: Training,
}

impl<const CH: usize, E: Float, D: Device<E>> BatchNorm2d<CH, E, D> {
    /// A layer with PyTorch's defaults (eps 1e-5, momentum 0.1).
    pub fn new(device: &D) -> Self {
        BatchNorm2d {
            weight: filled((C,), 1.0, device).requires_grad(),
            bias: filled((C,), 0.0, device).requires_grad(),
            running_mean: filled((C,), 0.0, device),
            running_var: filled((C,), 1.0, device),
            num_batches_tracked: Tensor::full_on((), 0, device),
            momentum: 0.1,
            eps: 1e-5,
            training: Training::default(),
        }
    }

    fn extra_repr(&self) -> String {
        format!(
            "{CH}, eps={}, momentum={}, affine=True, bias=True, track_running_stats=True",
            py_float(self.eps),
            py_float(self.momentum)
        )
    }
}

impl<B: Dim, H: Dim, W: Dim, const CH: usize, E: Float, D: Device<E>>
    Forward<Tensor<(B, C<CH>, H, W), E, D>, Tensor<(B, C<CH>, H, W), E, D>>
    for BatchNorm2d<CH, E, D>
{
    fn forward(&self, x: Tensor<(B, C<CH>, H, W), E, D>) -> Tensor<(B, C<CH>, H, W), E, D> {
        let x = x.into_dyn();
        let per_channel =
            |t: &Tensor<(C<CH>,), E, D>| t.into_dyn().unsqueeze::<1>().unsqueeze::<2>();
        let (mean, var) = if self.training.is_on() {
            let mean = x
                .mean_keepdim::<0>()
                .mean_keepdim::<2>()
                .mean_keepdim::<3>();
            let diff = &x - &mean;
            let var = (&diff * &diff)
                .mean_keepdim::<0>()
                .mean_keepdim::<2>()
                .mean_keepdim::<3>();
            self.update_running_stats(&mean, &var, x.numel() / CH);
            (mean, var)
        } else {
            (
                per_channel(&self.running_mean).unsqueeze::<0>(),
                per_channel(&self.running_var).unsqueeze::<0>(),
            )
        };
        let scale = &var.add_scalar(self.eps).rsqrt() * &per_channel(&self.weight);
        restore(&(&x - &mean) * &scale + per_channel(&self.bias))
    }
}

impl<const CH: usize, E: Float, D: Device<E>> BatchNorm2d<CH, E, D> {
    /// Folds a batch's statistics into the running ones (outside the graph).
    fn update_running_stats(
        &self,
        mean: &Tensor<(One, Dyn, One, One), E, D>,
        var: &Tensor<(One, Dyn, One, One), E, D>,
        n: usize,
    ) {
        let _g = no_grad();
        let unbiased = n as f64 / (n.max(2) - 1) as f64;
        let m = self.momentum;
        let mean_c: Tensor<(C<CH>,), E, D> = mean.detach().reshape();
        let var_c: Tensor<(C<CH>,), E, D> = var.detach().reshape::<(C<CH>,)>().mul_scalar(unbiased);
        let rm = &self.running_mean.mul_scalar(1.0 - m) + &mean_c.mul_scalar(m);
        let rv = &self.running_var.mul_scalar(1.0 - m) + &var_c.mul_scalar(m);
        self.running_mean.assign(&rm);
        self.running_var.assign(&rv);
        let seen = self.num_batches_tracked.item() + 1;
        let seen = Tensor::full_on((), seen, self.num_batches_tracked.device());
        self.num_batches_tracked.assign(&seen);
    }
}

/// Layer normalisation over the last axis (of size `N`), like
/// `nn.LayerNorm(N)`: `weight` (ones) and `bias` (zeros), eps 1e-5.
#[derive(Module, Clone, Debug)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct LayerNorm<const N: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// The scale, `[N]`.
    pub weight: Tensor<(C<N>,), E, D>,
    /// The shift, `[N]`.
    pub bias: Tensor<(C<N>,), E, D>,
    /// Added to the variance for stability.
    pub eps: f64,
}

impl<const N: usize, E: Float, D: Device<E>> LayerNorm<N, E, D> {
    /// A layer with PyTorch's defaults.
    pub fn new(device: &D) -> Self {
        LayerNorm {
            weight: filled((C,), 1.0, device).requires_grad(),
            bias: filled((C,), 0.0, device).requires_grad(),
            eps: 1e-5,
        }
    }

    fn extra_repr(&self) -> String {
        format!(
            "({N},), eps={}, elementwise_affine=True, bias=True",
            py_float(self.eps)
        )
    }
}

macro_rules! layer_norm_forward {
    ($last:literal; $($d:ident),*) => {
        impl<$($d: Dim,)* const N: usize, E: Float, D: Device<E>>
            Forward<Tensor<($($d,)* C<N>,), E, D>, Tensor<($($d,)* C<N>,), E, D>> for LayerNorm<N, E, D>
        {
            fn forward(&self, x: Tensor<($($d,)* C<N>,), E, D>) -> Tensor<($($d,)* C<N>,), E, D> {
                let x = x.into_dyn();
                let mean = x.mean_keepdim::<$last>();
                let var = x.var_keepdim::<$last>(false);
                let xhat = &(&x - &mean) * &var.add_scalar(self.eps).rsqrt();
                restore(&(&xhat * &self.weight.into_dyn()) + &self.bias.into_dyn())
            }
        }
    };
}

layer_norm_forward!(0;);
layer_norm_forward!(1; A);
layer_norm_forward!(2; A, B);
layer_norm_forward!(3; A, B, F);

#[cfg(test)]
mod tests {
    use super::py_float;

    #[test]
    fn floats_print_like_python() {
        assert_eq!(py_float(1e-5), "1e-05");
        assert_eq!(py_float(0.1), "0.1");
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(1e-12), "1e-12");
    }
}
