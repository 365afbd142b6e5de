//! `MultiheadAttention`, like `nn.MultiheadAttention(EMBED, HEADS, batch_first=True)`,
//! the masks it takes ([`Mask`], [`AttnMasks`]) and its output projection
//! ([`NonDynamicallyQuantizableLinear`], PyTorch's name for it).

use super::check::assert_heads;
use super::dropout::{check_dropout, DropoutRng};
use super::{fan_in_uniform, filled, restore, Linear};
use crate::module::ok;
use crate::{Forward, Training};
use forma_core::device::Device;
use forma_core::ops::attention::causal_mask;
use forma_core::ops::cat::try_cat;
use forma_core::ops::pad::PadMode;
use forma_core::{Dim, Dyn, Error, Float, Result, Rng, Shape, Tensor, C};
use forma_cpu::Cpu;
use forma_macros::Module;

/// An attention mask in either of PyTorch's two forms.
pub enum Mask<'a, S: Shape, E: Float = f32, D: Device<E> = Cpu> {
    /// A bool mask: `true` hides the position (its score becomes `-inf`).
    Hide(&'a Tensor<S, bool, D>),
    /// A float mask, added to the scores (`-inf` hides, other values bias).
    Add(&'a Tensor<S, E, D>),
}

impl<S: Shape, E: Float, D: Device<E>> Clone for Mask<'_, S, E, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S: Shape, E: Float, D: Device<E>> Copy for Mask<'_, S, E, D> {}

impl<S: Shape, E: Float, D: Device<E>> std::fmt::Debug for Mask<'_, S, E, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mask::Hide(m) => write!(f, "Mask::Hide({:?})", m.dims()),
            Mask::Add(m) => write!(f, "Mask::Add({:?})", m.dims()),
        }
    }
}

impl<S: Shape, E: Float, D: Device<E>> Mask<'_, S, E, D> {
    fn dims(&self) -> Vec<usize> {
        match self {
            Mask::Hide(m) => m.dims().to_vec(),
            Mask::Add(m) => m.dims().to_vec(),
        }
    }

    fn erase(&self) -> ErasedMask<E, D> {
        match self {
            Mask::Hide(m) => ErasedMask::Hide(m.reshape_dyn2()),
            Mask::Add(m) => ErasedMask::Add(m.reshape_dyn2()),
        }
    }
}

/// A rank-2 tensor's sizes forgotten (both masks are rank 2).
trait Dyn2<E: forma_core::Dtype, D: forma_core::Backend> {
    fn reshape_dyn2(&self) -> Tensor<(Dyn, Dyn), E, D>;
}

impl<S: Shape, E: forma_core::Dtype, D: forma_core::Backend> Dyn2<E, D> for Tensor<S, E, D> {
    fn reshape_dyn2(&self) -> Tensor<(Dyn, Dyn), E, D> {
        match self.try_into_shape() {
            Ok(t) => t,
            Err(e) => unreachable!("masks are rank 2 by their types: {e}"),
        }
    }
}

/// The masks of one attention call, like the `key_padding_mask`, `attn_mask`
/// and `is_causal` arguments of PyTorch's `MultiheadAttention.forward`, for a
/// batch `B` of `T` queries over `S` keys. Every mask left out hides nothing.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::layers::{AttnMasks, Mask};
/// // Hide the last of three keys in the second sequence, and later positions.
/// let pad = Tensor::<(Dyn, Dyn), bool>::from_vec(
///     vec![false, false, false, false, false, true], (Dyn(2), Dyn(3))).unwrap();
/// let masks = AttnMasks::<Dyn, Dyn, Dyn> {
///     key_padding_mask: Some(Mask::Hide(&pad)),
///     ..AttnMasks::causal()
/// };
/// assert!(masks.is_causal);
/// ```
pub struct AttnMasks<'a, B: Dim, T: Dim, S: Dim, E: Float = f32, D: Device<E> = Cpu> {
    /// `[batch, S]`: keys to ignore per sequence (padding).
    pub key_padding_mask: Option<Mask<'a, (B, S), E, D>>,
    /// `[T, S]`: a mask shared by the whole batch (PyTorch's 2-D `attn_mask`).
    pub attn_mask: Option<Mask<'a, (T, S), E, D>>,
    /// Hides key `j` from query `i` when `j > i`, as
    /// `nn.Transformer.generate_square_subsequent_mask` given as `attn_mask`
    /// does. It adds to `attn_mask` if both are given (PyTorch treats
    /// `is_causal` as a hint that `attn_mask` is that mask).
    pub is_causal: bool,
}

impl<B: Dim, T: Dim, S: Dim, E: Float, D: Device<E>> Default for AttnMasks<'_, B, T, S, E, D> {
    fn default() -> Self {
        AttnMasks {
            key_padding_mask: None,
            attn_mask: None,
            is_causal: false,
        }
    }
}

impl<B: Dim, T: Dim, S: Dim, E: Float, D: Device<E>> Clone for AttnMasks<'_, B, T, S, E, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Dim, T: Dim, S: Dim, E: Float, D: Device<E>> Copy for AttnMasks<'_, B, T, S, E, D> {}

impl<B: Dim, T: Dim, S: Dim, E: Float, D: Device<E>> std::fmt::Debug
    for AttnMasks<'_, B, T, S, E, D>
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttnMasks")
            .field("key_padding_mask", &self.key_padding_mask)
            .field("attn_mask", &self.attn_mask)
            .field("is_causal", &self.is_causal)
            .finish()
    }
}

impl<B: Dim, T: Dim, S: Dim, E: Float, D: Device<E>> AttnMasks<'_, B, T, S, E, D> {
    /// Only the causal mask.
    pub fn causal() -> Self {
        AttnMasks {
            is_causal: true,
            ..AttnMasks::default()
        }
    }

    /// The masks on erased sizes, checked against the batch, query and key
    /// sizes.
    pub(crate) fn erase(&self, b: usize, t: usize, s: usize) -> Result<Masks<E, D>> {
        if let Some(m) = &self.key_padding_mask {
            let dims = m.dims();
            if dims != [b, s] {
                return Err(Error::shape(
                    "MultiheadAttention",
                    format!("a key_padding_mask of [{b}, {s}] (batch, keys)"),
                    &dims,
                ));
            }
        }
        if let Some(m) = &self.attn_mask {
            let dims = m.dims();
            if dims != [t, s] {
                return Err(Error::shape(
                    "MultiheadAttention",
                    format!("an attn_mask of [{t}, {s}] (queries, keys)"),
                    &dims,
                ));
            }
        }
        Ok(Masks {
            key_padding: self.key_padding_mask.as_ref().map(Mask::erase),
            attn: self.attn_mask.as_ref().map(Mask::erase),
            causal: self.is_causal,
        })
    }
}

/// A [`Mask`] on erased sizes, owned.
pub(crate) enum ErasedMask<E: Float, D: Device<E>> {
    Hide(Tensor<(Dyn, Dyn), bool, D>),
    Add(Tensor<(Dyn, Dyn), E, D>),
}

impl<E: Float, D: Device<E>> ErasedMask<E, D> {
    /// The mask in its additive form: `-inf` where a bool mask hides.
    fn additive(&self) -> Tensor<(Dyn, Dyn), E, D> {
        match self {
            ErasedMask::Add(m) => m.clone(),
            ErasedMask::Hide(m) => {
                let zeros = Tensor::<(Dyn, Dyn), E, D>::zeros_on(m.shape(), m.device());
                zeros.masked_fill(m, f64::NEG_INFINITY)
            }
        }
    }
}

/// [`AttnMasks`] on erased sizes, owned: what the computation reads.
pub(crate) struct Masks<E: Float, D: Device<E>> {
    pub key_padding: Option<ErasedMask<E, D>>,
    pub attn: Option<ErasedMask<E, D>>,
    pub causal: bool,
}

impl<E: Float, D: Device<E>> Masks<E, D> {
    /// Applies the masks to scores `[batch, heads, T, S]`.
    fn apply(
        &self,
        mut scores: Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>> {
        match &self.attn {
            Some(ErasedMask::Hide(m)) => scores = scores.try_masked_fill(m, f64::NEG_INFINITY)?,
            Some(ErasedMask::Add(m)) => scores = &scores + m,
            None => {}
        }
        match &self.key_padding {
            Some(ErasedMask::Hide(m)) => {
                let m = m.unsqueeze::<1>().unsqueeze::<1>();
                scores = scores.try_masked_fill(&m, f64::NEG_INFINITY)?;
            }
            Some(ErasedMask::Add(m)) => scores = &scores + &m.unsqueeze::<1>().unsqueeze::<1>(),
            None => {}
        }
        if self.causal {
            let hide = causal_mask(scores.size(2), scores.size(3), scores.device())?;
            scores = scores.try_masked_fill(&hide, f64::NEG_INFINITY)?;
        }
        Ok(scores)
    }
}

/// Attention's output projection: a [`Linear`] that PyTorch names
/// `NonDynamicallyQuantizableLinear` (so quantization leaves it alone) and
/// prints under that name. Its keys are the Linear's (`out_proj.weight`,
/// `out_proj.bias`); it dereferences to the Linear.
#[derive(Module, Clone, Debug)]
#[module(
    crate = "crate",
    name = "NonDynamicallyQuantizableLinear",
    extra_repr = "Self::extra_repr"
)]
pub struct NonDynamicallyQuantizableLinear<const EMBED: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// The projection; its tensors sit at this module's level.
    #[module(flatten)]
    pub linear: Linear<EMBED, EMBED, E, D>,
}

impl<const EMBED: usize, E: Float, D: Device<E>> NonDynamicallyQuantizableLinear<EMBED, E, D> {
    fn extra_repr(&self) -> String {
        let bias = if self.linear.bias.is_some() {
            "True"
        } else {
            "False"
        };
        format!("in_features={EMBED}, out_features={EMBED}, bias={bias}")
    }
}

impl<const EMBED: usize, E: Float, D: Device<E>> std::ops::Deref
    for NonDynamicallyQuantizableLinear<EMBED, E, D>
{
    type Target = Linear<EMBED, EMBED, E, D>;
    fn deref(&self) -> &Self::Target {
        &self.linear
    }
}

impl<const EMBED: usize, E: Float, D: Device<E>> std::ops::DerefMut
    for NonDynamicallyQuantizableLinear<EMBED, E, D>
{
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.linear
    }
}

impl<X, Y, const EMBED: usize, E: Float, D: Device<E>> Forward<X, Y>
    for NonDynamicallyQuantizableLinear<EMBED, E, D>
where
    Linear<EMBED, EMBED, E, D>: Forward<X, Y>,
{
    fn try_forward(&self, x: X) -> Result<Y> {
        self.linear.try_forward(x)
    }
}

/// Multi-head scaled dot-product attention over `[batch, seq, EMBED]`
/// tensors (PyTorch's `batch_first=True` layout; [`SeqFirst`](super::SeqFirst)
/// takes `[seq, batch, EMBED]`), with PyTorch's parameters:
/// the query, key and value projections stacked in `in_proj_weight`
/// (`[3 * EMBED, EMBED]`) and `in_proj_bias` (`[3 * EMBED]`), then
/// `out_proj`. `EMBED` must split evenly into `HEADS` heads, checked when the
/// program is built. Dropout on the attention weights (`dropout`, 0 by
/// default) applies in training mode only.
///
/// [`MultiheadAttention::add_bias_kv`] and
/// [`MultiheadAttention::add_zero_attn`] give PyTorch's options of those
/// names. Keys and values of other widths (`kdim=KDIM, vdim=VDIM`) are the
/// last two parameters, `MultiheadAttention<EMBED, HEADS, E, D, KDIM, VDIM>`
/// (both `EMBED` by default): the projections are then separate,
/// `q_proj_weight` `[EMBED, EMBED]`, `k_proj_weight` `[EMBED, KDIM]` and
/// `v_proj_weight` `[EMBED, VDIM]`, as PyTorch's, and self-attention
/// (`forward`) needs the default widths. Not supported: 3-D (per-head)
/// `attn_mask`s.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::{AttnMasks, MultiheadAttention}, Forward, Module};
/// let mut rng = Rng::seed_from(0);
/// let mha = MultiheadAttention::<8, 2>::new(&Cpu, &mut rng);
/// let x = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
/// let y = mha.forward(x.clone());                    // self-attention, no mask
/// assert_eq!(y.dims()[..], [2, 5, 8]);
/// let y = mha.attend_with(&x, &x, &x, AttnMasks::causal());
/// assert_eq!(y.dims()[..], [2, 5, 8]);
/// let keys: Vec<String> = mha.state_dict().keys().map(String::from).collect();
/// assert_eq!(keys, ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]);
/// ```
#[derive(Module, Clone, Debug)]
#[module(crate = "crate")]
pub struct MultiheadAttention<
    const EMBED: usize,
    const HEADS: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
    const KDIM: usize = EMBED,
    const VDIM: usize = EMBED,
> {
    /// The stacked query, key and value projections, `[3 * EMBED, EMBED]`,
    /// when the keys and values are `EMBED` wide (PyTorch's
    /// `_qkv_same_embed_dim`); absent otherwise.
    pub in_proj_weight: Option<Tensor<(Dyn, C<EMBED>), E, D>>,
    /// The query projection `[EMBED, EMBED]`, when `KDIM` or `VDIM` differs
    /// from `EMBED`.
    pub q_proj_weight: Option<Tensor<(C<EMBED>, C<EMBED>), E, D>>,
    /// The key projection `[EMBED, KDIM]`, beside `q_proj_weight`.
    pub k_proj_weight: Option<Tensor<(C<EMBED>, C<KDIM>), E, D>>,
    /// The value projection `[EMBED, VDIM]`, beside `q_proj_weight`.
    pub v_proj_weight: Option<Tensor<(C<EMBED>, C<VDIM>), E, D>>,
    /// Their biases, `[3 * EMBED]` (absent for `bias=False`).
    pub in_proj_bias: Option<Tensor<(Dyn,), E, D>>,
    /// The output projection.
    pub out_proj: NonDynamicallyQuantizableLinear<EMBED, E, D>,
    /// `add_bias_kv`: a learned key row, `[1, 1, EMBED]`, appended to every
    /// sequence of projected keys (absent by default).
    pub bias_k: Option<Tensor<(C<1>, C<1>, C<EMBED>), E, D>>,
    /// `add_bias_kv`: the learned value row appended to the values.
    pub bias_v: Option<Tensor<(C<1>, C<1>, C<EMBED>), E, D>>,
    /// `add_zero_attn`: a zero key and value appended after them.
    pub add_zero_attn: bool,
    /// Dropout probability on the attention weights (training mode only).
    pub dropout: f64,
    /// Train/eval mode.
    pub training: Training,
    #[module(skip)]
    drop: DropoutRng,
}

/// The result of [`MultiheadAttention::attend_with_weights`].
#[derive(Clone, Debug)]
pub struct AttnOutput<
    B: Dim,
    T: Dim,
    S: Dim,
    const EMBED: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// The attention output, `[batch, T, EMBED]`.
    pub output: Tensor<(B, T, C<EMBED>), E, D>,
    /// The attention weights averaged over the heads, `[batch, T, S]`, like
    /// PyTorch's with `need_weights=True, average_attn_weights=True`.
    pub weights: Tensor<(B, T, S), E, D>,
}

impl<
        const EMBED: usize,
        const HEADS: usize,
        E: Float,
        D: Device<E>,
        const KDIM: usize,
        const VDIM: usize,
    > MultiheadAttention<EMBED, HEADS, E, D, KDIM, VDIM>
{
    /// Whether the three projections are stacked in `in_proj_weight`.
    const SAME_WIDTHS: bool = KDIM == EMBED && VDIM == EMBED;

    /// A layer like `nn.MultiheadAttention(EMBED, HEADS, kdim=KDIM,
    /// vdim=VDIM, batch_first=True)`, initialised like PyTorch's:
    /// Xavier-uniform projections, the Linear default for `out_proj.weight`,
    /// zero biases; no dropout.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::{layers::MultiheadAttention, Module};
    /// let mut rng = Rng::seed_from(0);
    /// // Queries 8 wide attending over keys 6 wide and values 3 wide.
    /// let mha = MultiheadAttention::<8, 2, f32, Cpu, 6, 3>::new(&Cpu, &mut rng);
    /// let keys: Vec<String> = mha.state_dict().keys().map(String::from).collect();
    /// assert_eq!(keys[..4], ["q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias"]);
    /// let q = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(4), C), &mut rng);
    /// let k = Tensor::<(Dyn, Dyn, C<6>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
    /// let v = Tensor::<(Dyn, Dyn, C<3>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
    /// let y = mha.attend_with(&q, &k, &v, Default::default());
    /// assert_eq!(y.dims()[..], [2, 4, 8]);
    /// ```
    pub fn new(device: &D, rng: &mut Rng) -> Self {
        const { assert_heads(EMBED, HEADS) };
        Self::build(0.0, true, device, rng)
    }

    /// A layer with PyTorch's `dropout` and `bias` arguments.
    ///
    /// # Panics
    /// If `dropout` is outside `[0, 1]`.
    pub fn with_options(dropout: f64, bias: bool, device: &D, rng: &mut Rng) -> Self {
        const { assert_heads(EMBED, HEADS) };
        check_dropout("MultiheadAttention", dropout);
        Self::build(dropout, bias, device, rng)
    }

    fn build(dropout: f64, bias: bool, device: &D, rng: &mut Rng) -> Self {
        // xavier_uniform_: bound sqrt(6 / (fan_in + fan_out)).
        fn xavier<S: Shape, E: Float, D: Device<E>>(
            shape: S,
            rng: &mut Rng,
            device: &D,
        ) -> Tensor<S, E, D> {
            let dims = shape.dims();
            let bound = (6.0 / (dims[0] + dims[1]) as f64).sqrt();
            Tensor::uniform_on(shape, -bound, bound, rng, device).requires_grad()
        }
        let (in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight) = if Self::SAME_WIDTHS {
            let w = xavier((Dyn(3 * EMBED), C), rng, device);
            (Some(w), None, None, None)
        } else {
            let q = xavier((C, C), rng, device);
            let k = xavier((C, C), rng, device);
            let v = xavier((C, C), rng, device);
            (None, Some(q), Some(k), Some(v))
        };
        let in_proj_bias = bias.then(|| filled((Dyn(3 * EMBED),), 0.0, device).requires_grad());
        let mut linear = Linear::with_bias(bias, device, rng);
        linear.weight = fan_in_uniform((C, C), EMBED, device, rng);
        if bias {
            linear.bias = Some(filled((C,), 0.0, device).requires_grad());
        }
        MultiheadAttention {
            in_proj_weight,
            q_proj_weight,
            k_proj_weight,
            v_proj_weight,
            in_proj_bias,
            out_proj: NonDynamicallyQuantizableLinear { linear },
            bias_k: None,
            bias_v: None,
            add_zero_attn: false,
            dropout,
            training: Training::default(),
            drop: DropoutRng::new(rng),
        }
    }

    /// The layer with PyTorch's `add_bias_kv=True`: learned `bias_k` and
    /// `bias_v` (`[1, 1, EMBED]`, Xavier-normal as PyTorch draws them)
    /// appended to the projected keys and values of every sequence, so each
    /// query also attends to them; the masks gain a visible column.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::{layers::MultiheadAttention, Forward, Module};
    /// let mut rng = Rng::seed_from(0);
    /// let mha = MultiheadAttention::<8, 2>::new(&Cpu, &mut rng).add_bias_kv(&mut rng).add_zero_attn(true);
    /// let keys: Vec<String> = mha.state_dict().keys().map(String::from).collect();
    /// assert_eq!(keys, ["in_proj_weight", "in_proj_bias", "bias_k", "bias_v", "out_proj.weight", "out_proj.bias"]);
    /// let x = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(3), C), &mut rng);
    /// let out = mha.attend_with_weights(&x, &x, &x, Default::default());
    /// assert_eq!(out.weights.dims()[..], [2, 3, 5]); // 3 keys, bias_k, the zero key
    /// ```
    pub fn add_bias_kv(mut self, rng: &mut Rng) -> Self {
        // xavier_normal_ on [1, 1, EMBED]: fan_in = fan_out = EMBED.
        let std = (1.0 / EMBED as f64).sqrt();
        let device = self.out_proj.weight.device().clone();
        let mut row = || Tensor::normal_on((C, C, C), 0.0, std, rng, &device).requires_grad();
        self.bias_k = Some(row());
        self.bias_v = Some(row());
        self
    }

    /// The layer with PyTorch's `add_zero_attn`: a zero key and value
    /// appended to every sequence (after `bias_k`/`bias_v`), the masks
    /// gaining a visible column.
    pub fn add_zero_attn(mut self, on: bool) -> Self {
        self.add_zero_attn = on;
        self
    }

    /// Appends `bias_k`/`bias_v` and the zero key/value to the key and value
    /// heads (`[batch, HEADS, S, EMBED / HEADS]`) and widens the masks with
    /// visible columns, as PyTorch does. A causal mask is PyTorch's too: with
    /// a key padding mask or when the weights are returned it is the
    /// explicit mask over the original keys, widened (the appended keys
    /// visible); otherwise the causal flag applies to the widened keys,
    /// which hides the appended ones from every query of a square
    /// self-attention. `None` for the masks when nothing was appended.
    #[allow(clippy::type_complexity)] // the widened heads and masks
    fn extend_keys(
        &self,
        k: Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>,
        v: Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>,
        t: usize,
        masks: &Masks<E, D>,
        need_weights: bool,
    ) -> Result<(
        Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>,
        Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>,
        Option<Masks<E, D>>,
    )> {
        let (b, s) = (k.size(0), k.size(2));
        let row_heads = |row: &Tensor<(C<1>, C<1>, C<EMBED>), E, D>| {
            let heads = Self::heads(&row.into_dyn().try_reshape_to((
                Dyn(1),
                Dyn(1),
                C::<EMBED>,
            ))?)?;
            Ok::<_, Error>(heads.expand((Dyn(b), Dyn(HEADS), Dyn(1), Dyn(EMBED / HEADS))))
        };
        let mut parts = (vec![k], vec![v]);
        if let (Some(bk), Some(bv)) = (&self.bias_k, &self.bias_v) {
            parts.0.push(row_heads(bk)?);
            parts.1.push(row_heads(bv)?);
        }
        if self.add_zero_attn {
            let zero = Tensor::zeros_on(
                (Dyn(b), Dyn(HEADS), Dyn(1), Dyn(EMBED / HEADS)),
                parts.0[0].device(),
            );
            parts.0.push(zero.clone());
            parts.1.push(zero);
        }
        let extra = parts.0.len() - 1;
        if extra == 0 {
            let [k, v] = [parts.0.remove(0), parts.1.remove(0)];
            return Ok((k, v, None));
        }
        let widen = |m: Tensor<(Dyn, Dyn), E, D>| {
            Ok::<_, Error>(ErasedMask::Add(m.try_pad::<1>(
                0,
                extra,
                PadMode::Constant(0.0),
            )?))
        };
        let keep_causal = !need_weights && masks.key_padding.is_none();
        let causal = (masks.causal && !keep_causal).then(|| {
            causal_mask(t, s, parts.0[0].device()).map(|hide| ErasedMask::Hide(hide).additive())
        });
        let attn = match (
            masks.attn.as_ref().map(ErasedMask::additive),
            causal.transpose()?,
        ) {
            (Some(a), Some(c)) => Some(widen(&a + &c)?),
            (a, c) => a.or(c).map(widen).transpose()?,
        };
        let key_padding = masks
            .key_padding
            .as_ref()
            .map(|m| widen(m.additive()))
            .transpose()?;
        let masks = Masks {
            key_padding,
            attn,
            causal: masks.causal && keep_causal,
        };
        Ok((
            try_cat::<2, _, _>(&parts.0)?,
            try_cat::<2, _, _>(&parts.1)?,
            Some(masks),
        ))
    }

    /// One of the query/key/value projections, split into heads:
    /// `[batch, len, width]` to `[batch, HEADS, len, EMBED / HEADS]`, the
    /// width being `EMBED`, `KDIM` or `VDIM` (`part` 0, 1, 2).
    fn project<L: Dim>(
        &self,
        x: &Tensor<(Dyn, Dyn, L), E, D>,
        part: usize,
    ) -> Result<Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>> {
        let separate = |w: Option<Tensor<(C<EMBED>, Dyn), E, D>>, name: &str| {
            w.ok_or_else(|| {
                Error::invalid(
                    "MultiheadAttention",
                    format!("neither in_proj_weight nor {name} is set"),
                )
            })
        };
        let w: Tensor<(C<EMBED>, Dyn), E, D> = match (&self.in_proj_weight, part) {
            (Some(w), _) => restore(w.narrow_static::<0, EMBED>(part * EMBED)),
            (None, 0) => separate(self.q_proj_weight.clone().map(restore), "q_proj_weight")?,
            (None, 1) => separate(self.k_proj_weight.clone().map(restore), "k_proj_weight")?,
            (None, _) => separate(self.v_proj_weight.clone().map(restore), "v_proj_weight")?,
        };
        let b = self
            .in_proj_bias
            .as_ref()
            .map(|b| b.narrow_static::<0, EMBED>(part * EMBED));
        let x: Tensor<(Dyn, Dyn, Dyn), E, D> = restore(x.clone());
        Self::heads(&x.try_linear(&w, b.as_ref())?)
    }

    /// Self-attention's three projections as one product with the stacked
    /// weight, as PyTorch does when query, key and value are one tensor:
    /// one pass over the input and one larger, better-tiled product instead
    /// of three. Returns the query, key and value heads (views of it).
    fn project_packed(
        &self,
        x: &Tensor<(Dyn, Dyn, C<EMBED>), E, D>,
        in_proj_weight: &Tensor<(Dyn, C<EMBED>), E, D>,
    ) -> Result<[Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>; 3]> {
        let y = x.try_linear(in_proj_weight, self.in_proj_bias.as_ref())?;
        let part = |p: usize| Self::heads(&y.narrow::<2>(p * EMBED, EMBED));
        Ok([part(0)?, part(1)?, part(2)?])
    }

    /// `[batch, len, EMBED]` (a view whose last axis is EMBED long) split
    /// into heads: `[batch, HEADS, len, EMBED / HEADS]`.
    fn heads<L: Dim>(
        y: &Tensor<(Dyn, Dyn, L), E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>> {
        let split = y.try_reshape_to((
            Dyn(y.size(0)),
            Dyn(y.size(1)),
            Dyn(HEADS),
            Dyn(EMBED / HEADS),
        ))?;
        Ok(split.transpose::<1, 2>())
    }

    /// The query, key and value heads `[batch, HEADS, len, EMBED / HEADS]`.
    fn project_all(
        &self,
        query: &Tensor<(Dyn, Dyn, C<EMBED>), E, D>,
        key: &Tensor<(Dyn, Dyn, C<KDIM>), E, D>,
        value: &Tensor<(Dyn, Dyn, C<VDIM>), E, D>,
    ) -> Result<[Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>; 3]> {
        const { assert_heads(EMBED, HEADS) };
        let one_input = query.shares_storage(key)
            && query.layout() == key.layout()
            && query.shares_storage(value)
            && query.layout() == value.layout();
        if let (true, Some(w)) = (one_input, &self.in_proj_weight) {
            self.project_packed(query, w)
        } else {
            Ok([
                self.project(query, 0)?,
                self.project(key, 1)?,
                self.project(value, 2)?,
            ])
        }
    }

    /// The heads' outputs `[batch, HEADS, T, EMBED / HEADS]` merged and
    /// projected: `[batch, T, EMBED]`.
    fn merge(
        &self,
        ctx: Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>,
        query: &Tensor<(Dyn, Dyn, C<EMBED>), E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, C<EMBED>), E, D>> {
        let merged = ctx.transpose::<1, 2>().contiguous().try_reshape_to((
            Dyn(query.size(0)),
            Dyn(query.size(1)),
            C::<EMBED>,
        ))?;
        self.out_proj.try_forward_as("out_proj", merged)
    }

    /// The computation on erased sizes: the output `[batch, T, EMBED]`. It
    /// runs as [`Tensor::scaled_dot_product_attention`] (fused when nothing
    /// needs a gradient), as PyTorch's `need_weights=False` does, unless the
    /// weights take dropout or both masks are given.
    pub(crate) fn attend_erased(
        &self,
        query: &Tensor<(Dyn, Dyn, C<EMBED>), E, D>,
        key: &Tensor<(Dyn, Dyn, C<KDIM>), E, D>,
        value: &Tensor<(Dyn, Dyn, C<VDIM>), E, D>,
        masks: &Masks<E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, C<EMBED>), E, D>> {
        let dropout = self.training.is_on() && self.dropout > 0.0;
        // With a key padding mask, appended keys turn a causal mask into an
        // explicit one (see `extend_keys`).
        let extends = self.bias_k.is_some() || self.add_zero_attn;
        let attn_mask = masks.attn.is_some() || (masks.causal && extends);
        if dropout || (attn_mask && masks.key_padding.is_some()) {
            return Ok(self
                .attend_erased_weights(query, key, value, masks, false)?
                .0);
        }
        let [q, k, v] = self.project_all(query, key, value)?;
        let (k, v, widened) = self.extend_keys(k, v, q.size(2), masks, false)?;
        let masks = widened.as_ref().unwrap_or(masks);
        let (b, t, s) = (q.size(0), q.size(2), k.size(2));
        let scores = (Dyn(b), Dyn(HEADS), Dyn(t), Dyn(s));
        let mask = match (&masks.attn, &masks.key_padding) {
            (Some(m), _) => Some(m.additive().expand(scores)),
            (_, Some(m)) => {
                let m = m
                    .additive()
                    .try_reshape_to((Dyn(b), Dyn(1), Dyn(1), Dyn(s)))?;
                Some(m.expand(scores))
            }
            (None, None) => None,
        };
        let ctx = q.try_scaled_dot_product_attention(&k, &v, mask.as_ref(), masks.causal, None)?;
        self.merge(ctx, query)
    }

    /// The computation on erased sizes, as composed ops: the output
    /// `[batch, T, EMBED]` and the attention weights `[batch, HEADS, T, S]`
    /// (after dropout). `need_weights`: the caller returns the weights
    /// (PyTorch then widens a causal mask; see `extend_keys`).
    pub(crate) fn attend_erased_weights(
        &self,
        query: &Tensor<(Dyn, Dyn, C<EMBED>), E, D>,
        key: &Tensor<(Dyn, Dyn, C<KDIM>), E, D>,
        value: &Tensor<(Dyn, Dyn, C<VDIM>), E, D>,
        masks: &Masks<E, D>,
        need_weights: bool,
    ) -> Result<(
        Tensor<(Dyn, Dyn, C<EMBED>), E, D>,
        Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>,
    )> {
        let [q, k, v] = self.project_all(query, key, value)?;
        let (k, v, widened) = self.extend_keys(k, v, q.size(2), masks, need_weights)?;
        let masks = widened.as_ref().unwrap_or(masks);
        // PyTorch scales the queries before the product.
        let scale = 1.0 / ((EMBED / HEADS) as f64).sqrt();
        let scores = masks.apply(q.mul_scalar(scale).try_matmul(&k.transpose::<2, 3>())?)?;
        let mut weights = scores.softmax::<3>();
        if self.training.is_on() && self.dropout > 0.0 {
            weights = self.drop.apply(weights, self.dropout)?;
        }
        Ok((self.merge(weights.try_matmul(&v)?, query)?, weights))
    }

    /// Checks the sizes of one call and erases them.
    #[allow(clippy::type_complexity)] // the three erased inputs and their masks
    fn prepare<B: Dim, T: Dim, S: Dim>(
        query: &Tensor<(B, T, C<EMBED>), E, D>,
        key: &Tensor<(B, S, C<KDIM>), E, D>,
        value: &Tensor<(B, S, C<VDIM>), E, D>,
        masks: &AttnMasks<'_, B, T, S, E, D>,
    ) -> Result<(Erased3<EMBED, KDIM, VDIM, E, D>, Masks<E, D>)> {
        let (b, t, s) = (query.size(0), query.size(1), key.size(1));
        for (name, dims, width) in [("key", key.dims(), KDIM), ("value", value.dims(), VDIM)] {
            if dims[0] != b || dims[1] != s {
                return Err(Error::shape(
                    "MultiheadAttention",
                    format!(
                        "a {name} of [{b}, {s}, {width}] (the query's batch, the key's length)"
                    ),
                    &dims,
                ));
            }
        }
        let masks = masks.erase(b, t, s)?;
        Ok((
            (
                restore(query.clone()),
                restore(key.clone()),
                restore(value.clone()),
            ),
            masks,
        ))
    }

    /// Attention of `query` (`[batch, T, EMBED]`) over `key` and `value`
    /// (`[batch, S, EMBED]`) under `masks`, like
    /// `mha(query, key, value, key_padding_mask=..., attn_mask=..., is_causal=..., need_weights=False)[0]`.
    ///
    /// # Panics
    /// If run-time sizes disagree; see [`MultiheadAttention::try_attend_with`].
    #[track_caller]
    pub fn attend_with<B: Dim, T: Dim, S: Dim>(
        &self,
        query: &Tensor<(B, T, C<EMBED>), E, D>,
        key: &Tensor<(B, S, C<KDIM>), E, D>,
        value: &Tensor<(B, S, C<VDIM>), E, D>,
        masks: AttnMasks<'_, B, T, S, E, D>,
    ) -> Tensor<(B, T, C<EMBED>), E, D> {
        ok(self.try_attend_with(query, key, value, masks))
    }

    /// Fallible [`MultiheadAttention::attend_with`].
    ///
    /// # Errors
    /// A shape error when the key or value's batch or length, or a mask's
    /// sizes, disagree with the query's and the key's (`Dyn` sizes).
    pub fn try_attend_with<B: Dim, T: Dim, S: Dim>(
        &self,
        query: &Tensor<(B, T, C<EMBED>), E, D>,
        key: &Tensor<(B, S, C<KDIM>), E, D>,
        value: &Tensor<(B, S, C<VDIM>), E, D>,
        masks: AttnMasks<'_, B, T, S, E, D>,
    ) -> Result<Tensor<(B, T, C<EMBED>), E, D>> {
        let ((q, k, v), masks) = Self::prepare(query, key, value, &masks)?;
        Ok(restore(self.attend_erased(&q, &k, &v, &masks)?))
    }

    /// [`MultiheadAttention::attend_with`] that also returns the attention
    /// weights averaged over the heads, like PyTorch's default
    /// `need_weights=True, average_attn_weights=True`.
    ///
    /// # Panics
    /// If run-time sizes disagree; see
    /// [`MultiheadAttention::try_attend_with_weights`].
    #[track_caller]
    pub fn attend_with_weights<B: Dim, T: Dim, S: Dim>(
        &self,
        query: &Tensor<(B, T, C<EMBED>), E, D>,
        key: &Tensor<(B, S, C<KDIM>), E, D>,
        value: &Tensor<(B, S, C<VDIM>), E, D>,
        masks: AttnMasks<'_, B, T, S, E, D>,
    ) -> AttnOutput<B, T, S, EMBED, E, D> {
        ok(self.try_attend_with_weights(query, key, value, masks))
    }

    /// Fallible [`MultiheadAttention::attend_with_weights`].
    ///
    /// # Errors
    /// As [`MultiheadAttention::try_attend_with`].
    pub fn try_attend_with_weights<B: Dim, T: Dim, S: Dim>(
        &self,
        query: &Tensor<(B, T, C<EMBED>), E, D>,
        key: &Tensor<(B, S, C<KDIM>), E, D>,
        value: &Tensor<(B, S, C<VDIM>), E, D>,
        masks: AttnMasks<'_, B, T, S, E, D>,
    ) -> Result<AttnOutput<B, T, S, EMBED, E, D>> {
        let ((q, k, v), masks) = Self::prepare(query, key, value, &masks)?;
        let (y, w) = self.attend_erased_weights(&q, &k, &v, &masks, true)?;
        Ok(AttnOutput {
            output: restore(y),
            weights: restore(w.mean::<1>()),
        })
    }

    /// Attention with a bool key padding mask (`[batch, S]`, `true` for keys
    /// to ignore) and an optional causal mask: a shorthand for
    /// [`MultiheadAttention::attend_with`].
    ///
    /// # Panics
    /// If run-time sizes disagree.
    #[track_caller]
    pub fn attend<B: Dim, T: Dim, S: Dim>(
        &self,
        query: &Tensor<(B, T, C<EMBED>), E, D>,
        key: &Tensor<(B, S, C<KDIM>), E, D>,
        value: &Tensor<(B, S, C<VDIM>), E, D>,
        key_padding_mask: Option<&Tensor<(B, S), bool, D>>,
        causal: bool,
    ) -> Tensor<(B, T, C<EMBED>), E, D> {
        let masks = AttnMasks {
            key_padding_mask: key_padding_mask.map(Mask::Hide),
            attn_mask: None,
            is_causal: causal,
        };
        self.attend_with(query, key, value, masks)
    }
}

/// The query, key and value of one call, their batch and lengths erased.
type Erased3<const EMBED: usize, const KDIM: usize, const VDIM: usize, E, D> = (
    Tensor<(Dyn, Dyn, C<EMBED>), E, D>,
    Tensor<(Dyn, Dyn, C<KDIM>), E, D>,
    Tensor<(Dyn, Dyn, C<VDIM>), E, D>,
);

impl<B: Dim, T: Dim, const EMBED: usize, const HEADS: usize, E: Float, D: Device<E>>
    Forward<Tensor<(B, T, C<EMBED>), E, D>, Tensor<(B, T, C<EMBED>), E, D>>
    for MultiheadAttention<EMBED, HEADS, E, D>
{
    /// Self-attention without masks (keys and values `EMBED` wide).
    fn try_forward(
        &self,
        x: Tensor<(B, T, C<EMBED>), E, D>,
    ) -> Result<Tensor<(B, T, C<EMBED>), E, D>> {
        self.try_attend_with(&x, &x, &x, AttnMasks::default())
    }
}

impl<const EMBED: usize, const HEADS: usize, E: Float, D: Device<E>> crate::shape_step::ShapeStep
    for MultiheadAttention<EMBED, HEADS, E, D>
{
    /// Self-attention over `[batch, seq, EMBED]`.
    const STEP: crate::shape_step::Step = crate::shape_step::Step::LastAxis {
        layer: "MultiheadAttention",
        input: EMBED,
        output: EMBED,
        rank: 3,
    };
}

#[cfg(test)]
mod tests {
    use super::{AttnMasks, MultiheadAttention};
    use forma_core::{Dyn, Rng, Tensor, C};
    use forma_cpu::Cpu;

    #[test]
    fn missing_projections_are_an_error() {
        let mut rng = Rng::seed_from(0);
        let mut mha = MultiheadAttention::<4, 2, f32, Cpu, 3, 3>::new(&Cpu, &mut rng);
        let q = Tensor::<(Dyn, Dyn, C<4>), f32, Cpu>::zeros_on((Dyn(1), Dyn(2), C), &Cpu);
        let k = Tensor::<(Dyn, Dyn, C<3>), f32, Cpu>::zeros_on((Dyn(1), Dyn(2), C), &Cpu);
        assert!(mha
            .try_attend_with(&q, &k, &k, AttnMasks::default())
            .is_ok());
        mha.k_proj_weight = None;
        let err = mha
            .try_attend_with(&q, &k, &k, AttnMasks::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("neither in_proj_weight nor k_proj_weight is set"),
            "{err}"
        );
    }
}
