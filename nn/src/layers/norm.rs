//! Normalisation layers: `BatchNorm1d`, `BatchNorm2d`, `LayerNorm`,
//! `GroupNorm` and `RMSNorm`, like PyTorch's.

use super::{filled, restore};
use crate::module::py_float;
use crate::{Forward, Training};
use forma_core::device::Device;
use forma_core::shape::check::ConstMsg;
use forma_core::tape::no_grad;
use forma_core::{Dim, Dtype, Dyn, Float, Result, Tensor, C};
use forma_cpu::Cpu;
use forma_macros::Module;

/// The constructor arguments of a batch-norm layer besides its channels,
/// with PyTorch's defaults: `eps=1e-5`, `momentum=0.1` (`None`: a
/// cumulative average, `1 / num_batches_tracked`), `affine=True`,
/// `bias=True`, `track_running_stats=True`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::layers::{BatchNorm2d, BatchNormOptions};
/// use forma::nn::Module;
/// let options = BatchNormOptions { affine: false, track_running_stats: false, ..BatchNormOptions::default() };
/// let bn = BatchNorm2d::<3>::with_options(options, &Cpu);
/// assert!(bn.state_dict().is_empty());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormOptions {
    /// Added to the variance for stability.
    pub eps: f64,
    /// Weight of the newest batch in the running statistics; `None` for
    /// their cumulative average.
    pub momentum: Option<f64>,
    /// Whether the layer has a per-channel `weight` (and `bias`).
    pub affine: bool,
    /// Whether an affine layer has a `bias`.
    pub bias: bool,
    /// Whether the layer keeps running statistics (and uses them in eval
    /// mode); without them it normalises with the batch's statistics in
    /// both modes.
    pub track_running_stats: bool,
}

impl Default for BatchNormOptions {
    fn default() -> Self {
        BatchNormOptions {
            eps: 1e-5,
            momentum: Some(0.1),
            affine: true,
            bias: true,
            track_running_stats: true,
        }
    }
}

/// Defines a batch-norm layer: `BatchNorm1d` and `BatchNorm2d` hold the same
/// parameters, buffers and settings and differ only in the inputs they take
/// (their `Forward` impls).
macro_rules! batch_norm_layer {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Module, Clone, Debug)]
        #[module(crate = "crate", extra_repr = "Self::extra_repr")]
        pub struct $name<const CH: usize, E: Float = f32, D: Device<E> = Cpu> {
            /// The scale `gamma`, `[CH]`; absent for `affine=False`.
            pub weight: Option<Tensor<(C<CH>,), E, D>>,
            /// The shift `beta`, `[CH]`; absent for `affine=False` or
            /// `bias=False`.
            pub bias: Option<Tensor<(C<CH>,), E, D>>,
            /// Running mean per channel; absent for
            /// `track_running_stats=False`.
            #[module(buffer)]
            pub running_mean: Option<Tensor<(C<CH>,), E, D>>,
            /// Running (unbiased) variance per channel; absent for
            /// `track_running_stats=False`.
            #[module(buffer)]
            pub running_var: Option<Tensor<(C<CH>,), E, D>>,
            /// Number of training batches seen; absent for
            /// `track_running_stats=False`.
            #[module(buffer)]
            pub num_batches_tracked: Option<Tensor<(), i64, D>>,
            /// Weight of the newest batch in the running statistics; `None`
            /// for their cumulative average.
            pub momentum: Option<f64>,
            /// Added to the variance for stability.
            pub eps: f64,
            /// Train/eval mode.
            pub training: Training,
        }

        impl<const CH: usize, E: Float, D: Device<E>> $name<CH, E, D> {
            /// A layer with PyTorch's defaults (eps 1e-5, momentum 0.1).
            pub fn new(device: &D) -> Self {
                Self::with_options(BatchNormOptions::default(), device)
            }

            /// A layer with the given options (see [`BatchNormOptions`]).
            pub fn with_options(options: BatchNormOptions, device: &D) -> Self {
                let affine = options.affine;
                let stats = options.track_running_stats;
                $name {
                    weight: affine.then(|| filled((C,), 1.0, device).requires_grad()),
                    bias: (affine && options.bias)
                        .then(|| filled((C,), 0.0, device).requires_grad()),
                    running_mean: stats.then(|| filled((C,), 0.0, device)),
                    running_var: stats.then(|| filled((C,), 1.0, device)),
                    num_batches_tracked: stats.then(|| Tensor::full_on((), 0, device)),
                    momentum: options.momentum,
                    eps: options.eps,
                    training: Training::default(),
                }
            }

            fn extra_repr(&self) -> String {
                let py_bool = |b: bool| if b { "True" } else { "False" };
                let momentum = self.momentum.map_or_else(|| "None".to_string(), py_float);
                format!(
                    "{CH}, eps={}, momentum={momentum}, affine={}, bias={}, track_running_stats={}",
                    py_float(self.eps),
                    py_bool(self.weight.is_some()),
                    py_bool(self.bias.is_some()),
                    py_bool(self.running_mean.is_some()),
                )
            }

            /// Batch normalisation of `x` as `[n, CH, h, w]` with this
            /// layer's parameters and running statistics; counts the batch
            /// in training mode.
            fn norm(
                &self,
                x: Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>,
            ) -> Result<Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>> {
                let training = self.training.is_on();
                // PyTorch counts the batch first: a cumulative average
                // (`momentum=None`) weighs it by one over the new count.
                let seen = match (&self.num_batches_tracked, training) {
                    (Some(n), true) => Some(n.try_to_vec()?[0] + 1),
                    _ => None,
                };
                let momentum = match (self.momentum, seen) {
                    (Some(m), _) => m,
                    (None, Some(seen)) => 1.0 / seen as f64,
                    (None, None) => 0.0,
                };
                // Without running statistics the batch's are used in both modes.
                let y = batch_norm(
                    x,
                    self.running_mean.as_ref(),
                    self.running_var.as_ref(),
                    self.weight.as_ref(),
                    self.bias.as_ref(),
                    training || self.running_mean.is_none(),
                    momentum,
                    self.eps,
                )?;
                if let (Some(n), Some(seen)) = (&self.num_batches_tracked, seen) {
                    n.try_assign(&Tensor::full_on((), seen, n.device()))?;
                }
                Ok(y)
            }
        }
    };
}

batch_norm_layer!(
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
    BatchNorm2d
);

impl<B: Dim, H: Dim, W: Dim, const CH: usize, E: Float, D: Device<E>>
    Forward<Tensor<(B, C<CH>, H, W), E, D>, Tensor<(B, C<CH>, H, W), E, D>>
    for BatchNorm2d<CH, E, D>
{
    fn try_forward(
        &self,
        x: Tensor<(B, C<CH>, H, W), E, D>,
    ) -> Result<Tensor<(B, C<CH>, H, W), E, D>> {
        Ok(restore(self.norm(x.into_dyn())?))
    }
}

/// Batch normalisation of `x`, `[n, channels, h, w]` (a `[n, channels]` or
/// `[n, channels, l]` input viewed as `[n, channels, l, 1]`), like
/// `torch.nn.functional.batch_norm(x, running_mean, running_var, weight,
/// bias, training, momentum, eps)`: in training mode with the batch's
/// statistics over every axis but the channels (the biased variance),
/// folded into `running_mean` and `running_var` in place where given
/// (`running = (1 - momentum) running + momentum batch`, the variance
/// unbiased, outside the graph); in eval mode with the running statistics.
/// Then scaled by `weight` and shifted by `bias` (per channel) where given.
/// The layers ([`BatchNorm1d`], [`BatchNorm2d`]) call it and count the batch
/// in `num_batches_tracked` themselves, as PyTorch's do.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::functional::batch_norm;
/// let x = Tensor::<(Dyn, Dyn, Dyn, Dyn), f64>::from_vec(vec![1., 10., 3., 30.], (Dyn(2), Dyn(2), Dyn(1), Dyn(1))).unwrap();
/// let (mean, var) = (Tensor::<(C<2>,), f64>::zeros_with((C,)), Tensor::<(C<2>,), f64>::ones_with((C,)));
/// let y = batch_norm(x.clone(), Some(&mean), Some(&var), None, None, true, 0.1, 1e-5).unwrap();
/// assert!((y.to_vec()[0] + 1.0).abs() < 1e-4); // (1 - 2) / sqrt(1 + eps)
/// assert_eq!(mean.to_vec(), [0.2, 2.0]);
/// // Without running statistics (nothing to infer the channel type from).
/// let y = batch_norm::<Dyn, _, _>(x, None, None, None, None, true, 0.1, 1e-5).unwrap();
/// assert!((y.to_vec()[0] + 1.0).abs() < 1e-4);
/// ```
///
/// # Errors
/// When the statistics, `weight` or `bias` do not have one value per
/// channel of `x`, or in eval mode without running statistics.
#[allow(clippy::too_many_arguments)] // PyTorch's signature
pub fn batch_norm<Ch: Dim, E: Float, D: Device<E>>(
    x: Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>,
    running_mean: Option<&Tensor<(Ch,), E, D>>,
    running_var: Option<&Tensor<(Ch,), E, D>>,
    weight: Option<&Tensor<(Ch,), E, D>>,
    bias: Option<&Tensor<(Ch,), E, D>>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>> {
    let per_channel = |t: &Tensor<(Ch,), E, D>| t.into_dyn().unsqueeze::<1>().unsqueeze::<2>();
    if training && !forma_core::graph::capturing() {
        // One node on the tape, three passes each way (see
        // `Tensor::try_batch_norm_train`); a capture records the composed
        // ops below, which export knows.
        let (n, c, h, w) = x.shape();
        let x3 = x.try_reshape_to((n, c, Dyn(h.size() * w.size())))?;
        let bn = x3.try_batch_norm_train(
            weight.map(Tensor::into_dyn).as_ref(),
            bias.map(Tensor::into_dyn).as_ref(),
            eps,
        )?;
        if let (Some(rm), Some(rv)) = (running_mean, running_var) {
            let count = n.size() * h.size() * w.size();
            update_running_stats(rm, rv, &bn.mean, &bn.var, momentum, count)?;
        }
        return bn.out.try_reshape_to((n, c, h, w));
    }
    let (mean, var) = if training {
        let mean = x
            .mean_keepdim::<0>()
            .mean_keepdim::<2>()
            .mean_keepdim::<3>();
        let diff = &x - &mean;
        let var = (&diff * &diff)
            .mean_keepdim::<0>()
            .mean_keepdim::<2>()
            .mean_keepdim::<3>();
        let n = x.numel() / x.size(1).max(1);
        if let (Some(rm), Some(rv)) = (running_mean, running_var) {
            let ch = (Dyn(x.size(1)),);
            let (m, v) = (mean.try_reshape_to(ch)?, var.try_reshape_to(ch)?);
            update_running_stats(rm, rv, &m, &v, momentum, n)?;
        }
        (mean, var)
    } else {
        match (running_mean, running_var) {
            (Some(rm), Some(rv)) => (
                per_channel(rm).unsqueeze::<0>(),
                per_channel(rv).unsqueeze::<0>(),
            ),
            _ => {
                return Err(forma_core::Error::invalid(
                    "batch_norm",
                    "eval mode (training = false) needs running_mean and running_var",
                ))
            }
        }
    };
    let inv_std = var.add_scalar(eps).rsqrt();
    if let (Some(w), Some(b), false) = (weight, bias, forma_core::graph::capturing()) {
        // One pass over `x` instead of three (the same bits in f32 and
        // f64; rounded once in f16 and bf16, as PyTorch's kernel does). A
        // capture records the composed ops, which the compile passes fold.
        let scale = &inv_std * &per_channel(w);
        let shift = per_channel(b);
        return forma_core::ops::fused::try_fused((&x, &mean, &scale, &shift), |(x, m, s, b)| {
            (x - m) * s + b
        });
    }
    let y = match weight {
        Some(w) => &(&x - &mean) * &(&inv_std * &per_channel(w)),
        None => &(&x - &mean) * &inv_std,
    };
    Ok(match bias {
        Some(b) => y + per_channel(b),
        None => y,
    })
}

/// Folds a batch's statistics into the running ones (outside the graph):
/// momentum-weighted, with the unbiased variance over the `n` values per
/// channel, as PyTorch does.
fn update_running_stats<Ch: Dim, E: Float, D: Device<E>>(
    running_mean: &Tensor<(Ch,), E, D>,
    running_var: &Tensor<(Ch,), E, D>,
    mean: &Tensor<(Dyn,), E, D>,
    var: &Tensor<(Dyn,), E, D>,
    m: f64,
    n: usize,
) -> Result<()> {
    let _g = no_grad();
    let unbiased = n as f64 / (n.max(2) - 1) as f64;
    let mean_c = mean.detach();
    let var_c = var.detach().mul_scalar(unbiased);
    let rm = &running_mean.into_dyn().mul_scalar(1.0 - m) + &mean_c.mul_scalar(m);
    let rv = &running_var.into_dyn().mul_scalar(1.0 - m) + &var_c.mul_scalar(m);
    running_mean.try_assign(&rm)?;
    running_var.try_assign(&rv)
}

batch_norm_layer!(
    /// Batch normalisation over the channels of `[n, CH]` or `[n, CH, l]`, like
    /// `nn.BatchNorm1d(CH)`: the same parameters (`weight` ones, `bias` zeros),
    /// buffers (`running_mean`, `running_var`, `num_batches_tracked`) and modes
    /// as [`BatchNorm2d`]; the statistics run over the batch (and the length).
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::{layers::BatchNorm1d, Forward, Module};
    /// let mut bn = BatchNorm1d::<2, f64>::new(&Cpu);
    /// let x = Tensor::<(Dyn, C<2>), f64>::from_vec(vec![1., 10., 3., 30.], (Dyn(2), C)).unwrap();
    /// let y = bn.forward(x);
    /// assert!((y.to_vec()[0] + 1.0).abs() < 1e-4); // (1 - 2) / sqrt(1 + eps)
    /// assert_eq!(bn.running_mean.as_ref().unwrap().to_vec(), [0.2, 2.0]);
    /// bn.eval();
    /// ```
    BatchNorm1d
);

impl<B: Dim, const CH: usize, E: Float, D: Device<E>>
    Forward<Tensor<(B, C<CH>), E, D>, Tensor<(B, C<CH>), E, D>> for BatchNorm1d<CH, E, D>
{
    fn try_forward(&self, x: Tensor<(B, C<CH>), E, D>) -> Result<Tensor<(B, C<CH>), E, D>> {
        let shape = x.shape();
        let x4 = x.try_reshape_to((Dyn(shape.0.size()), Dyn(CH), Dyn(1), Dyn(1)))?;
        self.norm(x4)?.try_reshape_to(shape)
    }
}

impl<B: Dim, L: Dim, const CH: usize, E: Float, D: Device<E>>
    Forward<Tensor<(B, C<CH>, L), E, D>, Tensor<(B, C<CH>, L), E, D>> for BatchNorm1d<CH, E, D>
{
    fn try_forward(&self, x: Tensor<(B, C<CH>, L), E, D>) -> Result<Tensor<(B, C<CH>, L), E, D>> {
        let (shape, d) = (x.shape(), x.dims());
        let x4 = x.try_reshape_to((Dyn(d[0]), Dyn(CH), Dyn(d[2]), Dyn(1)))?;
        self.norm(x4)?.try_reshape_to(shape)
    }
}

/// Layer normalisation over the last axis (of size `N`), like
/// `nn.LayerNorm(N)`: `weight` (ones) and `bias` (zeros), eps 1e-5;
/// [`LayerNorm::with_options`] gives `elementwise_affine=False` (neither)
/// and `bias=False` (the weight alone).
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::LayerNorm, Forward, Module};
/// let norm = LayerNorm::<2, f64>::with_options(1e-5, true, false, &Cpu);
/// assert_eq!(norm.repr(), "LayerNorm((2,), eps=1e-05, elementwise_affine=True, bias=False)");
/// assert_eq!(norm.state_dict().keys().collect::<Vec<_>>(), ["weight"]);
/// let y = norm.forward(Tensor::<(C<2>,), f64>::from_vec(vec![1.0, 3.0], (C,)).unwrap());
/// assert!((y.to_vec()[1] - 1.0).abs() < 1e-4);
/// ```
#[derive(Module, Clone, Debug)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct LayerNorm<const N: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// The scale, `[N]`; absent for `elementwise_affine=False`.
    pub weight: Option<Tensor<(C<N>,), E, D>>,
    /// The shift, `[N]`; absent for `elementwise_affine=False` or
    /// `bias=False`.
    pub bias: Option<Tensor<(C<N>,), E, D>>,
    /// Added to the variance for stability.
    pub eps: f64,
}

impl<const N: usize, E: Float, D: Device<E>> LayerNorm<N, E, D> {
    /// A layer with PyTorch's defaults.
    pub fn new(device: &D) -> Self {
        Self::with_options(1e-5, true, true, device)
    }

    /// A layer with the given `eps`, with or without the affine parameters
    /// (`elementwise_affine`) and, when affine, with or without the bias.
    pub fn with_options(eps: f64, elementwise_affine: bool, bias: bool, device: &D) -> Self {
        LayerNorm {
            weight: elementwise_affine.then(|| filled((C,), 1.0, device).requires_grad()),
            bias: (elementwise_affine && bias).then(|| filled((C,), 0.0, device).requires_grad()),
            eps,
        }
    }

    fn extra_repr(&self) -> String {
        let py_bool = |b: bool| if b { "True" } else { "False" };
        format!(
            "({N},), eps={}, elementwise_affine={}, bias={}",
            py_float(self.eps),
            py_bool(self.weight.is_some()),
            py_bool(self.bias.is_some()),
        )
    }
}

macro_rules! layer_norm_forward {
    ($($d:ident),*) => {
        impl<$($d: Dim,)* const N: usize, E: Float, D: Device<E>>
            Forward<Tensor<($($d,)* C<N>,), E, D>, Tensor<($($d,)* C<N>,), E, D>> for LayerNorm<N, E, D>
        {
            fn try_forward(&self, x: Tensor<($($d,)* C<N>,), E, D>) -> Result<Tensor<($($d,)* C<N>,), E, D>> {
                let weight = self.weight.as_ref().map(Tensor::into_dyn);
                let bias = self.bias.as_ref().map(Tensor::into_dyn);
                x.try_layer_norm(weight.as_ref(), bias.as_ref(), self.eps)
            }
        }
    };
}

layer_norm_forward!();
layer_norm_forward!(A);
layer_norm_forward!(A, B);
layer_norm_forward!(A, B, F);

/// Group normalisation, like `nn.GroupNorm(G, CH)`: the `CH` channels of
/// `[n, CH, ...]` split into `G` groups, each normalised over its channels and
/// every position with its own mean and (biased) variance; then a per-channel
/// `weight` (ones) and `bias` (zeros) when affine. Statistics never run, so
/// train and eval mode agree. `G` must divide `CH` (checked when built).
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::GroupNorm, Forward, Module};
/// let gn = GroupNorm::<2, 4>::new(&Cpu);
/// assert_eq!(gn.repr(), "GroupNorm(2, 4, eps=1e-05, affine=True, bias=True)");
/// let x = Tensor::<(Dyn, C<4>, C<3>)>::randn((Dyn(2), C, C), &mut Rng::seed_from(0));
/// let y = gn.forward(x);
/// let first: f32 = y.to_vec()[..6].iter().sum(); // group 0 of image 0 has mean 0
/// assert!(first.abs() < 1e-5);
/// ```
#[derive(Module, Clone, Debug)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct GroupNorm<const G: usize, const CH: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// The per-channel scale, `[CH]`; absent for `affine=False`.
    pub weight: Option<Tensor<(C<CH>,), E, D>>,
    /// The per-channel shift, `[CH]`; absent for `affine=False`.
    pub bias: Option<Tensor<(C<CH>,), E, D>>,
    /// Added to the variance for stability.
    pub eps: f64,
}

impl<const G: usize, const CH: usize, E: Float, D: Device<E>> GroupNorm<G, CH, E, D> {
    const GROUPS_DIVIDE: () = if G == 0 || !CH.is_multiple_of(G) {
        ConstMsg::new()
            .s("GroupNorm: ")
            .n(CH)
            .s(" channels cannot be split into ")
            .n(G)
            .s(" groups of equal size")
            .panic()
    };

    /// A layer with PyTorch's defaults (eps 1e-5, affine).
    pub fn new(device: &D) -> Self {
        Self::with_options(1e-5, true, device)
    }

    /// A layer with the given `eps`, with or without the affine parameters.
    pub fn with_options(eps: f64, affine: bool, device: &D) -> Self {
        let () = Self::GROUPS_DIVIDE;
        GroupNorm {
            weight: affine.then(|| filled((C,), 1.0, device).requires_grad()),
            bias: affine.then(|| filled((C,), 0.0, device).requires_grad()),
            eps,
        }
    }

    fn extra_repr(&self) -> String {
        let affine = if self.weight.is_some() {
            "True"
        } else {
            "False"
        };
        let bias = if self.bias.is_some() { "True" } else { "False" };
        format!(
            "{G}, {CH}, eps={}, affine={affine}, bias={bias}",
            py_float(self.eps)
        )
    }

    /// Normalises `[n, CH, m]` (the trailing axes flattened into `m`).
    fn norm(&self, x: Tensor<(Dyn, Dyn, Dyn), E, D>) -> Result<Tensor<(Dyn, Dyn, Dyn), E, D>> {
        let () = Self::GROUPS_DIVIDE;
        let shape = x.shape();
        let (n, m) = (x.dims()[0], x.dims()[2]);
        let xg = x.try_reshape_to((Dyn(n), Dyn(G), Dyn(CH / G * m)))?;
        let mean = xg.mean_keepdim::<2>();
        let var = xg.var_keepdim::<2>(false);
        let xhat = &(&xg - &mean) * &var.add_scalar(self.eps).rsqrt();
        let y = xhat.try_reshape_to(shape)?;
        let per_channel = |t: &Tensor<(C<CH>,), E, D>| t.into_dyn().unsqueeze::<1>();
        let y = match &self.weight {
            Some(w) => &y * &per_channel(w),
            None => y,
        };
        Ok(match &self.bias {
            Some(b) => &y + &per_channel(b),
            None => y,
        })
    }
}

macro_rules! group_norm_forward {
    ($($d:ident),*) => {
        impl<B: Dim, $($d: Dim,)* const G: usize, const CH: usize, E: Float, D: Device<E>>
            Forward<Tensor<(B, C<CH>, $($d,)*), E, D>, Tensor<(B, C<CH>, $($d,)*), E, D>>
            for GroupNorm<G, CH, E, D>
        {
            fn try_forward(&self, x: Tensor<(B, C<CH>, $($d,)*), E, D>) -> Result<Tensor<(B, C<CH>, $($d,)*), E, D>> {
                let n = x.dims()[0];
                let m = x.numel() / (n * CH).max(1);
                let x3 = x.try_reshape_to((Dyn(n), Dyn(CH), Dyn(m)))?;
                self.norm(x3)?.try_reshape_to(x.shape())
            }
        }
    };
}

group_norm_forward!();
group_norm_forward!(A1);
group_norm_forward!(A1, A2);
group_norm_forward!(A1, A2, A3);

/// Root-mean-square normalisation over the last axis (of size `N`), like
/// `nn.RMSNorm(N, eps)`: `x / sqrt(mean(x^2) + eps) * weight`, `weight` `[N]`
/// starting at ones. `eps: None` (PyTorch's default) means the machine
/// epsilon of the element type (`torch.finfo(dtype).eps`).
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::RMSNorm, Forward, Module};
/// let norm = RMSNorm::<2, f64>::new(&Cpu);
/// assert_eq!(norm.repr(), "RMSNorm((2,), eps=None, elementwise_affine=True)");
/// let y = norm.forward(Tensor::<(C<2>,), f64>::from_vec(vec![3.0, 4.0], (C,)).unwrap());
/// let r = (12.5f64 + f64::EPSILON).sqrt();
/// assert_eq!(y.to_vec(), [3.0 / r, 4.0 / r]);
/// ```
#[derive(Module, Clone, Debug)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct RMSNorm<const N: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// The scale, `[N]`.
    pub weight: Tensor<(C<N>,), E, D>,
    /// Added to the mean square; `None` for the element type's epsilon.
    pub eps: Option<f64>,
}

impl<const N: usize, E: Float, D: Device<E>> RMSNorm<N, E, D> {
    /// A layer with PyTorch's defaults (`eps=None`).
    pub fn new(device: &D) -> Self {
        Self::with_eps(None, device)
    }

    /// A layer with the given `eps` (`None`: the element type's epsilon).
    pub fn with_eps(eps: Option<f64>, device: &D) -> Self {
        RMSNorm {
            weight: filled((C,), 1.0, device).requires_grad(),
            eps,
        }
    }

    /// The `eps` the forward adds: the stated one, else `E`'s epsilon.
    pub fn effective_eps(&self) -> f64 {
        // `Dtype::to_f64`: the element type also has num-traits' `to_f64`.
        self.eps.unwrap_or_else(|| Dtype::to_f64(E::epsilon()))
    }

    fn extra_repr(&self) -> String {
        let eps = self.eps.map_or_else(|| "None".to_string(), py_float);
        format!("({N},), eps={eps}, elementwise_affine=True")
    }
}

macro_rules! rms_norm_forward {
    ($last:literal; $($d:ident),*) => {
        impl<$($d: Dim,)* const N: usize, E: Float, D: Device<E>>
            Forward<Tensor<($($d,)* C<N>,), E, D>, Tensor<($($d,)* C<N>,), E, D>> for RMSNorm<N, E, D>
        {
            fn try_forward(&self, x: Tensor<($($d,)* C<N>,), E, D>) -> Result<Tensor<($($d,)* C<N>,), E, D>> {
                let x = x.into_dyn();
                let mean_sq = (&x * &x).mean_keepdim::<$last>();
                let y = &x * &mean_sq.add_scalar(self.effective_eps()).rsqrt();
                Ok(restore(&y * &self.weight.into_dyn()))
            }
        }
    };
}

rms_norm_forward!(0;);
rms_norm_forward!(1; A);
rms_norm_forward!(2; A, B);
rms_norm_forward!(3; A, B, F);

// What each norm does to a shape, for `#[derive(Sequential)]`.
use crate::shape_step::{ShapeStep, Step};

impl<const CH: usize, E: Float, D: Device<E>> ShapeStep for BatchNorm2d<CH, E, D> {
    const STEP: Step = Step::channels("BatchNorm2d", CH, 4, 4);
}

impl<const CH: usize, E: Float, D: Device<E>> ShapeStep for BatchNorm1d<CH, E, D> {
    const STEP: Step = Step::channels("BatchNorm1d", CH, 2, 3);
}

impl<const G: usize, const CH: usize, E: Float, D: Device<E>> ShapeStep for GroupNorm<G, CH, E, D> {
    const STEP: Step = Step::channels("GroupNorm", CH, 2, 5);
}

impl<const N: usize, E: Float, D: Device<E>> ShapeStep for LayerNorm<N, E, D> {
    const STEP: Step = Step::features("LayerNorm", N, N);
}

impl<const N: usize, E: Float, D: Device<E>> ShapeStep for RMSNorm<N, E, D> {
    const STEP: Step = Step::features("RMSNorm", N, N);
}
