//! torchvision's ResNets ([`ResNet`]): ResNet-18 and ResNet-34 of
//! [`BasicBlock`]s, ResNet-50, -101 and -152 of [`Bottleneck`]s (v1.5: the
//! stride on the 3x3 convolution), with torchvision's `state_dict` keys and
//! shapes in torchvision's order (`conv1.weight`, `bn1.running_mean`,
//! `layer1.0.conv1.weight`, `layer2.0.downsample.0.weight`, `fc.bias`, ...,
//! BatchNorm's `num_batches_tracked` included), so a torchvision checkpoint
//! converted to safetensors loads with one call ([`ResNet::from_safetensors`])
//! and [`Module::save_safetensors`] writes a file that
//! `torchvision.models.resnet18().load_state_dict(..)` reads strictly.
//!
//! ```no_run
//! use forma::prelude::*;
//! use forma_models::resnet::{ResNet18, ResNet50};
//!
//! # fn main() -> Result<(), forma_models::ModelError> {
//! // ImageNet weights, e.g. `resnet18().state_dict()` saved with safetensors.
//! let net: ResNet18 = ResNet18::from_safetensors("resnet18.safetensors", &Cpu)?.model;
//! let images = Tensor::<(Dyn, C<3>, C<224>, C<224>)>::zeros_with((Dyn(1), C, C, C));
//! let logits: Tensor<(Dyn, C<1000>)> = net.forward(images);
//!
//! // Transfer learning: the same backbone, a fresh 10-class head.
//! let mut rng = Rng::seed_from(0);
//! let loaded = ResNet50::<10>::from_safetensors_new_head("resnet50.safetensors", &Cpu, &mut rng)?;
//! assert_eq!(loaded.report.dropped, ["fc.bias", "fc.weight"]);
//! # let _ = logits;
//! # Ok(())
//! # }
//! ```
//!
//! # What the types fix, and what they leave to run time
//! The type fixes the block ([`BasicBlock`] or [`Bottleneck`], as in
//! torchvision's `ResNet(BasicBlock, [2, 2, 2, 2])`) and the number of
//! classes `N`, so the network maps `[batch, 3, h, w]` images to
//! `[batch, N]` logits, checked when the program is built. The blocks per
//! stage and the width (64 in every torchvision ResNet) are a run-time
//! [`ResNetConfig`], and the channels inside the network are [`Dyn`]: the
//! stage widths are `width * 2^i` and the Bottleneck's outputs four times
//! that, arithmetic stable Rust cannot do on const generics, and a stage's
//! first block (which changes the width and the stride) is of another type
//! than the others while torchvision numbers them in one `Sequential`
//! (`layer2.0`, `layer2.1`), which a `Vec` of one type gives. So the inner
//! layers are [`DynConv2d`] and [`DynBatchNorm2d`] (PyTorch's `Conv2d`
//! without bias and `BatchNorm2d`, with their sizes known at run time);
//! their channel counts are checked when the model runs, and the model is
//! checked against torchvision's layout in the tests.

use crate::util::{layout_of, load_strict, restore, Init};
use crate::{LoadInfo, Loaded, ModelError};
use forma::core::device::Device;
use forma::nn::functional::batch_norm;
use forma::nn::layers::{AdaptiveAvgPool2d, MaxPool2d, Relu};
use forma::nn::module::py_float;
use forma::nn::state::Mismatch;
use forma::nn::{scope, LoadError, Module, StateDict, Training};
use forma::prelude::*;
use std::collections::BTreeSet;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::path::Path;

/// A feature map `[batch, channels, height, width]` with its sizes erased.
pub type Map<E = f32, D = Cpu> = Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>;

/// torchvision's `resnet18()`: [`BasicBlock`]s, [`ResNetConfig::resnet18`],
/// `N` classes (1000 for ImageNet).
pub type ResNet18<const N: usize = 1000, E = f32, D = Cpu> = ResNet<BasicBlock, N, E, D>;

/// torchvision's `resnet50()`: [`Bottleneck`]s, [`ResNetConfig::resnet50`],
/// `N` classes (1000 for ImageNet).
pub type ResNet50<const N: usize = 1000, E = f32, D = Cpu> = ResNet<Bottleneck, N, E, D>;

/// What a ResNet's type does not fix: the blocks per stage and the width.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResNetConfig {
    /// Blocks in `layer1` .. `layer4` (torchvision's `layers`).
    pub layers: [usize; 4],
    /// Channels of the stem and of `layer1`'s blocks (64 in torchvision);
    /// stage `i` has `width * 2^i`, times the block's expansion at its
    /// output. Other widths make narrow twins for tests.
    pub width: usize,
}

impl ResNetConfig {
    /// `layers` at torchvision's width 64.
    pub fn new(layers: [usize; 4]) -> Self {
        ResNetConfig { layers, width: 64 }
    }

    /// ResNet-18's `[2, 2, 2, 2]` (with [`BasicBlock`]).
    pub fn resnet18() -> Self {
        Self::new([2, 2, 2, 2])
    }

    /// ResNet-34's `[3, 4, 6, 3]` (with [`BasicBlock`]).
    pub fn resnet34() -> Self {
        Self::new([3, 4, 6, 3])
    }

    /// ResNet-50's `[3, 4, 6, 3]` (with [`Bottleneck`]).
    pub fn resnet50() -> Self {
        Self::new([3, 4, 6, 3])
    }

    /// ResNet-101's `[3, 4, 23, 3]` (with [`Bottleneck`]).
    pub fn resnet101() -> Self {
        Self::new([3, 4, 23, 3])
    }

    /// ResNet-152's `[3, 8, 36, 3]` (with [`Bottleneck`]).
    pub fn resnet152() -> Self {
        Self::new([3, 8, 36, 3])
    }

    /// The same blocks at another width.
    pub fn with_width(self, width: usize) -> Self {
        ResNetConfig { width, ..self }
    }

    /// The features the head reads for blocks `K`: `8 * width * expansion`
    /// (512 for ResNet-18, 2048 for ResNet-50).
    pub fn features<K: BlockKind>(&self) -> usize {
        8 * self.width * K::EXPANSION
    }

    /// The blocks and width of a torchvision state dict: the width from
    /// `conv1.weight`, the blocks from the distinct indices under
    /// `layer1.` .. `layer4.` (so a file cannot ask for more blocks than
    /// it has keys). A file without a usable `conv1.weight` gets width 64,
    /// and the load that follows names what is missing.
    fn of_state_dict(sd: &StateDict) -> Self {
        let width = sd
            .get("conv1.weight")
            .map(|t| t.dims())
            .filter(|d| d.len() == 4 && d[0] > 0)
            .map_or(64, |d| d[0]);
        let layers = [1, 2, 3, 4].map(|stage| {
            let prefix = format!("layer{stage}.");
            sd.keys()
                .filter_map(|k| {
                    k.strip_prefix(&prefix)?
                        .split('.')
                        .next()?
                        .parse::<usize>()
                        .ok()
                })
                .collect::<BTreeSet<_>>()
                .len()
        });
        ResNetConfig { layers, width }
    }
}

// ------------------------------------------------------------------ layers

/// `nn.Conv2d(in, out, kernel, stride, padding, bias=False)` with its sizes
/// known at run time: `weight` is `[out, in, kernel, kernel]`. Prints like
/// PyTorch's.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::Forward;
/// use forma_models::resnet::DynConv2d;
/// let conv = DynConv2d::<f32, Cpu>::new(3, 8, 7, 2, 3, &Cpu, &mut Rng::seed_from(0));
/// let y = conv.forward(Tensor::zeros_with((Dyn(1), Dyn(3), Dyn(32), Dyn(32))));
/// assert_eq!(y.dims()[..], [1, 8, 16, 16]);
/// assert_eq!(conv.repr(), "Conv2d(3, 8, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)");
/// ```
#[derive(Module, Debug)]
#[module(
    crate = "::forma::nn",
    name = "Conv2d",
    extra_repr = "Self::extra_repr"
)]
pub struct DynConv2d<E: Float = f32, D: Device<E> = Cpu> {
    /// `[out_channels, in_channels, kernel, kernel]`.
    pub weight: Map<E, D>,
    /// The step in both directions.
    pub stride: usize,
    /// Zeros added on each side.
    pub padding: usize,
}

impl<E: Float, D: Device<E>> DynConv2d<E, D> {
    /// A convolution initialised as torchvision's ResNets do:
    /// `kaiming_normal_(mode="fan_out", nonlinearity="relu")`, i.e.
    /// `N(0, 2 / (out * kernel^2))`.
    pub fn new(
        input: usize,
        output: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
        device: &D,
        rng: &mut Rng,
    ) -> Self {
        let spec = ConvSpec {
            input,
            output,
            kernel,
            stride,
            padding,
        };
        spec.build(&mut Init::Normal { std: 0.0, rng }, device)
    }

    fn extra_repr(&self) -> String {
        let d = self.weight.dims();
        let (s, p) = (self.stride, self.padding);
        let mut r = format!(
            "{}, {}, kernel_size=({}, {}), stride=({s}, {s})",
            d[1], d[0], d[2], d[3]
        );
        if p != 0 {
            r += &format!(", padding=({p}, {p})");
        }
        r + ", bias=False"
    }
}

impl<E: Float, D: Device<E>> Forward<Map<E, D>, Map<E, D>> for DynConv2d<E, D> {
    fn try_forward(&self, x: Map<E, D>) -> forma::Result<Map<E, D>> {
        x.try_conv2d(
            &self.weight,
            Conv2dParams {
                stride: [self.stride; 2],
                padding: [self.padding; 2],
                dilation: [1, 1],
                groups: 1,
            },
        )
    }
}

/// The sizes of one [`DynConv2d`].
#[derive(Clone, Copy)]
struct ConvSpec {
    input: usize,
    output: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
}

impl ConvSpec {
    fn build<E: Float, D: Device<E>>(self, init: &mut Init<'_>, device: &D) -> DynConv2d<E, D> {
        let k = self.kernel;
        let shape = (Dyn(self.output), Dyn(self.input), Dyn(k), Dyn(k));
        let std = (2.0 / (self.output * k * k) as f64).sqrt();
        DynConv2d {
            // torchvision's scales differ per layer: `Init::Normal`'s own
            // `std` is unused (this module sets it to 0).
            weight: init.draw(shape, device, |s, rng| {
                Tensor::normal_on(s, 0.0, std, rng, device)
            }),
            stride: self.stride,
            padding: self.padding,
        }
    }
}

/// `nn.BatchNorm2d(channels)` with the channel count known at run time:
/// PyTorch's defaults (eps 1e-5, momentum 0.1, affine, running statistics
/// as buffers). In training mode it normalises with the batch's statistics
/// (biased variance) and updates `running_mean`, `running_var` (unbiased)
/// and `num_batches_tracked`; in eval mode it uses the running ones.
///
/// ```
/// use forma::prelude::*;
/// use forma_models::resnet::DynBatchNorm2d;
/// let bn = DynBatchNorm2d::<f32, Cpu>::new(4, &Cpu);
/// assert_eq!(bn.repr(), "BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)");
/// let keys: Vec<String> = bn.state_dict().keys().map(String::from).collect();
/// assert_eq!(keys, ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]);
/// ```
#[derive(Module, Debug)]
#[module(
    crate = "::forma::nn",
    name = "BatchNorm2d",
    extra_repr = "Self::extra_repr"
)]
pub struct DynBatchNorm2d<E: Float = f32, D: Device<E> = Cpu> {
    /// The scale, `[channels]`.
    pub weight: Tensor<(Dyn,), E, D>,
    /// The shift, `[channels]`.
    pub bias: Tensor<(Dyn,), E, D>,
    /// The running mean, `[channels]`.
    #[module(buffer)]
    pub running_mean: Tensor<(Dyn,), E, D>,
    /// The running (unbiased) variance, `[channels]`.
    #[module(buffer)]
    pub running_var: Tensor<(Dyn,), E, D>,
    /// Training-mode forwards seen.
    #[module(buffer)]
    pub num_batches_tracked: Tensor<(), i64, D>,
    /// Weight of a new batch in the running statistics (0.1).
    pub momentum: f64,
    /// Added to the variance (1e-5).
    pub eps: f64,
    /// Batch statistics (`train()`) or running ones (`eval()`).
    pub training: Training,
}

impl<E: Float, D: Device<E>> DynBatchNorm2d<E, D> {
    /// A norm of `channels` with PyTorch's initial values (scale 1, shift
    /// 0, running mean 0 and variance 1), in training mode.
    pub fn new(channels: usize, device: &D) -> Self {
        let rng = &mut Rng::seed_from(0); // constants only: never drawn from
        Self::build(channels, &mut Init::Normal { std: 0.0, rng }, device)
    }

    fn build(channels: usize, init: &mut Init<'_>, device: &D) -> Self {
        let c = (Dyn(channels),);
        DynBatchNorm2d {
            weight: init.constant(c, 1.0, device),
            bias: init.constant(c, 0.0, device),
            running_mean: init.constant(c, 0.0, device).detach(),
            running_var: init.constant(c, 1.0, device).detach(),
            num_batches_tracked: Tensor::full_on((), 0, device),
            momentum: 0.1,
            eps: 1e-5,
            training: Training::default(),
        }
    }

    fn extra_repr(&self) -> String {
        format!(
            "{}, eps={}, momentum={}, affine=True, track_running_stats=True",
            self.weight.size(0),
            py_float(self.eps),
            py_float(self.momentum)
        )
    }
}

impl<E: Float, D: Device<E>> Forward<Map<E, D>, Map<E, D>> for DynBatchNorm2d<E, D> {
    fn try_forward(&self, x: Map<E, D>) -> forma::Result<Map<E, D>> {
        let ch = self.weight.size(0);
        if x.size(1) != ch {
            return Err(forma::Error::invalid(
                "BatchNorm2d",
                format!("{} channels in, but the norm has {ch}", x.size(1)),
            ));
        }
        let training = self.training.is_on();
        let y = batch_norm(
            x,
            Some(&self.running_mean),
            Some(&self.running_var),
            Some(&self.weight),
            Some(&self.bias),
            training,
            self.momentum,
            self.eps,
        )?;
        if training {
            let _g = forma::core::tape::no_grad();
            let seen = self.num_batches_tracked.try_to_vec()?[0] + 1;
            let device = self.num_batches_tracked.device();
            self.num_batches_tracked
                .try_assign(&Tensor::full_on((), seen, device))?;
        }
        Ok(y)
    }
}

/// The head, `nn.Linear(features, N)`, with the feature count known at run
/// time: `weight` `[N, features]`, `bias` `[N]`.
#[derive(Module, Debug)]
#[module(
    crate = "::forma::nn",
    name = "Linear",
    extra_repr = "Self::extra_repr"
)]
pub struct Classifier<const N: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[N, features]`.
    pub weight: Tensor<(C<N>, Dyn), E, D>,
    /// `[N]`.
    pub bias: Tensor<(C<N>,), E, D>,
}

impl<const N: usize, E: Float, D: Device<E>> Classifier<N, E, D> {
    /// PyTorch's default `nn.Linear` initialisation: weight and bias from
    /// `U(-1/sqrt(features), 1/sqrt(features))`.
    pub fn new(features: usize, device: &D, rng: &mut Rng) -> Self {
        Self::build(features, &mut Init::Normal { std: 0.0, rng }, device)
    }

    fn build(features: usize, init: &mut Init<'_>, device: &D) -> Self {
        let bound = 1.0 / (features.max(1) as f64).sqrt();
        Classifier {
            weight: init.draw((C, Dyn(features)), device, |s, rng| {
                Tensor::uniform_on(s, -bound, bound, rng, device)
            }),
            bias: init.draw((C,), device, |s, rng| {
                Tensor::uniform_on(s, -bound, bound, rng, device)
            }),
        }
    }

    fn extra_repr(&self) -> String {
        format!(
            "in_features={}, out_features={N}, bias=True",
            self.weight.size(1)
        )
    }
}

impl<B: Dim, const N: usize, E: Float, D: Device<E>>
    Forward<Tensor<(B, Dyn), E, D>, Tensor<(B, C<N>), E, D>> for Classifier<N, E, D>
{
    fn try_forward(&self, x: Tensor<(B, Dyn), E, D>) -> forma::Result<Tensor<(B, C<N>), E, D>> {
        let y = x.into_dyn().try_linear(&self.weight, Some(&self.bias))?;
        Ok(restore(y))
    }
}

// ------------------------------------------------------------------ blocks

/// A projection shortcut, torchvision's `downsample`:
/// `Sequential(conv1x1(in, out, stride), BatchNorm2d(out))`, keyed
/// `downsample.0.*` and `downsample.1.*`.
pub type Downsample<E = f32, D = Cpu> = (DynConv2d<E, D>, DynBatchNorm2d<E, D>);

/// A residual block kind, named by the block's `f32`-on-CPU type
/// ([`BasicBlock`], [`Bottleneck`]), so that `ResNet<BasicBlock>` reads as
/// torchvision's `ResNet(BasicBlock, ..)`; [`BlockKind::Block`] is the
/// block in any element type and device.
pub trait BlockKind: 'static {
    /// The block, in element type `E` on device `D`.
    type Block<E: Float, D: Device<E>>: Module + Debug + Residual<E, D>;
    /// The block's output channels per `planes` (torchvision's `expansion`).
    const EXPANSION: usize;
    /// Kernel sizes of the block's convolutions, in order (each followed
    /// by its norm): the first takes `inplanes`, the last gives
    /// `planes * EXPANSION`, the others `planes`.
    const KERNELS: &'static [usize];
    /// Which of them carries the block's stride.
    const STRIDED: usize;
}

/// What a [`ResNet`] needs of its blocks.
pub trait Residual<E: Float, D: Device<E>>: Sized {
    /// A block from its convolutions and norms, in the order of
    /// [`BlockKind::KERNELS`] (there are exactly that many), and its
    /// shortcut.
    fn from_layers(
        layers: Vec<(DynConv2d<E, D>, DynBatchNorm2d<E, D>)>,
        downsample: Option<Downsample<E, D>>,
    ) -> Self;

    /// The block's output for `x`, like its torchvision `forward`.
    ///
    /// # Errors
    /// When `x` has other channels than the block takes.
    fn run(&self, x: Map<E, D>) -> forma::Result<Map<E, D>>;
}

/// torchvision's `BasicBlock`: two 3x3 convolutions (the first with the
/// stride) and a shortcut, expansion 1.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "BasicBlock")]
pub struct BasicBlock<E: Float = f32, D: Device<E> = Cpu> {
    /// `3x3, inplanes -> planes, stride`.
    pub conv1: DynConv2d<E, D>,
    /// After `conv1`.
    pub bn1: DynBatchNorm2d<E, D>,
    /// Shared by both activations.
    pub relu: Relu,
    /// `3x3, planes -> planes`.
    pub conv2: DynConv2d<E, D>,
    /// After `conv2`.
    pub bn2: DynBatchNorm2d<E, D>,
    /// The projection when the stride or width changes.
    pub downsample: Option<Downsample<E, D>>,
}

/// torchvision's `Bottleneck` (ResNet v1.5): 1x1 down to `planes`, 3x3 with
/// the stride, 1x1 up to `4 * planes`, and a shortcut.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "Bottleneck")]
pub struct Bottleneck<E: Float = f32, D: Device<E> = Cpu> {
    /// `1x1, inplanes -> planes`.
    pub conv1: DynConv2d<E, D>,
    /// After `conv1`.
    pub bn1: DynBatchNorm2d<E, D>,
    /// `3x3, planes -> planes, stride`.
    pub conv2: DynConv2d<E, D>,
    /// After `conv2`.
    pub bn2: DynBatchNorm2d<E, D>,
    /// `1x1, planes -> 4 * planes`.
    pub conv3: DynConv2d<E, D>,
    /// After `conv3`.
    pub bn3: DynBatchNorm2d<E, D>,
    /// Shared by the three activations.
    pub relu: Relu,
    /// The projection when the stride or width changes.
    pub downsample: Option<Downsample<E, D>>,
}

impl BlockKind for BasicBlock {
    type Block<E: Float, D: Device<E>> = BasicBlock<E, D>;
    const EXPANSION: usize = 1;
    const KERNELS: &'static [usize] = &[3, 3];
    const STRIDED: usize = 0;
}

impl BlockKind for Bottleneck {
    type Block<E: Float, D: Device<E>> = Bottleneck<E, D>;
    const EXPANSION: usize = 4;
    const KERNELS: &'static [usize] = &[1, 3, 1];
    const STRIDED: usize = 1;
}

/// `conv` then `bn` as the children `conv_name` and `bn_name`.
fn conv_bn<E: Float, D: Device<E>>(
    (conv_name, conv): (&'static str, &DynConv2d<E, D>),
    (bn_name, bn): (&'static str, &DynBatchNorm2d<E, D>),
    x: Map<E, D>,
) -> forma::Result<Map<E, D>> {
    let y = conv.try_forward_as(conv_name, x)?;
    bn.try_forward_as(bn_name, y)
}

/// `relu(out + shortcut(x))`.
fn add_shortcut<E: Float, D: Device<E>>(
    out: Map<E, D>,
    x: Map<E, D>,
    downsample: Option<&Downsample<E, D>>,
) -> forma::Result<Map<E, D>> {
    let identity = match downsample {
        Some((conv, bn)) => scope::run("downsample", || conv_bn(("0", conv), ("1", bn), x))?,
        None => x,
    };
    if out.dims() != identity.dims() {
        return Err(forma::Error::invalid(
            "residual",
            format!(
                "the block's output {:?} and its shortcut {:?} differ",
                out.dims(),
                identity.dims()
            ),
        ));
    }
    Ok((&out + &identity).relu())
}

/// Takes exactly `N` layers; the builder gives each block kind its count.
fn exactly<T, const N: usize>(layers: Vec<T>) -> [T; N] {
    match layers.try_into() {
        Ok(a) => a,
        Err(v) => unreachable!("a block built from {} layers instead of {N}", v.len()),
    }
}

impl<E: Float, D: Device<E>> Residual<E, D> for BasicBlock<E, D> {
    fn from_layers(
        layers: Vec<(DynConv2d<E, D>, DynBatchNorm2d<E, D>)>,
        downsample: Option<Downsample<E, D>>,
    ) -> Self {
        let [(conv1, bn1), (conv2, bn2)] = exactly(layers);
        BasicBlock {
            conv1,
            bn1,
            relu: Relu,
            conv2,
            bn2,
            downsample,
        }
    }

    fn run(&self, x: Map<E, D>) -> forma::Result<Map<E, D>> {
        let out = conv_bn(("conv1", &self.conv1), ("bn1", &self.bn1), x.clone())?.relu();
        let out = conv_bn(("conv2", &self.conv2), ("bn2", &self.bn2), out)?;
        add_shortcut(out, x, self.downsample.as_ref())
    }
}

impl<E: Float, D: Device<E>> Residual<E, D> for Bottleneck<E, D> {
    fn from_layers(
        layers: Vec<(DynConv2d<E, D>, DynBatchNorm2d<E, D>)>,
        downsample: Option<Downsample<E, D>>,
    ) -> Self {
        let [(conv1, bn1), (conv2, bn2), (conv3, bn3)] = exactly(layers);
        Bottleneck {
            conv1,
            bn1,
            conv2,
            bn2,
            conv3,
            bn3,
            relu: Relu,
            downsample,
        }
    }

    fn run(&self, x: Map<E, D>) -> forma::Result<Map<E, D>> {
        let out = conv_bn(("conv1", &self.conv1), ("bn1", &self.bn1), x.clone())?.relu();
        let out = conv_bn(("conv2", &self.conv2), ("bn2", &self.bn2), out)?.relu();
        let out = conv_bn(("conv3", &self.conv3), ("bn3", &self.bn3), out)?;
        add_shortcut(out, x, self.downsample.as_ref())
    }
}

// ------------------------------------------------------------------ network

/// torchvision's `ResNet(K, layers, num_classes=N)`: the stem (`conv1`
/// 7x7 stride 2, `bn1`, ReLU, `maxpool` 3x3 stride 2), four stages of
/// blocks `K` (`layer1` .. `layer4`, the last three halving the size),
/// global average pooling and the head `fc`. Maps `[batch, 3, h, w]`
/// images to `[batch, N]` logits.
///
/// ```
/// use forma::prelude::*;
/// use forma_models::resnet::{BasicBlock, ResNet, ResNetConfig};
///
/// // A narrow ResNet-18 (width 4 instead of 64) with 10 classes.
/// let config = ResNetConfig::resnet18().with_width(4);
/// let mut net = ResNet::<BasicBlock, 10>::new(&config, &Cpu, &mut Rng::seed_from(0));
/// net.eval();
/// let x = Tensor::<(Dyn, C<3>, C<32>, C<32>)>::zeros_with((Dyn(2), C, C, C));
/// let logits: Tensor<(Dyn, C<10>)> = net.forward(x);
/// assert_eq!(logits.dims()[..], [2, 10]);
/// let keys: Vec<String> = net.state_dict().keys().map(String::from).collect();
/// assert_eq!(keys[6..8], ["layer1.0.conv1.weight", "layer1.0.bn1.weight"]);
/// assert_eq!(keys.last().map(String::as_str), Some("fc.bias"));
/// ```
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "ResNet")]
pub struct ResNet<K: BlockKind, const N: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `7x7, 3 -> width, stride 2, padding 3`.
    pub conv1: DynConv2d<E, D>,
    /// After `conv1`.
    pub bn1: DynBatchNorm2d<E, D>,
    /// After `bn1`.
    pub relu: Relu,
    /// `3x3, stride 2, padding 1`.
    pub maxpool: MaxPool2d<3, 2, 1>,
    /// Stage 1: `width` planes, stride 1.
    pub layer1: Vec<K::Block<E, D>>,
    /// Stage 2: `2 * width` planes, stride 2.
    pub layer2: Vec<K::Block<E, D>>,
    /// Stage 3: `4 * width` planes, stride 2.
    pub layer3: Vec<K::Block<E, D>>,
    /// Stage 4: `8 * width` planes, stride 2.
    pub layer4: Vec<K::Block<E, D>>,
    /// To `[batch, channels, 1, 1]`.
    pub avgpool: AdaptiveAvgPool2d<1>,
    /// `features -> N`.
    pub fc: Classifier<N, E, D>,
    /// The block kind, which only the stages' type names.
    #[module(skip)]
    pub kind: PhantomData<fn() -> K>,
}

impl<K: BlockKind, const N: usize, E: Float, D: Device<E>> ResNet<K, N, E, D> {
    /// A network initialised as torchvision's (convolutions
    /// `kaiming_normal_(mode="fan_out")`, norms 1 and 0, the head
    /// `nn.Linear`'s default), in training mode.
    pub fn new(config: &ResNetConfig, device: &D, rng: &mut Rng) -> Self {
        Self::build(config, &mut Init::Normal { std: 0.0, rng }, device)
    }

    fn build(config: &ResNetConfig, init: &mut Init<'_>, device: &D) -> Self {
        let w = config.width;
        let conv = |init: &mut Init<'_>, input, output, kernel, stride| {
            ConvSpec {
                input,
                output,
                kernel,
                stride,
                padding: kernel / 2,
            }
            .build(init, device)
        };
        let norm = |init: &mut Init<'_>, ch| DynBatchNorm2d::build(ch, init, device);
        let mut inplanes = w;
        let mut stage = |init: &mut Init<'_>, planes: usize, blocks: usize, stride: usize| {
            let out = planes * K::EXPANSION;
            (0..blocks)
                .map(|b| {
                    let s = if b == 0 { stride } else { 1 };
                    let last = K::KERNELS.len() - 1;
                    let layers = K::KERNELS
                        .iter()
                        .enumerate()
                        .map(|(i, &k)| {
                            let cin = if i == 0 { inplanes } else { planes };
                            let cout = if i == last { out } else { planes };
                            let st = if i == K::STRIDED { s } else { 1 };
                            (conv(init, cin, cout, k, st), norm(init, cout))
                        })
                        .collect();
                    let downsample = (b == 0 && (s != 1 || inplanes != out))
                        .then(|| (conv(init, inplanes, out, 1, s), norm(init, out)));
                    inplanes = out;
                    K::Block::from_layers(layers, downsample)
                })
                .collect::<Vec<_>>()
        };
        let conv1 = ConvSpec {
            input: 3,
            output: w,
            kernel: 7,
            stride: 2,
            padding: 3,
        }
        .build(init, device);
        let bn1 = norm(init, w);
        let [l1, l2, l3, l4] = config.layers;
        let layer1 = stage(init, w, l1, 1);
        let layer2 = stage(init, 2 * w, l2, 2);
        let layer3 = stage(init, 4 * w, l3, 2);
        let layer4 = stage(init, 8 * w, l4, 2);
        ResNet {
            conv1,
            bn1,
            relu: Relu,
            maxpool: MaxPool2d,
            layer1,
            layer2,
            layer3,
            layer4,
            avgpool: AdaptiveAvgPool2d,
            fc: Classifier::build(config.features::<K>(), init, device),
            kind: PhantomData,
        }
    }

    /// The `state_dict` keys and shapes of a network of this type and
    /// `config`, in order, without allocating its weights (each tensor of
    /// the network built to list them is a view of a single zero).
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma_models::resnet::{ResNet50, ResNetConfig};
    /// let keys = ResNet50::<1000>::state_dict_layout(&ResNetConfig::resnet50(), &Cpu);
    /// assert_eq!(keys[0], ("conv1.weight".to_string(), vec![64, 3, 7, 7]));
    /// assert_eq!(keys.len(), 320);
    /// ```
    pub fn state_dict_layout(config: &ResNetConfig, device: &D) -> Vec<(String, Vec<usize>)> {
        layout_of(&Self::build(config, &mut Init::Meta, device))
    }

    /// The blocks per stage and the width of this network.
    pub fn config(&self) -> ResNetConfig {
        ResNetConfig {
            layers: [
                self.layer1.len(),
                self.layer2.len(),
                self.layer3.len(),
                self.layer4.len(),
            ],
            width: self.conv1.weight.size(0),
        }
    }

    /// Loads a torchvision checkpoint saved as safetensors
    /// (`safetensors.torch.save_file(model.state_dict(), path)`) strictly,
    /// in eval mode, with the blocks per stage and the width read from the
    /// file. Files without `num_batches_tracked` (written before PyTorch
    /// 0.4.1, like the first torchvision weights) load as PyTorch loads
    /// them, the counters left at 0; nothing else is adjusted, so
    /// [`Loaded::report`] is empty.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when the file cannot be read,
    /// [`ModelError::NoLayers`] when a stage has no block, and
    /// [`ModelError::Load`] naming every missing, unexpected and mismatched
    /// key (a file of the other block kind, or with another number of
    /// classes than `N`, is refused that way).
    pub fn from_safetensors(
        path: impl AsRef<Path>,
        device: &D,
    ) -> Result<Loaded<Self>, ModelError> {
        Self::read(path.as_ref(), device, None)
    }

    /// Transfer learning: loads a torchvision checkpoint's backbone strictly
    /// (as [`ResNet::from_safetensors`]) under a fresh `N`-class head with
    /// `nn.Linear`'s default initialisation from `rng`, like replacing
    /// `model.fc` after `load_state_dict`. The file's own head (`fc.weight`,
    /// `fc.bias`, of any number of classes) is set aside and listed in
    /// [`LoadInfo::dropped`]; every other key must match. In eval mode.
    ///
    /// # Errors
    /// As [`ResNet::from_safetensors`].
    pub fn from_safetensors_new_head(
        path: impl AsRef<Path>,
        device: &D,
        rng: &mut Rng,
    ) -> Result<Loaded<Self>, ModelError> {
        Self::read(path.as_ref(), device, Some(rng))
    }

    /// [`ResNet::from_safetensors`], or with a `new_head` drawn from that
    /// generator [`ResNet::from_safetensors_new_head`].
    fn read(
        path: &Path,
        device: &D,
        new_head: Option<&mut Rng>,
    ) -> Result<Loaded<Self>, ModelError> {
        let mut sd = forma::nn::state::load_file(path)?.tensors;
        let mut report = LoadInfo::default();
        let mut model = match new_head {
            None => Self::for_state_dict(&sd, false, path, device, &mut Rng::seed_from(0))?,
            Some(rng) => {
                for key in ["fc.bias", "fc.weight"] {
                    if sd.remove(key).is_some() {
                        report.dropped.push(key.to_string());
                    }
                }
                let model = Self::for_state_dict(&sd, true, path, device, rng)?;
                // The new head loads as itself, so the load stays strict for the rest.
                sd.insert("fc.weight", model.fc.weight.try_to_data()?);
                sd.insert("fc.bias", model.fc.bias.try_to_data()?);
                model
            }
        };
        load_strict(&mut model, &sd, Some(path))?;
        Ok(Loaded::eval(model, report))
    }

    /// Loads a torchvision state dict strictly (`load_state_dict(sd,
    /// strict=True)`); on error the network is unchanged.
    ///
    /// # Errors
    /// [`ModelError::Load`] naming every missing, unexpected and mismatched key.
    pub fn load_torchvision_state_dict(&mut self, sd: &StateDict) -> Result<(), ModelError> {
        load_strict(self, sd, None)
    }

    /// The same backbone under a fresh `M`-class head (`nn.Linear`'s
    /// default initialisation from `rng`), like `model.fc =
    /// nn.Linear(model.fc.in_features, M)`; the mode is kept.
    pub fn with_head<const M: usize>(self, rng: &mut Rng) -> ResNet<K, M, E, D> {
        let features = self.fc.weight.size(1);
        let fc = Classifier::new(features, self.conv1.weight.device(), rng);
        ResNet {
            conv1: self.conv1,
            bn1: self.bn1,
            relu: self.relu,
            maxpool: self.maxpool,
            layer1: self.layer1,
            layer2: self.layer2,
            layer3: self.layer3,
            layer4: self.layer4,
            avgpool: self.avgpool,
            fc,
            kind: PhantomData,
        }
    }

    /// The pooled features `[batch, 8 * width * expansion]` the head reads
    /// (torchvision's `flatten(avgpool(layer4(..)), 1)`).
    ///
    /// # Errors
    /// When the input does not have 3 channels or is too small to pool.
    pub fn features<B: Dim, H: Dim, W: Dim>(
        &self,
        x: Tensor<(B, C<3>, H, W), E, D>,
    ) -> forma::Result<Tensor<(B, Dyn), E, D>> {
        let b = x.size(0);
        let x = conv_bn(("conv1", &self.conv1), ("bn1", &self.bn1), x.into_dyn())?;
        let x: Map<E, D> = self.relu.try_forward_as("relu", x)?;
        let mut x: Map<E, D> = self.maxpool.try_forward_as("maxpool", x)?;
        for (name, stage) in [
            ("layer1", &self.layer1),
            ("layer2", &self.layer2),
            ("layer3", &self.layer3),
            ("layer4", &self.layer4),
        ] {
            for (i, block) in stage.iter().enumerate() {
                x = scope::run(name, || scope::run(i, || block.run(x.clone())))?;
            }
        }
        let ch = x.size(1);
        let x: Tensor<(Dyn, Dyn, C<1>, C<1>), E, D> = self.avgpool.try_forward_as("avgpool", x)?;
        let x = x.try_reshape_to((Dyn(b), Dyn(ch)))?;
        Ok(restore(x))
    }

    /// A network shaped for `sd`'s blocks and width, its values not yet
    /// loaded. Before any weight is allocated, the keys and sizes of that
    /// network (listed without allocating, as [`ResNet::state_dict_layout`])
    /// are checked against `sd`, the head's left out when `new_head`: a
    /// file's `conv1.weight` sets the width, and a hostile file could
    /// otherwise ask for a network that does not fit in memory.
    fn for_state_dict(
        sd: &StateDict,
        new_head: bool,
        path: &Path,
        device: &D,
        rng: &mut Rng,
    ) -> Result<Self, ModelError> {
        let config = ResNetConfig::of_state_dict(sd);
        if let Some(i) = config.layers.iter().position(|&n| n == 0) {
            return Err(ModelError::NoLayers(
                ["layer1", "layer2", "layer3", "layer4"][i],
            ));
        }
        let mut layout = Self::state_dict_layout(&config, device);
        if new_head {
            layout.retain(|(k, _)| !k.starts_with("fc."));
        }
        fits(&layout, sd, E::DTYPE).map_err(|source| ModelError::Load {
            path: path.display().to_string(),
            source: Box::new(source),
        })?;
        Ok(Self::new(&config, device, rng))
    }
}

/// `sd`'s keys and sizes against a `layout`, as a strict load checks them
/// (a missing `num_batches_tracked` is filled in, as PyTorch does); the
/// dtypes are left to the load itself.
fn fits(layout: &[(String, Vec<usize>)], sd: &StateDict, float: DType) -> Result<(), LoadError> {
    let mut err = LoadError::default();
    for (key, dims) in layout {
        let counter = key.ends_with("num_batches_tracked");
        match sd.get(key) {
            None if counter => {}
            None => err.missing_keys.push(key.clone()),
            Some(d) if d.dims() != &dims[..] => err.mismatched.push(Mismatch {
                key: key.clone(),
                expected: (dims.clone(), if counter { DType::I64 } else { float }),
                found: (d.dims().to_vec(), d.dtype().torch_name().to_string()),
            }),
            Some(_) => {}
        }
    }
    let known: BTreeSet<&str> = layout.iter().map(|(k, _)| k.as_str()).collect();
    err.unexpected_keys = sd
        .keys()
        .filter(|k| !known.contains(k))
        .map(|k| (k.to_string(), None))
        .collect();
    if err.missing_keys.is_empty() && err.mismatched.is_empty() && err.unexpected_keys.is_empty() {
        Ok(())
    } else {
        Err(err)
    }
}

impl<K: BlockKind, B: Dim, H: Dim, W: Dim, const N: usize, E: Float, D: Device<E>>
    Forward<Tensor<(B, C<3>, H, W), E, D>, Tensor<(B, C<N>), E, D>> for ResNet<K, N, E, D>
{
    /// The logits, torchvision's `forward`.
    ///
    /// # Errors
    /// As [`ResNet::features`].
    fn try_forward(
        &self,
        x: Tensor<(B, C<3>, H, W), E, D>,
    ) -> forma::Result<Tensor<(B, C<N>), E, D>> {
        let f = self.features(x)?;
        self.fc.try_forward_as("fc", f)
    }
}
