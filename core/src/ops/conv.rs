//! Convolutions (`conv1d`, `conv2d`, and `conv_transpose2d`, computed by the
//! convolution's backward kernel) with stride, padding, dilation and groups,
//! as kernels the nn layers wrap. The output's spatial sizes depend on runtime
//! options here, so they are `Dyn`; typed layers pin them.

use crate::device::Backend;
use crate::dtype::{DType, Float};
use crate::error::{fmt_dims, Error, Result};
use crate::layout::Layout;
use crate::ops::matmul::PackedRhs;
use crate::shape::op::{self, ImageInput, SequenceInput};
use crate::shape::window::{transposed_window_out, window_out};
use crate::shape::{Dim, Dyn, Shape};
use crate::tape::Raw;
use crate::tensor::{ok, Tensor};

/// Options of a 2-d convolution, in PyTorch's order and defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Step between windows, `[h, w]`.
    pub stride: [usize; 2],
    /// Zero padding on each side, `[h, w]`.
    pub padding: [usize; 2],
    /// Spacing of the kernel taps, `[h, w]`.
    pub dilation: [usize; 2],
    /// Channel groups (input and output channels must divide by it).
    pub groups: usize,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// Backend support for convolution.
pub trait ConvKernel<E: Float>: Backend {
    /// `x` is `[n, c_in, h, w]`, `w` is `[c_out, c_in / groups, kh, kw]`; the
    /// caller has validated sizes. The result is row-major `[n, c_out, oh, ow]`.
    fn conv2d(
        &self,
        x: &Self::Storage<E>,
        lx: &Layout,
        w: &Self::Storage<E>,
        lw: &Layout,
        p: &Conv2dParams,
    ) -> Result<Self::Storage<E>>;
    /// Gradients of [`ConvKernel::conv2d`] from the output's gradient `g`
    /// (`[n, c_out, oh, ow]`): `(dx, dw)`, row-major with the input's and the
    /// weight's sizes, each computed only when `need` asks for it (`[dx,
    /// dw]`; a network's first layer needs no input gradient).
    #[allow(clippy::too_many_arguments)] // three operands with their layouts
    fn conv2d_backward(
        &self,
        x: &Self::Storage<E>,
        lx: &Layout,
        w: &Self::Storage<E>,
        lw: &Layout,
        g: &Self::Storage<E>,
        lg: &Layout,
        p: &Conv2dParams,
        need: [bool; 2],
    ) -> Result<(Option<Self::Storage<E>>, Option<Self::Storage<E>>)>;

    /// The weight `w` packed once for [`ConvKernel::conv2d_packed`] on
    /// inputs of `x_dims`, where this backend reads a weight that way:
    /// eager convolutions without a tape keep the packed copy while the
    /// weight's storage is unchanged (see [`crate::ops::packed_weights`]).
    /// `Ok(None)` (the default) when the backend would not pack it for this
    /// convolution.
    fn pack_conv_weight(
        &self,
        w: &Self::Storage<E>,
        lw: &Layout,
        x_dims: &[usize],
        p: &Conv2dParams,
    ) -> Result<Option<PackedRhs>> {
        let _ = (w, lw, x_dims, p);
        Ok(None)
    }

    /// [`ConvKernel::conv2d`] reading the weight (of layout `lw`) through
    /// its copy packed by [`ConvKernel::pack_conv_weight`]: the same values.
    /// `Ok(None)` (the default) when the backend cannot run it for these
    /// operands; the caller then runs `conv2d`.
    fn conv2d_packed(
        &self,
        x: &Self::Storage<E>,
        lx: &Layout,
        w: &PackedRhs,
        lw: &Layout,
        p: &Conv2dParams,
    ) -> Result<Option<Self::Storage<E>>> {
        let _ = (x, lx, w, lw, p);
        Ok(None)
    }

    /// Whether [`ConvKernel::conv2d_low`] and
    /// [`ConvKernel::conv2d_backward_low`] run for this dtype and `low`
    /// (bf16 or f16): then autocast's convolution calls them, rounding as
    /// their products read, instead of rounding its operands, result and
    /// gradients as ops of their own. `false` (the default): autocast
    /// rounds around [`ConvKernel::conv2d`].
    fn has_conv_low(&self, low: DType) -> bool {
        let _ = low;
        false
    }

    /// [`ConvKernel::conv2d`] as autocast computes it in `low`: the input's
    /// and the weight's values rounded to `low`, the products summed in f32,
    /// each output rounded to `low`, stored in `E`. Called only where
    /// [`ConvKernel::has_conv_low`] says yes; the default is an error.
    #[allow(clippy::too_many_arguments)] // two operands with their layouts
    fn conv2d_low(
        &self,
        x: &Self::Storage<E>,
        lx: &Layout,
        w: &Self::Storage<E>,
        lw: &Layout,
        p: &Conv2dParams,
        low: DType,
    ) -> Result<Self::Storage<E>> {
        let _ = (x, lx, w, lw, p);
        Err(Error::invalid(
            "conv2d",
            format!("{} has no {low} convolution for {}", self.name(), E::DTYPE),
        ))
    }

    /// [`ConvKernel::conv2d_backward`] of [`ConvKernel::conv2d_low`]: `x`,
    /// `w` and `g` rounded to `low` as read, the products summed in f32,
    /// each gradient rounded to `low` once summed. As for `conv2d_low`.
    #[allow(clippy::too_many_arguments)] // three operands with their layouts
    fn conv2d_backward_low(
        &self,
        x: &Self::Storage<E>,
        lx: &Layout,
        w: &Self::Storage<E>,
        lw: &Layout,
        g: &Self::Storage<E>,
        lg: &Layout,
        p: &Conv2dParams,
        need: [bool; 2],
        low: DType,
    ) -> Result<(Option<Self::Storage<E>>, Option<Self::Storage<E>>)> {
        let _ = (x, lx, w, lw, g, lg, p, need);
        Err(Error::invalid(
            "conv2d_backward",
            format!("{} has no {low} convolution for {}", self.name(), E::DTYPE),
        ))
    }
}

/// The sizes of a 2-d convolution, validated: built only by
/// [`Conv2dGeometry::new`], which core runs before it dispatches and the
/// backends run again (the same checks, written once here) when their
/// kernels are called directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dGeometry {
    /// Batch size.
    pub n: usize,
    /// Input channels.
    pub c_in: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub c_out: usize,
    /// Input channels per group.
    pub cg: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
    /// The options.
    pub p: Conv2dParams,
}

impl Conv2dGeometry {
    /// Checks an input of sizes `x` (`[n, c_in, h, w]`) against a weight of
    /// sizes `w` (`[c_out, c_in / groups, kh, kw]`) and the options, and
    /// derives the output size.
    ///
    /// # Errors
    /// When an operand is not 4-d, the channels do not divide into the
    /// groups or do not match the weight, a dilation is zero, or the kernel
    /// does not fit the padded input.
    pub fn new(x: &[usize], w: &[usize], p: &Conv2dParams) -> Result<Self> {
        let op = "conv2d";
        if x.len() != 4 || w.len() != 4 {
            return Err(Error::invalid(
                op,
                format!(
                    "input {} and weight {} must be 4-d",
                    fmt_dims(x),
                    fmt_dims(w)
                ),
            ));
        }
        let g = p.groups;
        if g == 0 || !x[1].is_multiple_of(g) || !w[0].is_multiple_of(g) {
            return Err(Error::invalid(
                op,
                format!(
                    "{} input and {} output channels do not divide into {g} groups",
                    x[1], w[0]
                ),
            ));
        }
        if w[1] * g != x[1] {
            return Err(Error::shape(
                op,
                format!(
                    "[_, {}, _, _] (weight expects {} channels per group)",
                    w[1] * g,
                    w[1]
                ),
                x,
            ));
        }
        let oh = window_out(x[2], w[2], p.stride[0], p.padding[0], p.dilation[0]);
        let ow = window_out(x[3], w[3], p.stride[1], p.padding[1], p.dilation[1]);
        match (oh, ow) {
            (Some(oh), Some(ow)) if p.dilation.iter().all(|&d| d > 0) => Ok(Conv2dGeometry {
                n: x[0],
                c_in: x[1],
                h: x[2],
                w: x[3],
                c_out: w[0],
                cg: w[1],
                kh: w[2],
                kw: w[3],
                oh,
                ow,
                p: *p,
            }),
            _ => Err(Error::invalid(
                op,
                format!(
                    "a {}x{} kernel does not fit a padded {}x{} input with {p:?}",
                    w[2], w[3], x[2], x[3]
                ),
            )),
        }
    }

    /// The output's sizes, `[n, c_out, oh, ow]`.
    pub fn out_dims(&self) -> [usize; 4] {
        [self.n, self.c_out, self.oh, self.ow]
    }

    /// Rows of a group's column matrix: `cg * kh * kw`.
    pub fn patch(&self) -> usize {
        self.cg * self.kh * self.kw
    }

    /// Output positions per channel: `oh * ow`.
    pub fn positions(&self) -> usize {
        self.oh * self.ow
    }
}

impl<N: Dim, Ci: Dim, H: Dim, W: Dim, E: Float, D: crate::device::Device<E>>
    Tensor<(N, Ci, H, W), E, D>
{
    fn try_conv2d_unnoted<Co: Dim, Cg: Dim, Kh: Dim, Kw: Dim>(
        &self,
        weight: &Tensor<(Co, Cg, Kh, Kw), E, D>,
        p: Conv2dParams,
    ) -> Result<Tensor<(N, Co, Dyn, Dyn), E, D>> {
        self.same_device("conv2d", weight)?;
        let low = crate::autocast::target::<E, D>(&self.device);
        if let Some(low) = low.filter(|&l| !self.device.has_conv_low(l)) {
            // No low-precision kernel: round the operands and the result as
            // ops of their own around the plain convolution.
            let _inner = crate::autocast::suspend();
            let (x, w) = (self.try_round_to(low)?, weight.try_round_to(low)?);
            return x.try_conv2d_unnoted(&w, p)?.try_round_to(low);
        }
        let out = Conv2dGeometry::new(&self.layout.dims, &weight.layout.dims, &p)?.out_dims();
        let (sx, sw) = (&self.storage(), &weight.storage());
        let (lx, lw) = (&self.layout, &weight.layout);
        let s = match low {
            Some(low) => self.device.conv2d_low(sx, lx, sw, lw, &p, low)?,
            None => match self.packed_conv2d(weight, &p)? {
                Some(s) => s,
                None => self.device.conv2d(sx, lx, sw, lw, &p)?,
            },
        };
        let (xr, wr) = (self.raw(), weight.raw());
        let need = [self.var.is_some(), weight.var.is_some()];
        Ok(Tensor::from_storage(s, &out, self.device.clone()).record(
            "conv2d",
            &[self.var.clone(), weight.var.clone()],
            [need[1].then(|| xr.saved()), need[0].then(|| wr.saved())]
                .into_iter()
                .flatten()
                .collect(),
            move |g| {
                let (sx, sw, sg) = (&xr.storage(), &wr.storage(), &g.storage());
                let (lx, lw, lg) = (&xr.layout, &wr.layout, &g.layout);
                let dev = &g.device;
                let (gx, gw) = match low {
                    Some(low) => dev.conv2d_backward_low(sx, lx, sw, lw, sg, lg, &p, need, low)?,
                    None => dev.conv2d_backward(sx, lx, sw, lw, sg, lg, &p, need)?,
                };
                Ok(vec![
                    gx.map(|s| Raw::new(s, &xr.layout.dims, g.device.clone())),
                    gw.map(|s| Raw::new(s, &wr.layout.dims, g.device.clone())),
                ])
            },
        ))
    }

    /// The convolution on the weight's packed copy, kept from one call to
    /// the next, where nothing is taped and the backend packs weights for
    /// this convolution (`None` otherwise).
    fn packed_conv2d<Co: Dim, Cg: Dim, Kh: Dim, Kw: Dim>(
        &self,
        weight: &Tensor<(Co, Cg, Kh, Kw), E, D>,
        p: &Conv2dParams,
    ) -> Result<Option<D::Storage<E>>> {
        let taped = crate::tape::is_grad_enabled() && (self.var.is_some() || weight.var.is_some());
        if taped {
            return Ok(None);
        }
        let lw = &weight.layout;
        let packed = crate::ops::packed_weights::packed(&weight.storage, lw, E::DTYPE, || {
            self.device
                .pack_conv_weight(&weight.storage(), lw, &self.layout.dims, p)
        })?;
        match packed {
            Some(w) => self
                .device
                .conv2d_packed(&self.storage(), &self.layout, &w, lw, p),
            None => Ok(None),
        }
    }

    fn try_conv2d_at<Co: Dim, Cg: Dim, Kh: Dim, Kw: Dim>(
        &self,
        weight: &Tensor<(Co, Cg, Kh, Kw), E, D>,
        p: Conv2dParams,
    ) -> Result<Tensor<(N, Co, Dyn, Dyn), E, D>> {
        let y = self.try_conv2d_unnoted(weight, p)?;
        Ok(y.noted(|| (crate::graph::Op::Conv(p), vec![self.val(), weight.val()])))
    }
}

/// The input of `conv2d` is `[batch, channels, height, width]`, a rule
/// stated on the weight's first dim `Co` so that a tensor of another rank
/// is one error naming the op (see [`crate::shape::op::ImageInput`]).
type ImageOut<S, Co, E, D> = Tensor<(<Co as ImageInput<S, op::conv2d>>::Batch, Co, Dyn, Dyn), E, D>;

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    /// 2-d convolution of `[n, c_in, h, w]` by `[c_out, c_in / groups, kh, kw]`,
    /// like `F.conv2d(x, weight, stride, padding, dilation, groups)`.
    ///
    /// # Errors
    /// When channels do not match the weight or the groups, or the kernel does
    /// not fit the padded input.
    pub fn try_conv2d<Co: Dim, Cg: Dim, Kh: Dim, Kw: Dim>(
        &self,
        weight: &Tensor<(Co, Cg, Kh, Kw), E, D>,
        p: Conv2dParams,
    ) -> Result<ImageOut<S, Co, E, D>>
    where
        Co: ImageInput<S, op::conv2d>,
    {
        let x = self.clone().retype::<(Dyn, Dyn, Dyn, Dyn)>();
        Ok(x.try_conv2d_at(weight, p)?.retype())
    }

    /// [`Tensor::try_conv2d`] that panics on bad sizes.
    #[track_caller]
    pub fn conv2d<Co: Dim, Cg: Dim, Kh: Dim, Kw: Dim>(
        &self,
        weight: &Tensor<(Co, Cg, Kh, Kw), E, D>,
        p: Conv2dParams,
    ) -> ImageOut<S, Co, E, D>
    where
        Co: ImageInput<S, op::conv2d>,
    {
        ok(self.try_conv2d(weight, p))
    }

    /// [`Tensor::try_conv2d`] with an optional per-output-channel bias, like
    /// `F.conv2d(x, weight, bias, ..)`. The bias length is the weight's first
    /// dim by type.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<1>, C<1>, C<2>, C<2>)>::ones();
    /// let w = Tensor::<(C<2>, C<1>, C<1>, C<1>)>::from_vec(vec![1., 2.], (C, C, C, C)).unwrap();
    /// let b = Tensor::<(C<2>,)>::from_vec(vec![0.5, -1.], (C,)).unwrap();
    /// let y = x.try_conv2d_bias(&w, Some(&b), Conv2dParams::default()).unwrap();
    /// assert_eq!(y.to_vec(), [1.5, 1.5, 1.5, 1.5, 1., 1., 1., 1.]);
    /// ```
    ///
    /// # Errors
    /// As [`Tensor::try_conv2d`], and a `Dyn` bias of the wrong length.
    pub fn try_conv2d_bias<Co: Dim, Cg: Dim, Kh: Dim, Kw: Dim>(
        &self,
        weight: &Tensor<(Co, Cg, Kh, Kw), E, D>,
        bias: Option<&Tensor<(Co,), E, D>>,
        p: Conv2dParams,
    ) -> Result<ImageOut<S, Co, E, D>>
    where
        Co: ImageInput<S, op::conv2d>,
    {
        let y = self.try_conv2d(weight, p)?;
        match bias {
            Some(b) => try_add_channel_bias(&y, b),
            None => Ok(y),
        }
    }

    /// [`Tensor::try_conv2d_bias`] that panics on bad sizes.
    #[track_caller]
    pub fn conv2d_bias<Co: Dim, Cg: Dim, Kh: Dim, Kw: Dim>(
        &self,
        weight: &Tensor<(Co, Cg, Kh, Kw), E, D>,
        bias: Option<&Tensor<(Co,), E, D>>,
        p: Conv2dParams,
    ) -> ImageOut<S, Co, E, D>
    where
        Co: ImageInput<S, op::conv2d>,
    {
        ok(self.try_conv2d_bias(weight, bias, p))
    }
}

impl<N: Dim, Ci: Dim, L: Dim, E: Float, D: crate::device::Device<E>> Tensor<(N, Ci, L), E, D> {
    fn try_conv1d_at<Co: Dim, Cg: Dim, K: Dim>(
        &self,
        weight: &Tensor<(Co, Cg, K), E, D>,
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<Tensor<(N, Co, Dyn), E, D>> {
        let x = self.unsqueeze::<2>();
        let w = weight.unsqueeze::<2>();
        let p = Conv2dParams {
            stride: [1, stride],
            padding: [0, padding],
            dilation: [1, dilation],
            groups,
        };
        let y = x.try_conv2d(&w, p)?;
        let dims = y.layout.dims;
        y.try_reshape_to((
            N::from_size(dims[0]).expect("batch kept"),
            Co::from_size(dims[1]).expect("channels kept"),
            Dyn(dims[3]),
        ))
    }
}

/// The input of `conv1d` is `[batch, channels, length]` (see
/// [`crate::shape::op::SequenceInput`]).
type SequenceOut<S, Co, E, D> =
    Tensor<(<Co as SequenceInput<S, op::conv1d>>::Batch, Co, Dyn), E, D>;

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    /// 1-d convolution of `[n, c_in, l]` by `[c_out, c_in / groups, k]`, like
    /// `F.conv1d`; computed as a 2-d convolution of height 1.
    ///
    /// # Errors
    /// As [`Tensor::try_conv2d`].
    pub fn try_conv1d<Co: Dim, Cg: Dim, K: Dim>(
        &self,
        weight: &Tensor<(Co, Cg, K), E, D>,
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<SequenceOut<S, Co, E, D>>
    where
        Co: SequenceInput<S, op::conv1d>,
    {
        let x = self.clone().retype::<(Dyn, Dyn, Dyn)>();
        let y = x.try_conv1d_at(weight, stride, padding, dilation, groups)?;
        Ok(y.retype())
    }

    /// [`Tensor::try_conv1d`] that panics on bad sizes.
    #[track_caller]
    pub fn conv1d<Co: Dim, Cg: Dim, K: Dim>(
        &self,
        weight: &Tensor<(Co, Cg, K), E, D>,
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
    ) -> SequenceOut<S, Co, E, D>
    where
        Co: SequenceInput<S, op::conv1d>,
    {
        ok(self.try_conv1d(weight, stride, padding, dilation, groups))
    }
}

/// Adds a per-channel bias `[c]` to a `[n, c, ...]` tensor (axis 1).
///
/// # Panics
/// If the bias length differs from the channel count; see [`try_add_channel_bias`].
#[track_caller]
pub fn add_channel_bias<S: Shape, C: Dim, E: Float, D: crate::device::Device<E>>(
    x: &Tensor<S, E, D>,
    bias: &Tensor<(C,), E, D>,
) -> Tensor<S, E, D> {
    ok(try_add_channel_bias(x, bias))
}

/// [`add_channel_bias`], returning a length mismatch as an error.
///
/// # Errors
/// A bias whose length differs from the channel count, or a backend failure.
pub fn try_add_channel_bias<S: Shape, C: Dim, E: Float, D: crate::device::Device<E>>(
    x: &Tensor<S, E, D>,
    bias: &Tensor<(C,), E, D>,
) -> Result<Tensor<S, E, D>> {
    if S::RANK < 2 || x.layout.dims[1] != bias.numel() {
        return Err(Error::shape(
            "add_channel_bias",
            format!("{} biases, one per channel (axis 1)", bias.numel()),
            &x.layout.dims,
        ));
    }
    let mut dims = vec![1; S::RANK];
    dims[1] = bias.numel();
    let mut lb = Layout::contiguous(&dims);
    lb.strides[1] = bias.layout.strides[0];
    lb.offset = bias.layout.offset;
    let lb = lb.broadcast_to(&x.layout.dims);
    let s = x.device.binary(
        crate::ops::binary::Add,
        &x.storage(),
        &x.layout,
        &bias.storage(),
        &lb,
    )?;
    let bdims = bias.layout.dims;
    Ok(Tensor::from_storage(s, &x.layout.dims, x.device.clone())
        .record(
            "add_channel_bias",
            &[x.var.clone(), bias.var.clone()],
            vec![],
            move |g| {
                let mut keep = vec![1; g.layout.rank()];
                keep[1] = bdims[0];
                let gb = crate::tape::util::sum_to(g, &keep)?;
                Ok(vec![
                    Some(g.clone()),
                    Some(crate::tape::util::reshape(&gb, &bdims)?),
                ])
            },
        )
        .noted(|| {
            // The bias as `[c, 1, ..]`, added with broadcasting.
            let mut column = Layout::contiguous(&dims[1..]);
            column.strides[0] = bias.layout.strides[0];
            column.offset = bias.layout.offset;
            let column = Raw {
                layout: column,
                ..bias.raw()
            }
            .val();
            crate::graph::note_reshape(&bias.val(), &column);
            (
                crate::graph::Op::Binary { name: "add" },
                vec![x.val(), column],
            )
        }))
}

/// Options of a 2-d transposed convolution, in PyTorch's names and defaults
/// (`F.conv_transpose2d(x, weight, stride, padding, output_padding, groups,
/// dilation)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2dParams {
    /// Step between the input's positions in the output, `[h, w]`.
    pub stride: [usize; 2],
    /// Rows and columns removed from each side of the full output, `[h, w]`
    /// (the padding of the convolution this one transposes).
    pub padding: [usize; 2],
    /// Rows and columns added at the end of the output, `[h, w]`; each must be
    /// smaller than the stride or the dilation of its dim.
    pub output_padding: [usize; 2],
    /// Spacing of the kernel taps, `[h, w]`.
    pub dilation: [usize; 2],
    /// Channel groups (input and output channels must divide by it).
    pub groups: usize,
}

impl Default for ConvTranspose2dParams {
    fn default() -> Self {
        ConvTranspose2dParams {
            stride: [1, 1],
            padding: [0, 0],
            output_padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

impl ConvTranspose2dParams {
    /// The options of the convolution this one transposes (the one whose
    /// input gradient it computes).
    pub fn conv(&self) -> Conv2dParams {
        Conv2dParams {
            stride: self.stride,
            padding: self.padding,
            dilation: self.dilation,
            groups: self.groups,
        }
    }
}

fn check_conv_transpose(x: &[usize], w: &[usize], p: &ConvTranspose2dParams) -> Result<[usize; 4]> {
    let op = "conv_transpose2d";
    let g = p.groups;
    if g == 0 || !x[1].is_multiple_of(g) {
        return Err(Error::invalid(
            op,
            format!("{} input channels do not divide into {g} groups", x[1]),
        ));
    }
    if w[0] != x[1] {
        return Err(Error::shape(
            op,
            format!(
                "[_, {}, _, _] (the weight's first dim is the input channels)",
                w[0]
            ),
            x,
        ));
    }
    if (0..2).any(|i| p.stride[i] == 0 || p.dilation[i] == 0) {
        return Err(Error::invalid(
            op,
            format!("stride and dilation must be positive, got {p:?}"),
        ));
    }
    if (0..2).any(|i| p.output_padding[i] >= p.stride[i].max(p.dilation[i])) {
        return Err(Error::invalid(
            op,
            format!("output padding must be smaller than either stride or dilation, got {p:?}"),
        ));
    }
    let size = |i: usize| {
        transposed_window_out(
            x[2 + i],
            w[2 + i],
            p.stride[i],
            p.padding[i],
            p.output_padding[i],
            p.dilation[i],
        )
    };
    match (size(0), size(1)) {
        (Some(oh), Some(ow)) => Ok([x[0], w[1] * g, oh, ow]),
        _ => Err(Error::invalid(
            op,
            format!(
                "a {}x{} input with a {}x{} kernel and {p:?} leaves no output",
                x[2], x[3], w[2], w[3]
            ),
        )),
    }
}

impl<N: Dim, Ci: Dim, H: Dim, W: Dim, E: Float, D: crate::device::Device<E>>
    Tensor<(N, Ci, H, W), E, D>
{
    fn try_conv_transpose2d_unnoted<Wi: Dim, Cg: Dim, Kh: Dim, Kw: Dim>(
        &self,
        weight: &Tensor<(Wi, Cg, Kh, Kw), E, D>,
        p: ConvTranspose2dParams,
    ) -> Result<Tensor<(N, Dyn, Dyn, Dyn), E, D>> {
        self.same_device("conv_transpose2d", weight)?;
        if let Some(low) = crate::autocast::target::<E, D>(&self.device) {
            let _inner = crate::autocast::suspend();
            let (x, w) = (self.try_round_to(low)?, weight.try_round_to(low)?);
            return x.try_conv_transpose2d_unnoted(&w, p)?.try_round_to(low);
        }
        let xdims = self.layout.dims;
        let wdims = weight.layout.dims;
        let out = check_conv_transpose(&xdims, &wdims, &p)?;
        let cp = p.conv();
        // The convolution of an `out`-sized input reaches one more row (or
        // column) than `x` has when the output padding is not smaller than
        // the stride (allowed when it is smaller than the dilation): that
        // row's gradient is zero, so `x` is padded with zeros to match.
        let covered = [
            xdims[0],
            xdims[1],
            window_out(out[2], wdims[2], p.stride[0], p.padding[0], p.dilation[0])
                .expect("the transposed size fits its convolution"),
            window_out(out[3], wdims[3], p.stride[1], p.padding[1], p.dilation[1])
                .expect("the transposed size fits its convolution"),
        ];
        let xr = if covered[..] == xdims[..] {
            self.raw()
        } else {
            let place = Layout::contiguous(&covered)
                .narrow(2, 0, xdims[2])
                .narrow(3, 0, xdims[3]);
            crate::tape::util::embed(&self.raw(), &covered, &place)?
        };
        // The input gradient of the convolution does not read the
        // convolution's input values, only its sizes: zeros stand in.
        let zeros = self.device.full(out.iter().product(), E::from_f64(0.0))?;
        let (s, _) = self.device.conv2d_backward(
            &zeros,
            &Layout::contiguous(&out),
            &weight.storage(),
            &weight.layout,
            &xr.storage(),
            &xr.layout,
            &cp,
            [true, false],
        )?;
        let s = s.expect("the input gradient was asked for");
        let wr = weight.raw();
        let (need_x, need_w) = (self.var.is_some(), weight.var.is_some());
        // `xr` may be a padded copy: the version to check is `self`'s.
        let saved = [need_x.then(|| wr.saved()), need_w.then(|| self.saved())]
            .into_iter()
            .flatten()
            .collect();
        Ok(Tensor::from_storage(s, &out, self.device.clone()).record(
            "conv_transpose2d",
            &[self.var.clone(), weight.var.clone()],
            saved,
            move |g| {
                let dev = &g.device;
                let gx = match need_x {
                    true => {
                        let s =
                            dev.conv2d(&g.storage(), &g.layout, &wr.storage(), &wr.layout, &cp)?;
                        let full = Raw::new(s, &covered, dev.clone());
                        Some(if covered[..] == xdims[..] {
                            full
                        } else {
                            let crop = full.layout.narrow(2, 0, xdims[2]).narrow(3, 0, xdims[3]);
                            Raw::new(dev.contiguous(&full.storage(), &crop)?, &xdims, dev.clone())
                        })
                    }
                    false => None,
                };
                let gw = match need_w {
                    true => {
                        // The weight gradient of the convolution from the
                        // output's gradient to (the padded) `x`.
                        let (_, s) = dev.conv2d_backward(
                            &g.storage(),
                            &g.layout,
                            &wr.storage(),
                            &wr.layout,
                            &xr.storage(),
                            &xr.layout,
                            &cp,
                            [false, true],
                        )?;
                        s.map(|s| Raw::new(s, &wr.layout.dims, dev.clone()))
                    }
                    false => None,
                };
                Ok(vec![gx, gw])
            },
        ))
    }

    fn try_conv_transpose2d_at<Wi: Dim, Cg: Dim, Kh: Dim, Kw: Dim>(
        &self,
        weight: &Tensor<(Wi, Cg, Kh, Kw), E, D>,
        p: ConvTranspose2dParams,
    ) -> Result<Tensor<(N, Dyn, Dyn, Dyn), E, D>> {
        let y = self.try_conv_transpose2d_unnoted(weight, p)?;
        Ok(y.noted(|| {
            let op = crate::graph::Op::ConvTranspose {
                p: p.conv(),
                output_padding: p.output_padding,
            };
            (op, vec![self.val(), weight.val()])
        }))
    }
}

/// The input of `conv_transpose2d` is `[batch, channels, height, width]`
/// (see [`crate::shape::op::ImageInput`]), stated on the weight's first dim.
type TransposedOut<S, Wi, E, D> = Tensor<
    (
        <Wi as ImageInput<S, op::conv_transpose2d>>::Batch,
        Dyn,
        Dyn,
        Dyn,
    ),
    E,
    D,
>;

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    /// 2-d transposed convolution of `[n, c_in, h, w]` by
    /// `[c_in, c_out / groups, kh, kw]`, like `F.conv_transpose2d`: the
    /// gradient of [`Tensor::conv2d`] with respect to its input, so its
    /// output is `[n, c_out, (h - 1) s - 2p + d(kh - 1) + output_padding + 1, ..]`.
    ///
    /// Computed by the backend's convolution backward kernel; its own gradient
    /// is a convolution (for the input) and a convolution's weight gradient
    /// (for the weight).
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::core::ops::conv::ConvTranspose2dParams;
    /// let x = Tensor::<(C<1>, C<1>, C<2>, C<2>)>::ones();
    /// let w = Tensor::<(C<1>, C<1>, C<2>, C<2>)>::ones();
    /// let p = ConvTranspose2dParams { stride: [2, 2], ..Default::default() };
    /// let y = x.conv_transpose2d(&w, p);
    /// assert_eq!(y.dims()[..], [1, 1, 4, 4]);
    /// assert_eq!(y.to_vec(), vec![1.0; 16]);
    /// ```
    ///
    /// # Errors
    /// When the weight's first dim is not the input channels, the channels do
    /// not divide into the groups, an output padding is not smaller than its
    /// stride or dilation, or the output would be empty.
    pub fn try_conv_transpose2d<Wi: Dim, Cg: Dim, Kh: Dim, Kw: Dim>(
        &self,
        weight: &Tensor<(Wi, Cg, Kh, Kw), E, D>,
        p: ConvTranspose2dParams,
    ) -> Result<TransposedOut<S, Wi, E, D>>
    where
        Wi: ImageInput<S, op::conv_transpose2d>,
    {
        let x = self.clone().retype::<(Dyn, Dyn, Dyn, Dyn)>();
        Ok(x.try_conv_transpose2d_at(weight, p)?.retype())
    }

    /// [`Tensor::try_conv_transpose2d`] that panics on bad sizes.
    #[track_caller]
    pub fn conv_transpose2d<Wi: Dim, Cg: Dim, Kh: Dim, Kw: Dim>(
        &self,
        weight: &Tensor<(Wi, Cg, Kh, Kw), E, D>,
        p: ConvTranspose2dParams,
    ) -> TransposedOut<S, Wi, E, D>
    where
        Wi: ImageInput<S, op::conv_transpose2d>,
    {
        ok(self.try_conv_transpose2d(weight, p))
    }
}
