//! [`SeqFirst`]: a sequence layer fed `[seq, batch, features]`, PyTorch's
//! `batch_first=False` (the default of `nn.LSTM`, `nn.GRU`,
//! `nn.MultiheadAttention` and the `nn.Transformer*` layers).

use super::attention::{AttnMasks, AttnOutput};
use super::{
    Gru, Lstm, LstmState, MultiheadAttention, TransformerDecoder, TransformerDecoderLayer,
    TransformerEncoder, TransformerEncoderLayer,
};
use crate::module::{ok, Convert, ReprNode};
use crate::{Cx, Forward, Module, Visitor, VisitorMut};
use forma_core::device::Device;
use forma_core::{Backend, Dim, Dyn, Float, Result, Tensor, C};

/// A batch-first sequence layer used sequence-first, like PyTorch's
/// `batch_first=False`: inputs and outputs are `[seq, batch, features]`
/// (the layer's own are `[batch, seq, features]`, its only layout). The
/// parameters, their `state_dict` keys and the hidden states
/// (`[layers * directions, batch, H]`) are the layer's, unchanged, as
/// `batch_first` changes none of them in PyTorch; masks keep their PyTorch
/// shapes too (`[batch, S]` key padding, `[T, S]` attention masks), and
/// MultiheadAttention's averaged weights stay `[batch, T, S]`. The repr is
/// PyTorch's for `batch_first=False`.
///
/// `forward` works for every layer whose `forward` maps `[batch, seq, F]`
/// to `[batch, seq, F2]`; the layers' other entry points are here under
/// the same names, taking and returning sequence-first tensors.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::layers::{Lstm, SeqFirst};
/// use forma::nn::{Forward, Module};
/// let mut rng = Rng::seed_from(0);
/// // nn.LSTM(3, 4): input [seq, batch, 3].
/// let lstm = SeqFirst(Lstm::<3, 4>::new(1, &Cpu, &mut rng));
/// let x = Tensor::<(Dyn, Dyn, C<3>)>::randn((Dyn(7), Dyn(2), C), &mut rng);
/// let (y, (h_n, _)): (Tensor<(Dyn, Dyn, C<4>)>, _) = lstm.forward_with(x.clone(), None);
/// assert_eq!(y.dims()[..], [7, 2, 4]);
/// assert_eq!(h_n.dims()[..], [1, 2, 4]);
/// let z: Tensor<(Dyn, Dyn, C<4>)> = lstm.0.forward(x.transpose::<0, 1>());
/// assert_eq!(y.to_vec(), z.transpose::<0, 1>().contiguous().to_vec());
/// assert_eq!(lstm.repr(), "LSTM(3, 4)");
/// assert_eq!(lstm.state_dict().keys().next(), Some("weight_ih_l0"));
/// ```
#[derive(Clone, Debug)]
pub struct SeqFirst<M>(pub M);

/// Swaps the first two axes: `[seq, batch, F]` and `[batch, seq, F]`.
fn swap<A: Dim, B: Dim, F: Dim, E: Float, D: Device<E>>(
    x: Tensor<(A, B, F), E, D>,
) -> Tensor<(B, A, F), E, D> {
    x.transpose::<0, 1>()
}

/// Transparent: the layer's parameters under its own keys, its repr
/// without `batch_first=True` (PyTorch prints the flag only when set).
impl<M: Module> Module for SeqFirst<M> {
    fn visit<V: Visitor>(&self, cx: &mut Cx, v: &mut V) {
        self.0.visit(cx, v);
    }

    fn visit_mut<V: VisitorMut>(&mut self, cx: &mut Cx, v: &mut V) {
        self.0.visit_mut(cx, v);
    }

    fn describe(&self) -> Option<ReprNode> {
        let node = self.0.describe()?;
        Some(node.map_extra(|e| e.replace(", batch_first=True", "")))
    }
}

impl<M: Convert<M2, D2>, M2, D2: Backend> Convert<SeqFirst<M2>, D2> for SeqFirst<M> {
    fn try_convert(&self, device: &D2) -> Result<SeqFirst<M2>> {
        Ok(SeqFirst(self.0.try_convert(device)?))
    }
}

impl<M, T: Dim, B: Dim, F: Dim, F2: Dim, E: Float, D: Device<E>>
    Forward<Tensor<(T, B, F), E, D>, Tensor<(T, B, F2), E, D>> for SeqFirst<M>
where
    M: Forward<Tensor<(B, T, F), E, D>, Tensor<(B, T, F2), E, D>>,
{
    fn try_forward(&self, x: Tensor<(T, B, F), E, D>) -> Result<Tensor<(T, B, F2), E, D>> {
        Ok(swap(self.0.try_forward(swap(x))?))
    }
}

impl<const I: usize, const H: usize, const BIDIR: bool, E: Float, D: Device<E>, const P: usize>
    SeqFirst<Lstm<I, H, BIDIR, E, D, P>>
{
    /// [`Lstm::forward_with`] on `[seq, batch, I]`, like `lstm(x, (h_0, c_0))`
    /// with `batch_first=False`.
    ///
    /// # Panics
    /// If the initial state's sizes are wrong.
    #[track_caller]
    pub fn forward_with<T: Dim, B: Dim, O: Dim>(
        &self,
        x: Tensor<(T, B, C<I>), E, D>,
        state: Option<LstmState<B, H, E, D, P>>,
    ) -> (Tensor<(T, B, O), E, D>, LstmState<B, H, E, D, P>) {
        ok(self.try_forward_with(x, state))
    }

    /// Fallible `forward_with` for an LSTM.
    ///
    /// # Errors
    /// As [`Lstm::try_forward_with`].
    #[allow(clippy::type_complexity)] // PyTorch's (output, (h_n, c_n))
    pub fn try_forward_with<T: Dim, B: Dim, O: Dim>(
        &self,
        x: Tensor<(T, B, C<I>), E, D>,
        state: Option<LstmState<B, H, E, D, P>>,
    ) -> Result<(Tensor<(T, B, O), E, D>, LstmState<B, H, E, D, P>)> {
        let (y, state) = self.0.try_forward_with(swap(x), state)?;
        Ok((swap(y), state))
    }
}

impl<const I: usize, const H: usize, const BIDIR: bool, E: Float, D: Device<E>>
    SeqFirst<Gru<I, H, BIDIR, E, D>>
{
    /// [`Gru::forward_with`] on `[seq, batch, I]`, like `gru(x, h_0)` with
    /// `batch_first=False`.
    ///
    /// # Panics
    /// If the initial state's sizes are wrong.
    #[track_caller]
    pub fn forward_with<T: Dim, B: Dim, O: Dim>(
        &self,
        x: Tensor<(T, B, C<I>), E, D>,
        state: Option<Tensor<(Dyn, B, C<H>), E, D>>,
    ) -> (Tensor<(T, B, O), E, D>, Tensor<(Dyn, B, C<H>), E, D>) {
        ok(self.try_forward_with(x, state))
    }

    /// Fallible `forward_with` for a GRU.
    ///
    /// # Errors
    /// As [`Gru::try_forward_with`].
    #[allow(clippy::type_complexity)] // PyTorch's (output, h_n)
    pub fn try_forward_with<T: Dim, B: Dim, O: Dim>(
        &self,
        x: Tensor<(T, B, C<I>), E, D>,
        state: Option<Tensor<(Dyn, B, C<H>), E, D>>,
    ) -> Result<(Tensor<(T, B, O), E, D>, Tensor<(Dyn, B, C<H>), E, D>)> {
        let (y, state) = self.0.try_forward_with(swap(x), state)?;
        Ok((swap(y), state))
    }
}

impl<
        const EMBED: usize,
        const HEADS: usize,
        E: Float,
        D: Device<E>,
        const KDIM: usize,
        const VDIM: usize,
    > SeqFirst<MultiheadAttention<EMBED, HEADS, E, D, KDIM, VDIM>>
{
    /// [`MultiheadAttention::attend_with`] on `[T, batch, EMBED]` queries
    /// and `[S, batch, _]` keys and values, like
    /// `mha(query, key, value, ..., need_weights=False)[0]` with
    /// `batch_first=False`.
    ///
    /// # Panics
    /// If run-time sizes disagree.
    #[track_caller]
    pub fn attend_with<T: Dim, S: Dim, B: Dim>(
        &self,
        query: &Tensor<(T, B, C<EMBED>), E, D>,
        key: &Tensor<(S, B, C<KDIM>), E, D>,
        value: &Tensor<(S, B, C<VDIM>), E, D>,
        masks: AttnMasks<'_, B, T, S, E, D>,
    ) -> Tensor<(T, B, C<EMBED>), E, D> {
        ok(self.try_attend_with(query, key, value, masks))
    }

    /// Fallible `attend_with`.
    ///
    /// # Errors
    /// As [`MultiheadAttention::try_attend_with`].
    pub fn try_attend_with<T: Dim, S: Dim, B: Dim>(
        &self,
        query: &Tensor<(T, B, C<EMBED>), E, D>,
        key: &Tensor<(S, B, C<KDIM>), E, D>,
        value: &Tensor<(S, B, C<VDIM>), E, D>,
        masks: AttnMasks<'_, B, T, S, E, D>,
    ) -> Result<Tensor<(T, B, C<EMBED>), E, D>> {
        let (q, k, v) = (swap(query.clone()), swap(key.clone()), swap(value.clone()));
        Ok(swap(self.0.try_attend_with(&q, &k, &v, masks)?))
    }

    /// `attend_with` that also returns the head-averaged
    /// weights, `[batch, T, S]` as in PyTorch whatever the layout.
    ///
    /// # Panics
    /// If run-time sizes disagree.
    #[track_caller]
    pub fn attend_with_weights<T: Dim, S: Dim, B: Dim>(
        &self,
        query: &Tensor<(T, B, C<EMBED>), E, D>,
        key: &Tensor<(S, B, C<KDIM>), E, D>,
        value: &Tensor<(S, B, C<VDIM>), E, D>,
        masks: AttnMasks<'_, B, T, S, E, D>,
    ) -> SeqFirstAttnOutput<B, T, S, EMBED, E, D> {
        ok(self.try_attend_with_weights(query, key, value, masks))
    }

    /// Fallible `attend_with_weights`.
    ///
    /// # Errors
    /// As [`MultiheadAttention::try_attend_with`].
    pub fn try_attend_with_weights<T: Dim, S: Dim, B: Dim>(
        &self,
        query: &Tensor<(T, B, C<EMBED>), E, D>,
        key: &Tensor<(S, B, C<KDIM>), E, D>,
        value: &Tensor<(S, B, C<VDIM>), E, D>,
        masks: AttnMasks<'_, B, T, S, E, D>,
    ) -> Result<SeqFirstAttnOutput<B, T, S, EMBED, E, D>> {
        let (q, k, v) = (swap(query.clone()), swap(key.clone()), swap(value.clone()));
        let AttnOutput { output, weights } = self.0.try_attend_with_weights(&q, &k, &v, masks)?;
        Ok(SeqFirstAttnOutput {
            output: swap(output),
            weights,
        })
    }
}

/// The result of `attend_with_weights`.
#[derive(Clone, Debug)]
pub struct SeqFirstAttnOutput<B: Dim, T: Dim, S: Dim, const EMBED: usize, E: Float, D: Device<E>> {
    /// The attention output, `[T, batch, EMBED]`.
    pub output: Tensor<(T, B, C<EMBED>), E, D>,
    /// The weights averaged over the heads, `[batch, T, S]`.
    pub weights: Tensor<(B, T, S), E, D>,
}

/// `forward_with(src, masks)` for an encoder layer or stack, sequence-first.
macro_rules! encoder_seq_first {
    ($layer:ident) => {
        impl<const M: usize, const H: usize, const FF: usize, E: Float, D: Device<E>>
            SeqFirst<$layer<M, H, FF, E, D>>
        {
            #[doc = concat!(" [`", stringify!($layer), "::forward_with`] on `[T, batch, D_MODEL]`, like the layer with `batch_first=False`.")]
            ///
            /// # Panics
            /// If a mask's run-time sizes disagree with `src`.
            #[track_caller]
            pub fn forward_with<T: Dim, B: Dim>(
                &self,
                src: Tensor<(T, B, C<M>), E, D>,
                masks: AttnMasks<'_, B, T, T, E, D>,
            ) -> Tensor<(T, B, C<M>), E, D> {
                ok(self.try_forward_with(src, masks))
            }

            /// Fallible `forward_with`.
            ///
            /// # Errors
            #[doc = concat!(" As [`", stringify!($layer), "::try_forward_with`].")]
            pub fn try_forward_with<T: Dim, B: Dim>(
                &self,
                src: Tensor<(T, B, C<M>), E, D>,
                masks: AttnMasks<'_, B, T, T, E, D>,
            ) -> Result<Tensor<(T, B, C<M>), E, D>> {
                Ok(swap(self.0.try_forward_with(swap(src), masks)?))
            }
        }
    };
}

/// `forward_with(tgt, memory, tgt_masks, memory_masks)` for a decoder layer
/// or stack, sequence-first.
macro_rules! decoder_seq_first {
    ($layer:ident) => {
        impl<const M: usize, const H: usize, const FF: usize, E: Float, D: Device<E>>
            SeqFirst<$layer<M, H, FF, E, D>>
        {
            #[doc = concat!(" [`", stringify!($layer), "::forward_with`] on `[T, batch, D_MODEL]` targets and `[S, batch, D_MODEL]` memory, like the layer with `batch_first=False`.")]
            ///
            /// # Panics
            /// If run-time sizes disagree.
            #[track_caller]
            pub fn forward_with<T: Dim, S: Dim, B: Dim>(
                &self,
                tgt: Tensor<(T, B, C<M>), E, D>,
                memory: Tensor<(S, B, C<M>), E, D>,
                tgt_masks: AttnMasks<'_, B, T, T, E, D>,
                memory_masks: AttnMasks<'_, B, T, S, E, D>,
            ) -> Tensor<(T, B, C<M>), E, D> {
                ok(self.try_forward_with(tgt, memory, tgt_masks, memory_masks))
            }

            /// Fallible `forward_with`.
            ///
            /// # Errors
            #[doc = concat!(" As [`", stringify!($layer), "::try_forward_with`].")]
            pub fn try_forward_with<T: Dim, S: Dim, B: Dim>(
                &self,
                tgt: Tensor<(T, B, C<M>), E, D>,
                memory: Tensor<(S, B, C<M>), E, D>,
                tgt_masks: AttnMasks<'_, B, T, T, E, D>,
                memory_masks: AttnMasks<'_, B, T, S, E, D>,
            ) -> Result<Tensor<(T, B, C<M>), E, D>> {
                let y = self
                    .0
                    .try_forward_with(swap(tgt), swap(memory), tgt_masks, memory_masks)?;
                Ok(swap(y))
            }
        }
    };
}

encoder_seq_first!(TransformerEncoderLayer);
encoder_seq_first!(TransformerEncoder);
decoder_seq_first!(TransformerDecoderLayer);
decoder_seq_first!(TransformerDecoder);

/// A sequence-first layer acts on the same last axis as the layer it wraps.
impl<M: crate::shape_step::ShapeStep> crate::shape_step::ShapeStep for SeqFirst<M> {
    const STEP: crate::shape_step::Step = M::STEP;
}
