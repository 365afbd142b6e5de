//! `TransformerEncoderLayer` and `TransformerDecoderLayer`, like PyTorch's
//! with `batch_first=True`: the same fields (so the same state_dict keys),
//! defaults, post-norm or pre-norm (`norm_first`) arithmetic and masks.

use super::attention::{AttnMasks, Masks};
use super::dropout::check_dropout;
use super::{restore, Dropout, LayerNorm, Linear, MultiheadAttention};
use crate::module::ok;
use crate::{scope, Forward};
use forma_core::device::Device;
use forma_core::ops::fused::{fused, UnaryExprs};
use forma_core::{Dim, Dyn, Error, Float, Result, Rng, Tensor, C};
use forma_cpu::Cpu;
use forma_macros::Module;

/// PyTorch's `_sa_block` / `_mha_block`, shared by both layers: attention of
/// `x` over `kv`, then its dropout, each run as the named child the layer's
/// `state_dict` names.
fn attention_block<const M: usize, const H: usize, E: Float, D: Device<E>>(
    (name, attn): (&'static str, &MultiheadAttention<M, H, E, D>),
    (dropout_name, dropout): (&'static str, &Dropout),
    x: &Tensor<(Dyn, Dyn, C<M>), E, D>,
    kv: &Tensor<(Dyn, Dyn, C<M>), E, D>,
    masks: &Masks<E, D>,
) -> Result<Tensor<(Dyn, Dyn, C<M>), E, D>> {
    let y = scope::run(name, || attn.attend_erased(x, kv, kv, masks))?;
    dropout.try_forward_as(dropout_name, y)
}

/// The feed-forward pieces both layers have, by their field names:
/// `activation`, `linear1`, `dropout`, `linear2`.
type FeedForward<'a, const M: usize, const F: usize, E, D> = (
    Activation,
    &'a Linear<M, F, E, D>,
    &'a Dropout,
    &'a Linear<F, M, E, D>,
);

/// PyTorch's `_ff_block`, shared by both layers: `linear1` and the
/// activation, `dropout`, `linear2`, then the output dropout (`dropout2` in
/// the encoder, `dropout3` in the decoder).
fn feed_forward_block<const M: usize, const F: usize, E: Float, D: Device<E>>(
    (activation, linear1, dropout, linear2): FeedForward<'_, M, F, E, D>,
    (out_name, out): (&'static str, &Dropout),
    x: Tensor<(Dyn, Dyn, C<M>), E, D>,
) -> Result<Tensor<(Dyn, Dyn, C<M>), E, D>> {
    let hidden = scope::run("linear1", || activation.after_linear(linear1, x))?;
    let hidden = dropout.try_forward_as("dropout", hidden)?;
    let y = linear2.try_forward_as("linear2", hidden)?;
    out.try_forward_as(out_name, y)
}

/// The feed-forward activation, PyTorch's `activation="relu"` or `"gelu"`
/// (the exact GELU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    /// `F.relu`, PyTorch's default.
    #[default]
    Relu,
    /// `F.gelu` (erf form).
    Gelu,
}

impl Activation {
    fn apply<S: forma_core::Shape, E: Float, D: Device<E>>(
        self,
        x: Tensor<S, E, D>,
    ) -> Tensor<S, E, D> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(),
        }
    }

    /// `self(linear(x))`, with the bias add and the activation fused into
    /// one pass over the hidden tensor (the same f32/f64 bits as the two ops).
    fn after_linear<const I: usize, const O: usize, E: Float, D: Device<E>>(
        self,
        linear: &Linear<I, O, E, D>,
        x: Tensor<(Dyn, Dyn, C<I>), E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, C<O>), E, D>> {
        if forma_core::autocast::autocast_dtype(x.device()).is_some() {
            // Autocast: the bias belongs inside the rounded product, as in
            // PyTorch's `linear` (adding it after the rounding would leave
            // values that are not low-precision ones).
            return Ok(self.apply(x.try_linear(&linear.weight, linear.bias.as_ref())?));
        }
        let y = x.try_matmul(&linear.weight.t())?;
        Ok(match (&linear.bias, self) {
            (Some(b), Activation::Relu) => fused((&y, b), |(y, b)| (y + b).relu()),
            (Some(b), Activation::Gelu) => fused((&y, b), |(y, b)| (y + b).gelu()),
            (None, _) => self.apply(y),
        })
    }
}

/// The constructor arguments of a transformer layer besides its sizes, with
/// PyTorch's defaults: `dropout=0.1`, `activation="relu"`,
/// `layer_norm_eps=1e-5`, `norm_first=False`, `bias=True`. (The layers
/// are batch-first; [`SeqFirst`](super::SeqFirst) gives `batch_first=False`.)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransformerOptions {
    /// Dropout probability after attention, inside and after the
    /// feed-forward block, and on the attention weights.
    pub dropout: f64,
    /// The feed-forward activation.
    pub activation: Activation,
    /// The layer norms' epsilon.
    pub layer_norm_eps: f64,
    /// Pre-norm (`true`): normalise before each block; post-norm (`false`):
    /// after each residual sum.
    pub norm_first: bool,
    /// Whether the projections (attention and feed-forward) and the layer
    /// norms have biases.
    pub bias: bool,
}

impl Default for TransformerOptions {
    fn default() -> Self {
        TransformerOptions {
            dropout: 0.1,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            norm_first: false,
            bias: true,
        }
    }
}

/// One transformer encoder layer, like
/// `nn.TransformerEncoderLayer(D_MODEL, NHEAD, DIM_FF, batch_first=True)`:
/// self-attention then a feed-forward block (`linear1`, activation,
/// `linear2`), each with dropout, a residual connection and a layer norm.
/// Inputs are `[batch, seq, D_MODEL]`; the batch and sequence sizes may be
/// `Dyn`. `DIM_FF` defaults to PyTorch's 2048.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::layers::{AttnMasks, Mask, TransformerEncoderLayer};
/// use forma::nn::{Forward, Module};
/// let mut rng = Rng::seed_from(0);
/// let mut layer = TransformerEncoderLayer::<8, 2, 16>::new(&Cpu, &mut rng);
/// layer.eval();
/// let x = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(3), C), &mut rng);
/// let y = layer.forward(x.clone());
/// assert_eq!(y.dims()[..], [2, 3, 8]);
/// // The second sequence has one padding position.
/// let pad = Tensor::<(Dyn, Dyn), bool>::from_vec(
///     vec![false, false, false, false, false, true], (Dyn(2), Dyn(3))).unwrap();
/// let masks = AttnMasks { key_padding_mask: Some(Mask::Hide(&pad)), ..AttnMasks::default() };
/// let y = layer.forward_with(x, masks);
/// assert_eq!(y.dims()[..], [2, 3, 8]);
/// assert_eq!(layer.state_dict().len(), 12);
/// ```
#[derive(Module, Debug)]
#[module(crate = "crate")]
pub struct TransformerEncoderLayer<
    const D_MODEL: usize,
    const NHEAD: usize,
    const DIM_FF: usize = 2048,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// Self-attention.
    pub self_attn: MultiheadAttention<D_MODEL, NHEAD, E, D>,
    /// The feed-forward block's first projection.
    pub linear1: Linear<D_MODEL, DIM_FF, E, D>,
    /// Dropout after the activation.
    pub dropout: Dropout,
    /// The feed-forward block's second projection.
    pub linear2: Linear<DIM_FF, D_MODEL, E, D>,
    /// Pre-norm (`true`) or post-norm.
    pub norm_first: bool,
    /// The norm of the attention block.
    pub norm1: LayerNorm<D_MODEL, E, D>,
    /// The norm of the feed-forward block.
    pub norm2: LayerNorm<D_MODEL, E, D>,
    /// Dropout on the attention output.
    pub dropout1: Dropout,
    /// Dropout on the feed-forward output.
    pub dropout2: Dropout,
    /// The feed-forward activation (a function in PyTorch, so not a child).
    #[module(skip)]
    pub activation: Activation,
}

impl<const D_MODEL: usize, const NHEAD: usize, const DIM_FF: usize, E: Float, D: Device<E>>
    TransformerEncoderLayer<D_MODEL, NHEAD, DIM_FF, E, D>
{
    /// A layer with PyTorch's defaults and initialisation.
    pub fn new(device: &D, rng: &mut Rng) -> Self {
        Self::with_options(TransformerOptions::default(), device, rng)
    }

    /// A layer with the given options.
    ///
    /// # Panics
    /// If `options.dropout` is outside `[0, 1]`.
    pub fn with_options(options: TransformerOptions, device: &D, rng: &mut Rng) -> Self {
        check_dropout("TransformerEncoderLayer", options.dropout);
        let p = options.dropout;
        TransformerEncoderLayer {
            self_attn: MultiheadAttention::with_options(p, options.bias, device, rng),
            linear1: Linear::with_bias(options.bias, device, rng),
            dropout: Dropout::new(p, rng),
            linear2: Linear::with_bias(options.bias, device, rng),
            norm_first: options.norm_first,
            norm1: LayerNorm::with_options(options.layer_norm_eps, true, options.bias, device),
            norm2: LayerNorm::with_options(options.layer_norm_eps, true, options.bias, device),
            dropout1: Dropout::new(p, rng),
            dropout2: Dropout::new(p, rng),
            activation: options.activation,
        }
    }

    fn sa_block(
        &self,
        x: &Tensor<(Dyn, Dyn, C<D_MODEL>), E, D>,
        masks: &Masks<E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, C<D_MODEL>), E, D>> {
        attention_block(
            ("self_attn", &self.self_attn),
            ("dropout1", &self.dropout1),
            x,
            x,
            masks,
        )
    }

    fn ff_block(
        &self,
        x: Tensor<(Dyn, Dyn, C<D_MODEL>), E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, C<D_MODEL>), E, D>> {
        let ff = (self.activation, &self.linear1, &self.dropout, &self.linear2);
        feed_forward_block(ff, ("dropout2", &self.dropout2), x)
    }

    /// The layer with masks, like `layer(src, src_mask=..., src_key_padding_mask=..., is_causal=...)`:
    /// `masks.attn_mask` is `src_mask` (`[T, T]`), `masks.key_padding_mask`
    /// is `src_key_padding_mask` (`[batch, T]`).
    ///
    /// # Panics
    /// If a mask's run-time sizes disagree with `src`; see
    /// [`TransformerEncoderLayer::try_forward_with`].
    #[track_caller]
    pub fn forward_with<B: Dim, T: Dim>(
        &self,
        src: Tensor<(B, T, C<D_MODEL>), E, D>,
        masks: AttnMasks<'_, B, T, T, E, D>,
    ) -> Tensor<(B, T, C<D_MODEL>), E, D> {
        ok(self.try_forward_with(src, masks))
    }

    /// Fallible [`TransformerEncoderLayer::forward_with`].
    ///
    /// # Errors
    /// A shape error when a mask's sizes disagree with `src`.
    pub fn try_forward_with<B: Dim, T: Dim>(
        &self,
        src: Tensor<(B, T, C<D_MODEL>), E, D>,
        masks: AttnMasks<'_, B, T, T, E, D>,
    ) -> Result<Tensor<(B, T, C<D_MODEL>), E, D>> {
        let (b, t) = (src.size(0), src.size(1));
        let masks = masks.erase(b, t, t)?;
        let x: Tensor<(Dyn, Dyn, C<D_MODEL>), E, D> = restore(src);
        let y = if self.norm_first {
            let x = &x + &self.sa_block(&self.norm1.try_forward_as("norm1", x.clone())?, &masks)?;
            &x + &self.ff_block(self.norm2.try_forward_as("norm2", x.clone())?)?
        } else {
            let x = self
                .norm1
                .try_forward_as("norm1", &x + &self.sa_block(&x, &masks)?)?;
            self.norm2
                .try_forward_as("norm2", &x + &self.ff_block(x.clone())?)?
        };
        Ok(restore(y))
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
    for TransformerEncoderLayer<D_MODEL, NHEAD, DIM_FF, E, D>
{
    /// The layer without masks.
    fn try_forward(
        &self,
        src: Tensor<(B, T, C<D_MODEL>), E, D>,
    ) -> Result<Tensor<(B, T, C<D_MODEL>), E, D>> {
        self.try_forward_with(src, AttnMasks::default())
    }
}

/// One transformer decoder layer, like
/// `nn.TransformerDecoderLayer(D_MODEL, NHEAD, DIM_FF, batch_first=True)`:
/// self-attention over the target, attention over the encoder's output
/// (`memory`), then a feed-forward block, each with dropout, a residual
/// connection and a layer norm. Targets are `[batch, T, D_MODEL]`, memory
/// `[batch, S, D_MODEL]`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::layers::{AttnMasks, TransformerDecoderLayer};
/// use forma::nn::Module;
/// let mut rng = Rng::seed_from(0);
/// let mut layer = TransformerDecoderLayer::<8, 2, 16>::new(&Cpu, &mut rng);
/// layer.eval();
/// let tgt = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(3), C), &mut rng);
/// let memory = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
/// // Causal self-attention, as when decoding left to right.
/// let y = layer.forward_with(tgt, memory, AttnMasks::causal(), AttnMasks::default());
/// assert_eq!(y.dims()[..], [2, 3, 8]);
/// ```
#[derive(Module, Debug)]
#[module(crate = "crate")]
pub struct TransformerDecoderLayer<
    const D_MODEL: usize,
    const NHEAD: usize,
    const DIM_FF: usize = 2048,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// Self-attention over the target.
    pub self_attn: MultiheadAttention<D_MODEL, NHEAD, E, D>,
    /// Attention over the memory.
    pub multihead_attn: MultiheadAttention<D_MODEL, NHEAD, E, D>,
    /// The feed-forward block's first projection.
    pub linear1: Linear<D_MODEL, DIM_FF, E, D>,
    /// Dropout after the activation.
    pub dropout: Dropout,
    /// The feed-forward block's second projection.
    pub linear2: Linear<DIM_FF, D_MODEL, E, D>,
    /// Pre-norm (`true`) or post-norm.
    pub norm_first: bool,
    /// The norm of the self-attention block.
    pub norm1: LayerNorm<D_MODEL, E, D>,
    /// The norm of the memory-attention block.
    pub norm2: LayerNorm<D_MODEL, E, D>,
    /// The norm of the feed-forward block.
    pub norm3: LayerNorm<D_MODEL, E, D>,
    /// Dropout on the self-attention output.
    pub dropout1: Dropout,
    /// Dropout on the memory-attention output.
    pub dropout2: Dropout,
    /// Dropout on the feed-forward output.
    pub dropout3: Dropout,
    /// The feed-forward activation (a function in PyTorch, so not a child).
    #[module(skip)]
    pub activation: Activation,
}

impl<const D_MODEL: usize, const NHEAD: usize, const DIM_FF: usize, E: Float, D: Device<E>>
    TransformerDecoderLayer<D_MODEL, NHEAD, DIM_FF, E, D>
{
    /// A layer with PyTorch's defaults and initialisation.
    pub fn new(device: &D, rng: &mut Rng) -> Self {
        Self::with_options(TransformerOptions::default(), device, rng)
    }

    /// A layer with the given options.
    ///
    /// # Panics
    /// If `options.dropout` is outside `[0, 1]`.
    pub fn with_options(options: TransformerOptions, device: &D, rng: &mut Rng) -> Self {
        check_dropout("TransformerDecoderLayer", options.dropout);
        let p = options.dropout;
        let eps = options.layer_norm_eps;
        TransformerDecoderLayer {
            self_attn: MultiheadAttention::with_options(p, options.bias, device, rng),
            multihead_attn: MultiheadAttention::with_options(p, options.bias, device, rng),
            linear1: Linear::with_bias(options.bias, device, rng),
            dropout: Dropout::new(p, rng),
            linear2: Linear::with_bias(options.bias, device, rng),
            norm_first: options.norm_first,
            norm1: LayerNorm::with_options(eps, true, options.bias, device),
            norm2: LayerNorm::with_options(eps, true, options.bias, device),
            norm3: LayerNorm::with_options(eps, true, options.bias, device),
            dropout1: Dropout::new(p, rng),
            dropout2: Dropout::new(p, rng),
            dropout3: Dropout::new(p, rng),
            activation: options.activation,
        }
    }

    fn sa_block(
        &self,
        x: &Tensor<(Dyn, Dyn, C<D_MODEL>), E, D>,
        masks: &Masks<E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, C<D_MODEL>), E, D>> {
        attention_block(
            ("self_attn", &self.self_attn),
            ("dropout1", &self.dropout1),
            x,
            x,
            masks,
        )
    }

    fn mha_block(
        &self,
        x: &Tensor<(Dyn, Dyn, C<D_MODEL>), E, D>,
        memory: &Tensor<(Dyn, Dyn, C<D_MODEL>), E, D>,
        masks: &Masks<E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, C<D_MODEL>), E, D>> {
        let attn = ("multihead_attn", &self.multihead_attn);
        attention_block(attn, ("dropout2", &self.dropout2), x, memory, masks)
    }

    fn ff_block(
        &self,
        x: Tensor<(Dyn, Dyn, C<D_MODEL>), E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, C<D_MODEL>), E, D>> {
        let ff = (self.activation, &self.linear1, &self.dropout, &self.linear2);
        feed_forward_block(ff, ("dropout3", &self.dropout3), x)
    }

    /// The layer with masks, like
    /// `layer(tgt, memory, tgt_mask=..., memory_mask=..., tgt_key_padding_mask=...,
    /// memory_key_padding_mask=..., tgt_is_causal=..., memory_is_causal=...)`:
    /// `tgt_masks` holds `tgt_mask` (`[T, T]`), `tgt_key_padding_mask`
    /// (`[batch, T]`) and `tgt_is_causal`; `memory_masks` holds `memory_mask`
    /// (`[T, S]`), `memory_key_padding_mask` (`[batch, S]`) and
    /// `memory_is_causal`.
    ///
    /// # Panics
    /// If run-time sizes disagree; see [`TransformerDecoderLayer::try_forward_with`].
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

    /// Fallible [`TransformerDecoderLayer::forward_with`].
    ///
    /// # Errors
    /// A shape error when the memory's batch differs from the target's, or a
    /// mask's sizes disagree.
    pub fn try_forward_with<B: Dim, T: Dim, S: Dim>(
        &self,
        tgt: Tensor<(B, T, C<D_MODEL>), E, D>,
        memory: Tensor<(B, S, C<D_MODEL>), E, D>,
        tgt_masks: AttnMasks<'_, B, T, T, E, D>,
        memory_masks: AttnMasks<'_, B, T, S, E, D>,
    ) -> Result<Tensor<(B, T, C<D_MODEL>), E, D>> {
        let (b, t, s) = (tgt.size(0), tgt.size(1), memory.size(1));
        if memory.size(0) != b {
            return Err(Error::shape(
                "TransformerDecoderLayer",
                format!("a memory of [{b}, _, {D_MODEL}] (the target's batch)"),
                &memory.dims(),
            ));
        }
        let tgt_masks = tgt_masks.erase(b, t, t)?;
        let memory_masks = memory_masks.erase(b, t, s)?;
        let x: Tensor<(Dyn, Dyn, C<D_MODEL>), E, D> = restore(tgt);
        let mem: Tensor<(Dyn, Dyn, C<D_MODEL>), E, D> = restore(memory);
        let y = if self.norm_first {
            let n1 = self.norm1.try_forward_as("norm1", x.clone())?;
            let x = &x + &self.sa_block(&n1, &tgt_masks)?;
            let n2 = self.norm2.try_forward_as("norm2", x.clone())?;
            let x = &x + &self.mha_block(&n2, &mem, &memory_masks)?;
            &x + &self.ff_block(self.norm3.try_forward_as("norm3", x.clone())?)?
        } else {
            let x = self
                .norm1
                .try_forward_as("norm1", &x + &self.sa_block(&x, &tgt_masks)?)?;
            let x = self
                .norm2
                .try_forward_as("norm2", &x + &self.mha_block(&x, &mem, &memory_masks)?)?;
            self.norm3
                .try_forward_as("norm3", &x + &self.ff_block(x.clone())?)?
        };
        Ok(restore(y))
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
    > for TransformerDecoderLayer<D_MODEL, NHEAD, DIM_FF, E, D>
{
    /// The layer on `(tgt, memory)` without masks (PyTorch's defaults: no
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
    crate::shape_step::ShapeStep for TransformerEncoderLayer<D_MODEL, NHEAD, DIM_FF, E, D>
{
    const STEP: crate::shape_step::Step = crate::shape_step::Step::LastAxis {
        layer: "TransformerEncoderLayer",
        input: D_MODEL,
        output: D_MODEL,
        rank: 3,
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use forma_core::autocast::autocast;
    use forma_core::DType;

    /// Under autocast a feed-forward block's first layer adds its bias
    /// inside the rounded product (PyTorch's `linear`), so the activation
    /// sees, and returns, bf16 values.
    #[test]
    fn under_autocast_the_activation_follows_the_rounded_linear() {
        let mut rng = Rng::seed_from(3);
        let linear: Linear<8, 16> = Linear::new(&Cpu, &mut rng);
        let x = Tensor::<(Dyn, Dyn, C<8>), f32, Cpu>::randn((Dyn(2), Dyn(3), C), &mut rng);
        let _amp = autocast(DType::BF16);
        for act in [Activation::Relu, Activation::Gelu] {
            let got = act.after_linear(&linear, x.clone()).unwrap().to_vec();
            let y = x.try_linear(&linear.weight, linear.bias.as_ref()).unwrap();
            assert_eq!(got, act.apply(y).to_vec(), "{act:?}");
            if act == Activation::Relu {
                // ReLU of bf16 values is bf16: the low 16 bits are zero.
                assert!(got.iter().all(|v| v.to_bits() & 0xffff == 0), "{got:?}");
            }
        }
    }
}
