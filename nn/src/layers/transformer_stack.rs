//! `TransformerEncoder` and `TransformerDecoder`: stacks of the layers in
//! [`super::transformer`] with an optional final norm, like PyTorch's, with
//! its keys (`layers.N.…`, `norm.…`).

use super::attention::AttnMasks;
use super::{LayerNorm, TransformerDecoderLayer, TransformerEncoderLayer, TransformerOptions};
use crate::module::ok;
use crate::{scope, Forward};
use forma_core::device::Device;
use forma_core::{Dim, Float, Result, Rng, Tensor, C};
use forma_cpu::Cpu;
use forma_macros::Module;

/// `num_layers` layers made by `layer`, and the final norm when
/// `final_norm` (with `options.layer_norm_eps` and `options.bias`): what both stacks' `with_options` build.
fn build<L, const D_MODEL: usize, E: Float, D: Device<E>>(
    num_layers: usize,
    options: TransformerOptions,
    final_norm: bool,
    device: &D,
    rng: &mut Rng,
    mut layer: impl FnMut(&mut Rng) -> L,
) -> (Vec<L>, Option<LayerNorm<D_MODEL, E, D>>) {
    let layers = (0..num_layers).map(|_| layer(rng)).collect();
    let norm = final_norm
        .then(|| LayerNorm::with_options(options.layer_norm_eps, true, options.bias, device));
    (layers, norm)
}

/// A stack of encoder layers, like
/// `nn.TransformerEncoder(encoder_layer, num_layers, norm=None)` with
/// `batch_first=True`: each layer in turn (all with the same masks), then
/// `norm` if there is one. Its `state_dict` has PyTorch's keys,
/// `layers.0.self_attn.in_proj_weight`, …, `norm.weight`.
///
/// PyTorch deep-copies one layer `num_layers` times, so its layers start
/// with equal weights; [`TransformerEncoder::new`] draws each layer's
/// weights on its own (pass equal layers to
/// [`TransformerEncoder::from_layers`] for PyTorch's start). Loaded weights
/// behave the same either way.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::layers::{TransformerEncoder, TransformerOptions};
/// let mut rng = Rng::seed_from(0);
/// let opts = TransformerOptions { dropout: 0.0, ..TransformerOptions::default() };
/// let enc = TransformerEncoder::<8, 2, 16>::with_options(3, opts, true, &Cpu, &mut rng);
/// let y = enc.forward(Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(5), C), &mut rng));
/// assert_eq!(y.dims()[..], [2, 5, 8]);
/// let keys: Vec<String> = enc.state_dict().keys().map(String::from).collect();
/// assert_eq!(keys[0], "layers.0.self_attn.in_proj_weight");
/// assert_eq!(keys[keys.len() - 1], "norm.bias");
/// ```
#[derive(Module, Debug)]
#[module(crate = "crate")]
pub struct TransformerEncoder<
    const D_MODEL: usize,
    const NHEAD: usize,
    const DIM_FF: usize = 2048,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// The layers, run in order.
    pub layers: Vec<TransformerEncoderLayer<D_MODEL, NHEAD, DIM_FF, E, D>>,
    /// The final norm (PyTorch's `norm` argument).
    pub norm: Option<LayerNorm<D_MODEL, E, D>>,
}

impl<const D_MODEL: usize, const NHEAD: usize, const DIM_FF: usize, E: Float, D: Device<E>>
    TransformerEncoder<D_MODEL, NHEAD, DIM_FF, E, D>
{
    /// `num_layers` layers with PyTorch's default options, no final norm.
    pub fn new(num_layers: usize, device: &D, rng: &mut Rng) -> Self {
        Self::with_options(
            num_layers,
            TransformerOptions::default(),
            false,
            device,
            rng,
        )
    }

    /// `num_layers` layers with `options`, and a final `LayerNorm` (with
    /// `options.layer_norm_eps`) when `final_norm`, as PyTorch's pre-norm
    /// recipe uses.
    ///
    /// # Panics
    /// If `options.dropout` is outside `[0, 1]`.
    pub fn with_options(
        num_layers: usize,
        options: TransformerOptions,
        final_norm: bool,
        device: &D,
        rng: &mut Rng,
    ) -> Self {
        let (layers, norm) = build(num_layers, options, final_norm, device, rng, |r| {
            TransformerEncoderLayer::with_options(options, device, r)
        });
        Self::from_layers(layers, norm)
    }

    /// A stack of the given layers and final norm.
    pub fn from_layers(
        layers: Vec<TransformerEncoderLayer<D_MODEL, NHEAD, DIM_FF, E, D>>,
        norm: Option<LayerNorm<D_MODEL, E, D>>,
    ) -> Self {
        TransformerEncoder { layers, norm }
    }

    /// The stack with masks, like
    /// `encoder(src, mask=..., src_key_padding_mask=..., is_causal=...)`:
    /// every layer gets the same masks.
    ///
    /// # Panics
    /// If a mask's run-time sizes disagree with `src`; see
    /// [`TransformerEncoder::try_forward_with`].
    #[track_caller]
    pub fn forward_with<B: Dim, T: Dim>(
        &self,
        src: Tensor<(B, T, C<D_MODEL>), E, D>,
        masks: AttnMasks<'_, B, T, T, E, D>,
    ) -> Tensor<(B, T, C<D_MODEL>), E, D> {
        ok(self.try_forward_with(src, masks))
    }

    /// Fallible [`TransformerEncoder::forward_with`].
    ///
    /// # Errors
    /// A shape error when a mask's sizes disagree with `src`, with the
    /// path of the layer that raised it.
    pub fn try_forward_with<B: Dim, T: Dim>(
        &self,
        src: Tensor<(B, T, C<D_MODEL>), E, D>,
        masks: AttnMasks<'_, B, T, T, E, D>,
    ) -> Result<Tensor<(B, T, C<D_MODEL>), E, D>> {
        let mut x = src;
        for (i, layer) in self.layers.iter().enumerate() {
            x = scope::run("layers", || {
                scope::run(i, || layer.try_forward_with(x, masks))
            })?;
        }
        match &self.norm {
            Some(norm) => norm.try_forward_as("norm", x),
            None => Ok(x),
        }
    }
}

impl<
        B: Dim,
        T: Dim,
        const D_MODEL: usize,
        const NHEAD: usize,
        const DIM_FF: usize,
        E: Float,
        D: Device<E>,
    > Forward<Tensor<(B, T, C<D_MODEL>), E, D>, Tensor<(B, T, C<D_MODEL>), E, D>>
    for TransformerEncoder<D_MODEL, NHEAD, DIM_FF, E, D>
{
    /// The stack without masks.
    fn try_forward(
        &self,
        src: Tensor<(B, T, C<D_MODEL>), E, D>,
    ) -> Result<Tensor<(B, T, C<D_MODEL>), E, D>> {
        self.try_forward_with(src, AttnMasks::default())
    }
}

/// A stack of decoder layers, like
/// `nn.TransformerDecoder(decoder_layer, num_layers, norm=None)` with
/// `batch_first=True`: each layer in turn over the same `memory` and masks,
/// then `norm` if there is one; keys `layers.N.…` and `norm.…`. Layers are
/// initialised independently (see [`TransformerEncoder`]).
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::layers::{AttnMasks, TransformerDecoder};
/// let mut rng = Rng::seed_from(0);
/// let mut dec = TransformerDecoder::<8, 2, 16>::new(2, &Cpu, &mut rng);
/// dec.eval();
/// let tgt = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(3), C), &mut rng);
/// let memory = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
/// let y = dec.forward_with(tgt, memory, AttnMasks::causal(), AttnMasks::default());
/// assert_eq!(y.dims()[..], [2, 3, 8]);
/// assert_eq!(dec.layers.len(), 2);
/// ```
#[derive(Module, Debug)]
#[module(crate = "crate")]
pub struct TransformerDecoder<
    const D_MODEL: usize,
    const NHEAD: usize,
    const DIM_FF: usize = 2048,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// The layers, run in order.
    pub layers: Vec<TransformerDecoderLayer<D_MODEL, NHEAD, DIM_FF, E, D>>,
    /// The final norm (PyTorch's `norm` argument).
    pub norm: Option<LayerNorm<D_MODEL, E, D>>,
}

impl<const D_MODEL: usize, const NHEAD: usize, const DIM_FF: usize, E: Float, D: Device<E>>
    TransformerDecoder<D_MODEL, NHEAD, DIM_FF, E, D>
{
    /// `num_layers` layers with PyTorch's default options, no final norm.
    pub fn new(num_layers: usize, device: &D, rng: &mut Rng) -> Self {
        Self::with_options(
            num_layers,
            TransformerOptions::default(),
            false,
            device,
            rng,
        )
    }

    /// `num_layers` layers with `options`, and a final `LayerNorm` when
    /// `final_norm`.
    ///
    /// # Panics
    /// If `options.dropout` is outside `[0, 1]`.
    pub fn with_options(
        num_layers: usize,
        options: TransformerOptions,
        final_norm: bool,
        device: &D,
        rng: &mut Rng,
    ) -> Self {
        let (layers, norm) = build(num_layers, options, final_norm, device, rng, |r| {
            TransformerDecoderLayer::with_options(options, device, r)
        });
        Self::from_layers(layers, norm)
    }

    /// A stack of the given layers and final norm.
    pub fn from_layers(
        layers: Vec<TransformerDecoderLayer<D_MODEL, NHEAD, DIM_FF, E, D>>,
        norm: Option<LayerNorm<D_MODEL, E, D>>,
    ) -> Self {
        TransformerDecoder { layers, norm }
    }

    /// The stack with masks, like `decoder(tgt, memory, tgt_mask=...,
    /// memory_mask=..., tgt_key_padding_mask=..., memory_key_padding_mask=...,
    /// tgt_is_causal=...)`: see [`TransformerDecoderLayer::forward_with`].
    ///
    /// # Panics
    /// If run-time sizes disagree; see [`TransformerDecoder::try_forward_with`].
    #[track_caller]
    pub fn forward_with<B: Dim, T: Dim, S: Dim>(
        &self,
        tgt: Tensor<(B, T, C<D_MODEL>), E, D>,
        memory: Tensor<(B, S, C<D_MODEL>), E, D>,
        tgt_masks: AttnMasks<'_, B, T, T, E, D>,
        memory_masks: AttnMasks<'_, B, T, S, E, D>,
    ) -> Tensor<(B, T, C<D_MODEL>), E, D> {
        ok(self.try_forward_with(tgt, memory, tgt_masks, memory_masks))
    }

    /// Fallible [`TransformerDecoder::forward_with`].
    ///
    /// # Errors
    /// A shape error when the memory's batch differs from the target's or
    /// a mask's sizes disagree, with the path of the layer that raised it.
    pub fn try_forward_with<B: Dim, T: Dim, S: Dim>(
        &self,
        tgt: Tensor<(B, T, C<D_MODEL>), E, D>,
        memory: Tensor<(B, S, C<D_MODEL>), E, D>,
        tgt_masks: AttnMasks<'_, B, T, T, E, D>,
        memory_masks: AttnMasks<'_, B, T, S, E, D>,
    ) -> Result<Tensor<(B, T, C<D_MODEL>), E, D>> {
        let mut x = tgt;
        for (i, layer) in self.layers.iter().enumerate() {
            let memory = memory.clone();
            x = scope::run("layers", || {
                scope::run(i, || {
                    layer.try_forward_with(x, memory, tgt_masks, memory_masks)
                })
            })?;
        }
        match &self.norm {
            Some(norm) => norm.try_forward_as("norm", x),
            None => Ok(x),
        }
    }
}

impl<
        B: Dim,
        T: Dim,
        S: Dim,
        const D_MODEL: usize,
        const NHEAD: usize,
        const DIM_FF: usize,
        E: Float,
        D: Device<E>,
    >
    Forward<
        (
            Tensor<(B, T, C<D_MODEL>), E, D>,
            Tensor<(B, S, C<D_MODEL>), E, D>,
        ),
        Tensor<(B, T, C<D_MODEL>), E, D>,
    > for TransformerDecoder<D_MODEL, NHEAD, DIM_FF, E, D>
{
    /// The stack on `(tgt, memory)` without masks (PyTorch's defaults: no
    /// causal mask either).
    fn try_forward(
        &self,
        (tgt, memory): (
            Tensor<(B, T, C<D_MODEL>), E, D>,
            Tensor<(B, S, C<D_MODEL>), E, D>,
        ),
    ) -> Result<Tensor<(B, T, C<D_MODEL>), E, D>> {
        self.try_forward_with(tgt, memory, AttnMasks::default(), AttnMasks::default())
    }
}

impl<const D_MODEL: usize, const NHEAD: usize, const DIM_FF: usize, E: Float, D: Device<E>>
    crate::shape_step::ShapeStep for TransformerEncoder<D_MODEL, NHEAD, DIM_FF, E, D>
{
    const STEP: crate::shape_step::Step = crate::shape_step::Step::LastAxis {
        layer: "TransformerEncoder",
        input: D_MODEL,
        output: D_MODEL,
        rank: 3,
    };
}
