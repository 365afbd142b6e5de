//! Convolutions: `Conv1d`, `Conv2d` (square kernels) and `Conv2dRect`
//! (a kernel, stride, padding and dilation per axis), both with PyTorch's
//! padding modes, and `ConvTranspose2d`, like PyTorch's.

use super::check::{assert_transposed_window, assert_window};
use super::fan_in_uniform;
use super::pool::stated_output;
use crate::Forward;
use forma_core::device::Device;
use forma_core::ops::conv::{add_channel_bias, Conv2dParams, ConvTranspose2dParams};
use forma_core::ops::pad::PadMode;
use forma_core::shape::Shape;
use forma_core::{Dim, Dyn, Error, Float, Result, Rng, Tensor, C};
use forma_cpu::Cpu;
use forma_macros::Module;

/// Panics unless `groups` divides both channel counts, as PyTorch's
/// `_ConvNd` does.
fn check_groups(layer: &str, groups: usize, i: usize, o: usize) {
    assert!(
        groups > 0 && i.is_multiple_of(groups) && o.is_multiple_of(groups),
        "{layer}: groups={groups} must divide in_channels={i} and out_channels={o}"
    );
}

/// A convolution's weight and optional bias from PyTorch's default, which
/// draws both from `U(-1/sqrt(fan_in), ..)`.
fn weight_and_bias<S: Shape, const O: usize, E: Float, D: Device<E>>(
    shape: S,
    fan_in: usize,
    bias: bool,
    device: &D,
    rng: &mut Rng,
) -> (Tensor<S, E, D>, Option<Tensor<(C<O>,), E, D>>) {
    let weight = fan_in_uniform(shape, fan_in, device, rng);
    (
        weight,
        bias.then(|| fan_in_uniform((C,), fan_in, device, rng)),
    )
}

/// How a convolution fills its padding, like the layers' `padding_mode`:
/// zeros (PyTorch's default), or the input's own elements mirrored
/// (`"reflect"`), repeated from the edge (`"replicate"`) or wrapped around
/// (`"circular"`), with `F.pad`'s rules (a reflected pad must be smaller
/// than the axis).
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::layers::{Conv1d, PaddingMode};
/// use forma::nn::{Forward, Module};
/// let mut conv = Conv1d::<1, 1, 3, 1, 1, 1, f64>::with_options(1, false, &Cpu, &mut Rng::seed_from(0))
///     .padding_mode(PaddingMode::Replicate);
/// conv.weight = Tensor::from_vec(vec![1.0, 0.0, 0.0], (C, Dyn(1), C)).unwrap();
/// let x = Tensor::<(C<1>, C<1>, C<3>), f64>::from_vec(vec![5.0, 6.0, 7.0], (C, C, C)).unwrap();
/// let y: Tensor<(C<1>, C<1>, C<3>), f64> = conv.forward(x);
/// assert_eq!(y.to_vec(), [5.0, 5.0, 6.0]); // the left tap sees the edge repeated
/// assert!(conv.repr().ends_with("bias=False, padding_mode=replicate)"));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PaddingMode {
    /// Zeros (`"zeros"`).
    #[default]
    Zeros,
    /// The mirror image without the edge (`"reflect"`).
    Reflect,
    /// The edge repeated (`"replicate"`).
    Replicate,
    /// The axis wrapped around (`"circular"`).
    Circular,
}

impl PaddingMode {
    /// The `F.pad` mode that pads ahead of the convolution; `None` for
    /// zeros, which the convolution pads itself.
    fn pad_mode(self) -> Option<PadMode> {
        match self {
            PaddingMode::Zeros => None,
            PaddingMode::Reflect => Some(PadMode::Reflect),
            PaddingMode::Replicate => Some(PadMode::Replicate),
            PaddingMode::Circular => Some(PadMode::Circular),
        }
    }

    /// PyTorch's name, as its repr writes it.
    pub fn name(self) -> &'static str {
        match self {
            PaddingMode::Zeros => "zeros",
            PaddingMode::Reflect => "reflect",
            PaddingMode::Replicate => "replicate",
            PaddingMode::Circular => "circular",
        }
    }
}

/// PyTorch's `_ConvNd.extra_repr` for a convolution with one size per
/// axis in each of `[kernel, stride, padding, dilation, output_padding]`,
/// each written as a tuple and left out at its default.
fn conv_repr(
    (i, o): (usize, usize),
    [k, s, p, l, op]: [&[usize]; 5],
    groups: usize,
    bias: bool,
    padding_mode: PaddingMode,
) -> String {
    // Python writes a 1-tuple with a trailing comma.
    let tuple = |v: &[usize]| match v {
        [x] => format!("({x},)"),
        _ => format!(
            "({})",
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut r = format!("{i}, {o}, kernel_size={}, stride={}", tuple(k), tuple(s));
    if p.iter().any(|&x| x != 0) {
        r += &format!(", padding={}", tuple(p));
    }
    if l.iter().any(|&x| x != 1) {
        r += &format!(", dilation={}", tuple(l));
    }
    if op.iter().any(|&x| x != 0) {
        r += &format!(", output_padding={}", tuple(op));
    }
    if groups != 1 {
        r += &format!(", groups={groups}");
    }
    if !bias {
        r += ", bias=False";
    }
    if padding_mode != PaddingMode::Zeros {
        r += &format!(", padding_mode={}", padding_mode.name());
    }
    r
}

/// Adds the per-channel bias, when there is one.
fn with_bias<S: Shape, const O: usize, E: Float, D: Device<E>>(
    y: Tensor<S, E, D>,
    bias: Option<&Tensor<(C<O>,), E, D>>,
) -> Tensor<S, E, D> {
    match bias {
        Some(b) => add_channel_bias(&y, b),
        None => y,
    }
}

/// A 2-d convolution from `I` to `O` channels with a `K`x`K` kernel, stride
/// `S`, zero padding `P` and dilation `L`, like
/// `nn.Conv2d(I, O, K, stride=S, padding=P, dilation=L)`: the square case of
/// [`Conv2dRect`], whose fields and methods it has. `weight` is
/// `[O, I / groups, K, K]`, `bias` `[O]`; both start from PyTorch's default.
///
/// The output height and width are the caller's to state (stable Rust cannot
/// compute them in a type); a static size that disagrees with
/// `(h + 2P - L(K - 1) - 1) / S + 1` fails `cargo build` with both sizes.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::Conv2d, Forward};
/// let mut rng = Rng::seed_from(0);
/// let conv = Conv2d::<1, 6, 5>::new(&Cpu, &mut rng);
/// let x = Tensor::<(Dyn, C<1>, C<28>, C<28>)>::zeros_with((Dyn(2), C, C, C));
/// let y: Tensor<(Dyn, C<6>, C<24>, C<24>)> = conv.forward(x);
/// assert_eq!(y.dims()[..], [2, 6, 24, 24]);
/// ```
pub type Conv2d<
    const I: usize,
    const O: usize,
    const K: usize,
    const S: usize = 1,
    const P: usize = 0,
    const L: usize = 1,
    E = f32,
    D = Cpu,
> = Conv2dRect<I, O, K, K, S, S, P, P, L, L, E, D>;

/// A 2-d convolution whose kernel, stride, padding and dilation may differ
/// between height and width, like `nn.Conv2d(I, O, (KH, KW), stride=(SH, SW),
/// padding=(PH, PW), dilation=(LH, LW))` (Inception's `1x7` and `7x1`
/// kernels). `weight` is `[O, I / groups, KH, KW]`, `bias` `[O]`; both start
/// from PyTorch's default. Its repr and `state_dict` are PyTorch's `Conv2d`'s;
/// [`Conv2d`] names the square case.
///
/// A static output size that disagrees with
/// `(h + 2PH - LH(KH - 1) - 1) / SH + 1` (and the same along the width)
/// fails `cargo build`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::Conv2dRect, Forward, Module};
/// // kernel (1, 7), padding (0, 3): the width is kept, as in Inception-v3.
/// let conv = Conv2dRect::<4, 8, 1, 7, 1, 1, 0, 3>::new(&Cpu, &mut Rng::seed_from(0));
/// let x = Tensor::<(Dyn, C<4>, C<17>, C<17>)>::zeros_with((Dyn(2), C, C, C));
/// let y: Tensor<(Dyn, C<8>, C<17>, C<17>)> = conv.forward(x);
/// assert_eq!(y.dims()[..], [2, 8, 17, 17]);
/// assert_eq!(conv.repr(), "Conv2d(4, 8, kernel_size=(1, 7), stride=(1, 1), padding=(0, 3))");
/// ```
#[derive(Module, Clone, Debug)]
#[module(crate = "crate", name = "Conv2d", extra_repr = "Self::extra_repr")]
pub struct Conv2dRect<
    const I: usize,
    const O: usize,
    const KH: usize,
    const KW: usize,
    const SH: usize = 1,
    const SW: usize = 1,
    const PH: usize = 0,
    const PW: usize = 0,
    const LH: usize = 1,
    const LW: usize = 1,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// `[out_channels, in_channels / groups, KH, KW]`.
    pub weight: Tensor<(C<O>, Dyn, C<KH>, C<KW>), E, D>,
    /// `[out_channels]`, absent for `bias=False`.
    pub bias: Option<Tensor<(C<O>,), E, D>>,
    /// Channel groups (`groups=`), dividing both `I` and `O`.
    pub groups: usize,
    /// How the padding is filled (`padding_mode=`).
    #[module(skip)]
    pub padding_mode: PaddingMode,
}

impl<
        const I: usize,
        const O: usize,
        const KH: usize,
        const KW: usize,
        const SH: usize,
        const SW: usize,
        const PH: usize,
        const PW: usize,
        const LH: usize,
        const LW: usize,
        E: Float,
        D: Device<E>,
    > Conv2dRect<I, O, KH, KW, SH, SW, PH, PW, LH, LW, E, D>
{
    /// A convolution with a bias and one group.
    pub fn new(device: &D, rng: &mut Rng) -> Self {
        Self::with_options(1, true, device, rng)
    }

    /// A convolution with `groups` channel groups, with or without a bias.
    ///
    /// # Panics
    /// If `groups` does not divide both channel counts.
    pub fn with_options(groups: usize, bias: bool, device: &D, rng: &mut Rng) -> Self {
        check_groups("Conv2d", groups, I, O);
        let fan_in = I / groups * KH * KW;
        let (weight, bias) = weight_and_bias((C, Dyn(I / groups), C, C), fan_in, bias, device, rng);
        Conv2dRect {
            weight,
            bias,
            groups,
            padding_mode: PaddingMode::Zeros,
        }
    }

    /// The layer with its padding filled by `mode` (PyTorch's
    /// `padding_mode=`).
    pub fn padding_mode(mut self, mode: PaddingMode) -> Self {
        self.padding_mode = mode;
        self
    }

    fn extra_repr(&self) -> String {
        conv_repr(
            (I, O),
            [&[KH, KW], &[SH, SW], &[PH, PW], &[LH, LW], &[0, 0]],
            self.groups,
            self.bias.is_some(),
            self.padding_mode,
        )
    }
}

impl<
        B: Dim,
        H: Dim,
        W: Dim,
        H2: Dim,
        W2: Dim,
        const I: usize,
        const O: usize,
        const KH: usize,
        const KW: usize,
        const SH: usize,
        const SW: usize,
        const PH: usize,
        const PW: usize,
        const LH: usize,
        const LW: usize,
        E: Float,
        D: Device<E>,
    > Forward<Tensor<(B, C<I>, H, W), E, D>, Tensor<(B, C<O>, H2, W2), E, D>>
    for Conv2dRect<I, O, KH, KW, SH, SW, PH, PW, LH, LW, E, D>
{
    fn try_forward(
        &self,
        x: Tensor<(B, C<I>, H, W), E, D>,
    ) -> Result<Tensor<(B, C<O>, H2, W2), E, D>> {
        const {
            assert_window("Conv2d", "height", H::STATIC, KH, SH, PH, LH, H2::STATIC);
            assert_window("Conv2d", "width", W::STATIC, KW, SW, PW, LW, W2::STATIC);
        };
        let p = Conv2dParams {
            stride: [SH, SW],
            padding: [PH, PW],
            dilation: [LH, LW],
            groups: self.groups,
        };
        let y = match self.padding_mode.pad_mode() {
            Some(mode) if PH + PW > 0 => {
                let x = x.try_pad::<3>(PW, PW, mode)?.try_pad::<2>(PH, PH, mode)?;
                let p = Conv2dParams {
                    padding: [0, 0],
                    ..p
                };
                x.try_conv2d(&self.weight, p)?
            }
            _ => x.try_conv2d(&self.weight, p)?,
        };
        stated_output("Conv2d", with_bias(y, self.bias.as_ref()))
    }
}

/// A 1-d convolution from `I` to `O` channels with a kernel of `K`, stride
/// `S`, zero padding `P` and dilation `L`, like
/// `nn.Conv1d(I, O, K, stride=S, padding=P, dilation=L)`, on
/// `[batch, channels, length]`. `weight` is `[O, I / groups, K]`, `bias`
/// `[O]`; both start from PyTorch's default. The caller states the output
/// length; a static one that disagrees with `(l + 2P - L(K - 1) - 1) / S + 1`
/// fails `cargo build`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::Conv1d, Forward, Module};
/// let conv = Conv1d::<2, 4, 3, 1, 1>::new(&Cpu, &mut Rng::seed_from(0));
/// let x = Tensor::<(Dyn, C<2>, C<10>)>::zeros_with((Dyn(3), C, C));
/// let y: Tensor<(Dyn, C<4>, C<10>)> = conv.forward(x);
/// assert_eq!(y.dims()[..], [3, 4, 10]);
/// assert_eq!(conv.repr(), "Conv1d(2, 4, kernel_size=(3,), stride=(1,), padding=(1,))");
/// ```
#[derive(Module, Clone, Debug)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct Conv1d<
    const I: usize,
    const O: usize,
    const K: usize,
    const S: usize = 1,
    const P: usize = 0,
    const L: usize = 1,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// `[out_channels, in_channels / groups, K]`.
    pub weight: Tensor<(C<O>, Dyn, C<K>), E, D>,
    /// `[out_channels]`, absent for `bias=False`.
    pub bias: Option<Tensor<(C<O>,), E, D>>,
    /// Channel groups (`groups=`), dividing both `I` and `O`.
    pub groups: usize,
    /// How the `P` padding is filled (`padding_mode=`).
    #[module(skip)]
    pub padding_mode: PaddingMode,
}

impl<
        const I: usize,
        const O: usize,
        const K: usize,
        const S: usize,
        const P: usize,
        const L: usize,
        E: Float,
        D: Device<E>,
    > Conv1d<I, O, K, S, P, L, E, D>
{
    /// A convolution with a bias and one group.
    pub fn new(device: &D, rng: &mut Rng) -> Self {
        Self::with_options(1, true, device, rng)
    }

    /// A convolution with `groups` channel groups, with or without a bias.
    ///
    /// # Panics
    /// If `groups` does not divide both channel counts.
    pub fn with_options(groups: usize, bias: bool, device: &D, rng: &mut Rng) -> Self {
        check_groups("Conv1d", groups, I, O);
        let fan_in = I / groups * K;
        let (weight, bias) = weight_and_bias((C, Dyn(I / groups), C), fan_in, bias, device, rng);
        Conv1d {
            weight,
            bias,
            groups,
            padding_mode: PaddingMode::Zeros,
        }
    }

    /// The layer with its padding filled by `mode` (PyTorch's
    /// `padding_mode=`).
    pub fn padding_mode(mut self, mode: PaddingMode) -> Self {
        self.padding_mode = mode;
        self
    }

    fn extra_repr(&self) -> String {
        conv_repr(
            (I, O),
            [&[K], &[S], &[P], &[L], &[0]],
            self.groups,
            self.bias.is_some(),
            self.padding_mode,
        )
    }
}

impl<
        B: Dim,
        Len: Dim,
        Len2: Dim,
        const I: usize,
        const O: usize,
        const K: usize,
        const S: usize,
        const P: usize,
        const L: usize,
        E: Float,
        D: Device<E>,
    > Forward<Tensor<(B, C<I>, Len), E, D>, Tensor<(B, C<O>, Len2), E, D>>
    for Conv1d<I, O, K, S, P, L, E, D>
{
    fn try_forward(
        &self,
        x: Tensor<(B, C<I>, Len), E, D>,
    ) -> Result<Tensor<(B, C<O>, Len2), E, D>> {
        const {
            assert_window("Conv1d", "length", Len::STATIC, K, S, P, L, Len2::STATIC);
        };
        let y = match self.padding_mode.pad_mode() {
            Some(mode) if P > 0 => {
                let x = x.try_pad::<2>(P, P, mode)?;
                x.try_conv1d(&self.weight, S, 0, L, self.groups)?
            }
            _ => x.try_conv1d(&self.weight, S, P, L, self.groups)?,
        };
        with_bias(y, self.bias.as_ref())
            .try_into_shape()
            .map_err(|e| {
                Error::invalid(
                    "Conv1d",
                    format!("the stated output length does not fit: {e}"),
                )
            })
    }
}

/// A 2-d transposed convolution from `I` to `O` channels with a `K`x`K`
/// kernel, stride `S`, padding `P`, output padding `OP` and dilation `L`, like
/// `nn.ConvTranspose2d(I, O, K, stride=S, padding=P, output_padding=OP,
/// dilation=L)`: the gradient of a `Conv2d` with respect to its input, often
/// used to upsample. `weight` is `[I, O / groups, K, K]`, `bias` `[O]`, both
/// from PyTorch's default (`U(-1/sqrt(fan_in), ..)` with `fan_in = O / groups
/// * K * K`).
///
/// The caller states the output height and width; a static size that
/// disagrees with `(h - 1) S - 2P + L(K - 1) + OP + 1` fails `cargo build`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::ConvTranspose2d, Forward, Module};
/// // Doubles 4x4 to 8x8: kernel 3, stride 2, padding 1, output padding 1.
/// let up = ConvTranspose2d::<4, 2, 3, 2, 1, 1>::new(&Cpu, &mut Rng::seed_from(0));
/// let x = Tensor::<(Dyn, C<4>, C<4>, C<4>)>::zeros_with((Dyn(1), C, C, C));
/// let y: Tensor<(Dyn, C<2>, C<8>, C<8>)> = up.forward(x);
/// assert_eq!(y.dims()[..], [1, 2, 8, 8]);
/// assert_eq!(
///     up.repr(),
///     "ConvTranspose2d(4, 2, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), output_padding=(1, 1))"
/// );
/// ```
#[derive(Module, Clone, Debug)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct ConvTranspose2d<
    const I: usize,
    const O: usize,
    const K: usize,
    const S: usize = 1,
    const P: usize = 0,
    const OP: usize = 0,
    const L: usize = 1,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// `[in_channels, out_channels / groups, K, K]`.
    pub weight: Tensor<(C<I>, Dyn, C<K>, C<K>), E, D>,
    /// `[out_channels]`, absent for `bias=False`.
    pub bias: Option<Tensor<(C<O>,), E, D>>,
    /// Channel groups (`groups=`), dividing both `I` and `O`.
    pub groups: usize,
}

impl<
        const I: usize,
        const O: usize,
        const K: usize,
        const S: usize,
        const P: usize,
        const OP: usize,
        const L: usize,
        E: Float,
        D: Device<E>,
    > ConvTranspose2d<I, O, K, S, P, OP, L, E, D>
{
    /// A transposed convolution with a bias and one group.
    pub fn new(device: &D, rng: &mut Rng) -> Self {
        Self::with_options(1, true, device, rng)
    }

    /// A transposed convolution with `groups` channel groups, with or
    /// without a bias.
    ///
    /// # Panics
    /// If `groups` does not divide both channel counts.
    pub fn with_options(groups: usize, bias: bool, device: &D, rng: &mut Rng) -> Self {
        check_groups("ConvTranspose2d", groups, I, O);
        // PyTorch computes the fan-in from the weight's dim 1, which for a
        // transposed convolution is the output channels per group.
        let fan_in = O / groups * K * K;
        let (weight, bias) = weight_and_bias((C, Dyn(O / groups), C, C), fan_in, bias, device, rng);
        ConvTranspose2d {
            weight,
            bias,
            groups,
        }
    }

    fn extra_repr(&self) -> String {
        conv_repr(
            (I, O),
            [&[K; 2], &[S; 2], &[P; 2], &[L; 2], &[OP; 2]],
            self.groups,
            self.bias.is_some(),
            PaddingMode::Zeros,
        )
    }
}

impl<
        B: Dim,
        H: Dim,
        W: Dim,
        H2: Dim,
        W2: Dim,
        const I: usize,
        const O: usize,
        const K: usize,
        const S: usize,
        const P: usize,
        const OP: usize,
        const L: usize,
        E: Float,
        D: Device<E>,
    > Forward<Tensor<(B, C<I>, H, W), E, D>, Tensor<(B, C<O>, H2, W2), E, D>>
    for ConvTranspose2d<I, O, K, S, P, OP, L, E, D>
{
    fn try_forward(
        &self,
        x: Tensor<(B, C<I>, H, W), E, D>,
    ) -> Result<Tensor<(B, C<O>, H2, W2), E, D>> {
        const {
            assert_transposed_window(
                "ConvTranspose2d",
                "height",
                H::STATIC,
                K,
                S,
                P,
                OP,
                L,
                H2::STATIC,
            );
            assert_transposed_window(
                "ConvTranspose2d",
                "width",
                W::STATIC,
                K,
                S,
                P,
                OP,
                L,
                W2::STATIC,
            );
        };
        let p = ConvTranspose2dParams {
            stride: [S, S],
            padding: [P, P],
            output_padding: [OP, OP],
            dilation: [L, L],
            groups: self.groups,
        };
        let y = x.try_conv_transpose2d(&self.weight, p)?;
        with_bias(y, self.bias.as_ref())
            .try_into_shape()
            .map_err(|e| {
                Error::invalid(
                    "ConvTranspose2d",
                    format!("the stated output size does not fit: {e}"),
                )
            })
    }
}

// What each convolution does to a shape, for `#[derive(Sequential)]`.
use crate::shape_step::{ShapeStep, Step, WindowAxis};

impl<
        const I: usize,
        const O: usize,
        const KH: usize,
        const KW: usize,
        const SH: usize,
        const SW: usize,
        const PH: usize,
        const PW: usize,
        const LH: usize,
        const LW: usize,
        E: Float,
        D: Device<E>,
    > ShapeStep for Conv2dRect<I, O, KH, KW, SH, SW, PH, PW, LH, LW, E, D>
{
    const STEP: Step = Step::Window {
        layer: "Conv2d",
        channels: Some((I, O)),
        spatial: 2,
        axes: [
            WindowAxis::new(KH, SH, PH, LH),
            WindowAxis::new(KW, SW, PW, LW),
        ],
    };
}

impl<
        const I: usize,
        const O: usize,
        const K: usize,
        const S: usize,
        const P: usize,
        const L: usize,
        E: Float,
        D: Device<E>,
    > ShapeStep for Conv1d<I, O, K, S, P, L, E, D>
{
    const STEP: Step = Step::Window {
        layer: "Conv1d",
        channels: Some((I, O)),
        spatial: 1,
        axes: [WindowAxis::new(K, S, P, L), WindowAxis::new(K, S, P, L)],
    };
}

impl<
        const I: usize,
        const O: usize,
        const K: usize,
        const S: usize,
        const P: usize,
        const OP: usize,
        const L: usize,
        E: Float,
        D: Device<E>,
    > ShapeStep for ConvTranspose2d<I, O, K, S, P, OP, L, E, D>
{
    const STEP: Step = {
        let axis = WindowAxis {
            transposed: Some(OP),
            ..WindowAxis::new(K, S, P, L)
        };
        Step::Window {
            layer: "ConvTranspose2d",
            channels: Some((I, O)),
            spatial: 2,
            axes: [axis, axis],
        }
    };
}
