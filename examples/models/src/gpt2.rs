//! A GPT-2 decoder with the layout of Hugging Face's `GPT2LMHeadModel`:
//! `transformer.wte.weight`, `transformer.h.0.attn.c_attn.weight` (GPT-2's
//! [`Conv1D`], whose weight is `[in, out]`), ..., `transformer.ln_f.bias`.
//!
//! **Tied head.** GPT-2's output projection is the token embedding
//! (`lm_head.weight` *is* `transformer.wte.weight`), so the model has no
//! `lm_head` field: the logits are `ln_f(h) @ wte.weight^T`, the gradient of
//! both uses reaches the one tensor, and `state_dict()` holds no
//! `lm_head.weight`, exactly like the `model.safetensors` that
//! `save_pretrained` writes (it leaves out tied copies) and that
//! `GPT2LMHeadModel.from_pretrained` reads back, tying it again. A checkpoint
//! that does carry `lm_head.weight` loads when it equals `wte.weight` and is
//! refused ([`ModelError::UntiedHead`]) when it differs, since tying would
//! silently lose it.
//!
//! **Real files.** [`Gpt2LMHeadModel::from_safetensors`] also reads the
//! layout of the hub's `gpt2/model.safetensors` (a `GPT2Model` without the
//! `transformer.` prefix, with the causal-mask buffers `h.N.attn.bias` and
//! `h.N.attn.masked_bias` that older `transformers` saved): the prefix is
//! added and those constant buffers dropped; see [`HfLoadReport`].
//!
//! **Generation.** [`Gpt2LMHeadModel::logits_cached`] runs new positions
//! against a [`KvCache`] of every layer's past keys and values, so each new
//! token costs one position; [`Gpt2LMHeadModel::generate`] samples greedily
//! or from the top k ([`Sampling`]) with a seeded [`Rng`].
//!
//! **Intermediate results.** [`Gpt2LMHeadModel::run_with`] also returns the
//! hidden states and attention probabilities on request ([`Outputs`]), like
//! `output_hidden_states=True, output_attentions=True`; each block's forward
//! pass ([`Gpt2Block::run`]) is public too.
//!
//! Sizes are const generics: vocabulary `V`, context `CTX`, hidden `H`,
//! `QKV = 3 * H` (the fused query/key/value projection's width: stable Rust
//! cannot write `3 * H` in a type, so it is a parameter checked when the
//! model is built), `HEADS`, and the MLP's inner size `FF`. [`Gpt2Small`] is
//! GPT-2 small. Numerics follow `transformers`: `gelu_new` (the tanh GELU),
//! LayerNorm eps 1e-5, scores scaled by `1/sqrt(head_dim)`, hidden positions
//! at the most negative f32.

use crate::decoder::{self, causal_mask, run_layers, Kv};
use crate::util::{
    attend, count_layers, layout_of, load_strict, merge_heads, restore, split_heads, Dyn4, HfKeys,
    Init,
};
use crate::{HfLoadReport, Loaded, ModelError, Outputs};
use forma::core::device::Device;
use forma::nn::layers::{Dropout, Embedding, LayerNorm};
use forma::nn::{scope, StateDict};
use forma::prelude::*;
use std::path::Path;

pub use crate::decoder::{KvCache, Sampling};

/// GPT-2's `Conv1D(nf, nx)`: a linear layer whose `weight` is stored
/// `[NX, NF]` (input by output, the transpose of `nn.Linear`'s), so
/// `y = x @ weight + bias`.
#[derive(Module, Clone, Debug)]
#[module(
    crate = "::forma::nn",
    name = "Conv1D",
    extra_repr = "Self::extra_repr"
)]
pub struct Conv1D<const NX: usize, const NF: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[NX, NF]`.
    pub weight: Tensor<(C<NX>, C<NF>), E, D>,
    /// `[NF]`.
    pub bias: Tensor<(C<NF>,), E, D>,
}

impl<const NX: usize, const NF: usize, E: Float, D: Device<E>> Conv1D<NX, NF, E, D> {
    fn extra_repr(&self) -> String {
        format!("nf={NF}, nx={NX}")
    }
}

impl<A: Dim, B: Dim, const NX: usize, const NF: usize, E: Float, D: Device<E>>
    Forward<Tensor<(A, B, C<NX>), E, D>, Tensor<(A, B, C<NF>), E, D>> for Conv1D<NX, NF, E, D>
{
    fn try_forward(
        &self,
        x: Tensor<(A, B, C<NX>), E, D>,
    ) -> forma::Result<Tensor<(A, B, C<NF>), E, D>> {
        Ok(&x.try_matmul(&self.weight)? + &self.bias)
    }
}

/// What a GPT-2 model's type does not fix, like the rest of Hugging Face's
/// `GPT2Config`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Config {
    /// Number of blocks (`n_layer`).
    pub n_layer: usize,
    /// LayerNorm eps (`layer_norm_epsilon`, 1e-5).
    pub layer_norm_epsilon: f64,
    /// Dropout after the embeddings (`embd_pdrop`, 0.1).
    pub embd_pdrop: f64,
    /// Dropout on attention weights (`attn_pdrop`, 0.1).
    pub attn_pdrop: f64,
    /// Dropout after each sub-layer (`resid_pdrop`, 0.1).
    pub resid_pdrop: f64,
    /// Standard deviation of the initial weights (`initializer_range`,
    /// 0.02; the output projections get `0.02 / sqrt(2 * n_layer)` as in
    /// GPT-2's paper).
    pub initializer_range: f64,
}

impl Gpt2Config {
    /// Hugging Face's defaults with `n_layer` blocks.
    pub fn with_layers(n_layer: usize) -> Self {
        Gpt2Config {
            n_layer,
            layer_norm_epsilon: 1e-5,
            embd_pdrop: 0.1,
            attn_pdrop: 0.1,
            resid_pdrop: 0.1,
            initializer_range: 0.02,
        }
    }

    /// GPT-2 small's: 12 blocks.
    pub fn gpt2_small() -> Self {
        Self::with_layers(12)
    }

    /// The same settings without dropout.
    pub fn without_dropout(mut self) -> Self {
        self.embd_pdrop = 0.0;
        self.attn_pdrop = 0.0;
        self.resid_pdrop = 0.0;
        self
    }
}

/// GPT-2 small (vocabulary 50257, context 1024, hidden 768, 12 heads, MLP
/// 3072; 12 blocks from [`Gpt2Config::gpt2_small`]): about 124M parameters,
/// in f32 on the CPU.
pub type Gpt2Small = Gpt2LMHeadModel<50257, 1024, 768, 2304, 12, 3072>;

/// Causal self-attention, like `GPT2Attention`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "GPT2Attention")]
pub struct Gpt2Attention<
    const H: usize,
    const QKV: usize,
    const HEADS: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// Queries, keys and values at once: `[H, 3H]`.
    pub c_attn: Conv1D<H, QKV, E, D>,
    /// `[H, H]`.
    pub c_proj: Conv1D<H, H, E, D>,
    /// `attn_pdrop`.
    pub attn_dropout: Dropout,
    /// `resid_pdrop`.
    pub resid_dropout: Dropout,
}

/// The feed-forward block with `gelu_new`, like `GPT2MLP`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "GPT2MLP")]
pub struct Gpt2Mlp<const H: usize, const FF: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[H, FF]`.
    pub c_fc: Conv1D<H, FF, E, D>,
    /// `[FF, H]`.
    pub c_proj: Conv1D<FF, H, E, D>,
    /// `resid_pdrop`.
    pub dropout: Dropout,
}

/// A pre-norm decoder block, like `GPT2Block`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "GPT2Block")]
pub struct Gpt2Block<
    const H: usize,
    const QKV: usize,
    const HEADS: usize,
    const FF: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// Before attention.
    pub ln_1: LayerNorm<H, E, D>,
    /// Causal self-attention.
    pub attn: Gpt2Attention<H, QKV, HEADS, E, D>,
    /// Before the MLP.
    pub ln_2: LayerNorm<H, E, D>,
    /// The feed-forward block.
    pub mlp: Gpt2Mlp<H, FF, E, D>,
}

/// The decoder without its head, like `GPT2Model`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "GPT2Model")]
pub struct Gpt2Model<
    const V: usize,
    const CTX: usize,
    const H: usize,
    const QKV: usize,
    const HEADS: usize,
    const FF: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// Token embedding `[V, H]`, also the output projection.
    pub wte: Embedding<V, H, E, D>,
    /// Position embedding `[CTX, H]`.
    pub wpe: Embedding<CTX, H, E, D>,
    /// `embd_pdrop`.
    pub drop: Dropout,
    /// The blocks, `transformer.h.<n>`.
    pub h: Vec<Gpt2Block<H, QKV, HEADS, FF, E, D>>,
    /// The final norm.
    pub ln_f: LayerNorm<H, E, D>,
}

/// GPT-2 with its language-model head tied to the token embedding, like
/// `transformers.GPT2LMHeadModel` (see the [module docs](self) for how the
/// tied head is saved and loaded).
///
/// ```
/// use forma::prelude::*;
/// use forma_models::gpt2::{Gpt2Config, Gpt2LMHeadModel, KvCache, Sampling};
///
/// // Vocabulary 20, context 16, hidden 8 (QKV 24), 2 heads, MLP 32, 1 block.
/// type Tiny = Gpt2LMHeadModel<20, 16, 8, 24, 2, 32>;
/// let mut rng = Rng::seed_from(0);
/// let mut gpt = Tiny::new(&Gpt2Config::with_layers(1), &Cpu, &mut rng);
/// gpt.eval();
/// let out = gpt.generate(&[1, 2, 3], 5, Sampling::TopK { k: 4, temperature: 0.8 }, &mut rng).unwrap();
/// assert_eq!(out.len(), 8);
/// assert!(!gpt.state_dict().contains_key("lm_head.weight")); // tied to transformer.wte.weight
/// ```
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "GPT2LMHeadModel")]
pub struct Gpt2LMHeadModel<
    const V: usize,
    const CTX: usize,
    const H: usize,
    const QKV: usize,
    const HEADS: usize,
    const FF: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// The decoder.
    pub transformer: Gpt2Model<V, CTX, H, QKV, HEADS, FF, E, D>,
}

/// What [`Gpt2LMHeadModel::run_with`] returns, like
/// `CausalLMOutputWithCrossAttentions` (the cache is passed in instead).
pub type Gpt2Outputs<const V: usize, const H: usize, E = f32, D = Cpu> =
    crate::CausalLmOutputs<V, H, E, D>;

impl<
        const V: usize,
        const CTX: usize,
        const H: usize,
        const QKV: usize,
        const HEADS: usize,
        const FF: usize,
        E: Float,
        D: Device<E>,
    > Gpt2LMHeadModel<V, CTX, H, QKV, HEADS, FF, E, D>
{
    const SIZES_FIT: () = {
        assert!(
            HEADS > 0 && H.is_multiple_of(HEADS),
            "GPT-2: the hidden size must split into equal heads"
        );
        assert!(QKV == 3 * H, "GPT-2: QKV must be 3 * H");
    };

    /// A model initialised like Hugging Face's, in training mode.
    pub fn new(config: &Gpt2Config, device: &D, rng: &mut Rng) -> Self {
        let std = config.initializer_range;
        Self::build(config, &mut Init::Normal { std, rng }, device)
    }

    fn build(config: &Gpt2Config, init: &mut Init<'_>, device: &D) -> Self {
        let () = Self::SIZES_FIT;
        let eps = config.layer_norm_epsilon;
        let wte = init.embedding(device);
        let wpe = init.embedding(device);
        let drop = init.dropout(config.embd_pdrop);
        // GPT-2 scales the residual projections' init by 1/sqrt(2 * n_layer).
        let proj_scale = 1.0 / (2.0 * config.n_layer.max(1) as f64).sqrt();
        let h = (0..config.n_layer)
            .map(|_| Gpt2Block {
                ln_1: init.layer_norm(eps, device),
                attn: Gpt2Attention {
                    c_attn: conv1d(init, 1.0, device),
                    c_proj: conv1d(init, proj_scale, device),
                    attn_dropout: init.dropout(config.attn_pdrop),
                    resid_dropout: init.dropout(config.resid_pdrop),
                },
                ln_2: init.layer_norm(eps, device),
                mlp: Gpt2Mlp {
                    c_fc: conv1d(init, 1.0, device),
                    c_proj: conv1d(init, proj_scale, device),
                    dropout: init.dropout(config.resid_pdrop),
                },
            })
            .collect();
        let ln_f = init.layer_norm(eps, device);
        Gpt2LMHeadModel {
            transformer: Gpt2Model {
                wte,
                wpe,
                drop,
                h,
                ln_f,
            },
        }
    }

    /// The `state_dict` keys and shapes of a model of this type and
    /// `config`, in order, without allocating its weights.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma_models::gpt2::{Gpt2Config, Gpt2Small};
    /// let keys = Gpt2Small::state_dict_layout(&Gpt2Config::gpt2_small(), &Cpu);
    /// assert_eq!(keys[4], ("transformer.h.0.attn.c_attn.weight".to_string(), vec![768, 2304]));
    /// ```
    pub fn state_dict_layout(config: &Gpt2Config, device: &D) -> Vec<(String, Vec<usize>)> {
        layout_of(&Self::build(config, &mut Init::Meta, device))
    }

    /// Loads a Hugging Face GPT-2 checkpoint (`model.safetensors` of a
    /// `GPT2LMHeadModel` or `GPT2Model`), in eval mode, with the block count
    /// read from the file and the other settings from
    /// [`Gpt2Config::with_layers`]. See [`Gpt2LMHeadModel::load_hf_state_dict`]
    /// for what is set aside; the returned [`Loaded::report`] lists it.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when the file cannot be read,
    /// [`ModelError::NoLayers`] when it holds no block,
    /// [`ModelError::UntiedHead`] for a head that differs from the
    /// embedding, and [`ModelError::Load`] listing every missing, unexpected
    /// and mismatched key.
    pub fn from_safetensors(
        path: impl AsRef<Path>,
        device: &D,
    ) -> Result<Loaded<Self>, ModelError> {
        let path = path.as_ref();
        let sd = forma::nn::state::load_file(path)?.tensors;
        // A bare `GPT2Model` file names its blocks `h.<n>`.
        let layers = count_layers(&sd, "transformer.h.").max(count_layers(&sd, "h."));
        if layers == 0 {
            return Err(ModelError::NoLayers("GPT-2"));
        }
        let mut rng = Rng::seed_from(0);
        let mut model = Self::new(&Gpt2Config::with_layers(layers), device, &mut rng);
        let report = model.load_hf_state_dict(sd).map_err(|e| e.in_file(path))?;
        Ok(Loaded::eval(model, report))
    }

    /// Loads a Hugging Face GPT-2 state dict strictly, after the explicit
    /// adjustments real checkpoints need: `transformer.` is prefixed when the
    /// file is a bare `GPT2Model`; the constant causal-mask buffers
    /// `attn.bias` and `attn.masked_bias` of older files are dropped; a tied
    /// `lm_head.weight` equal to `wte.weight` is dropped. Every other key must
    /// match. On error the model is unchanged.
    ///
    /// # Errors
    /// [`ModelError::UntiedHead`], or [`ModelError::Load`] listing every
    /// missing, unexpected and mismatched key.
    pub fn load_hf_state_dict(&mut self, sd: StateDict) -> Result<HfLoadReport, ModelError> {
        let (sd, report) = normalize_hf_gpt2(sd)?;
        load_strict(self, &sd, None)?;
        Ok(report)
    }

    /// Logits `[batch, len, V]` for token ids `[batch, len]`, the whole
    /// sequence at once, like `model(input_ids).logits`.
    ///
    /// # Errors
    /// [`ModelError::SequenceTooLong`] past `CTX` positions,
    /// [`ModelError::Tensor`] for an id outside the vocabulary.
    pub fn logits(
        &self,
        input_ids: &Tensor<(Dyn, Dyn), i64, D>,
    ) -> Result<Tensor<(Dyn, Dyn, C<V>), E, D>, ModelError> {
        Ok(self.run_with(input_ids, None, Outputs::NONE)?.logits)
    }

    /// Logits for `input_ids` as the positions that follow those in
    /// `cache`, whose keys and values it uses and then extends with the new
    /// ones: like `model(input_ids, past_key_values=cache, use_cache=True)`.
    /// An empty cache gives the same logits as [`Gpt2LMHeadModel::logits`].
    ///
    /// # Errors
    /// As [`Gpt2LMHeadModel::logits`] (the cached positions count towards
    /// `CTX`); [`ModelError::Input`] when the batch differs from the
    /// cache's. On error the cache is unchanged.
    pub fn logits_cached(
        &self,
        input_ids: &Tensor<(Dyn, Dyn), i64, D>,
        cache: &mut KvCache<E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, C<V>), E, D>, ModelError> {
        Ok(self.run_with(input_ids, Some(cache), Outputs::NONE)?.logits)
    }

    /// The logits and the intermediate results `outputs` asks for, like
    /// `model(input_ids, past_key_values=cache, output_hidden_states=..,
    /// output_attentions=..)`: see [`Gpt2Outputs`]. Without a cache this is
    /// [`Gpt2LMHeadModel::logits`], with one
    /// [`Gpt2LMHeadModel::logits_cached`] (the cache is extended the same
    /// way); the logits do not depend on `outputs` (beyond float error:
    /// without attentions the attention may run fused).
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma_models::gpt2::Gpt2LMHeadModel;
    /// use forma_models::Outputs;
    ///
    /// type Tiny = Gpt2LMHeadModel<20, 16, 8, 24, 2, 32>;
    /// let mut gpt = Tiny::new(&forma_models::gpt2::Gpt2Config::with_layers(3), &Cpu, &mut Rng::seed_from(0));
    /// gpt.eval();
    /// let ids = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![1, 2, 3], (Dyn(1), Dyn(3))).unwrap();
    /// let out = gpt.run_with(&ids, None, Outputs::ALL).unwrap();
    /// assert_eq!(out.hidden_states.unwrap().len(), 3 + 1);
    /// assert_eq!(out.attentions.unwrap()[2].dims()[..], [1, 2, 3, 3]);
    /// ```
    ///
    /// # Errors
    /// As [`Gpt2LMHeadModel::logits_cached`].
    pub fn run_with(
        &self,
        input_ids: &Tensor<(Dyn, Dyn), i64, D>,
        cache: Option<&mut KvCache<E, D>>,
        outputs: Outputs,
    ) -> Result<Gpt2Outputs<V, H, E, D>, ModelError> {
        let layers = self.transformer.h.len();
        decoder::with_cache(cache, "GPT-2", input_ids.size(0), layers, |cache| {
            self.run(input_ids, cache, outputs)
        })
    }

    fn run(
        &self,
        ids: &Tensor<(Dyn, Dyn), i64, D>,
        cache: Option<&mut KvCache<E, D>>,
        outputs: Outputs,
    ) -> Result<Gpt2Outputs<V, H, E, D>, ModelError> {
        let tr = &self.transformer;
        let past = cache.as_ref().map_or(0, |c| c.len());
        let t = ids.size(1);
        if past + t > CTX {
            return Err(ModelError::SequenceTooLong {
                model: "GPT-2",
                len: past + t,
                max: CTX,
            });
        }
        let pos =
            Tensor::<(Dyn,), i64, D>::arange_on(past as f64, (past + t) as f64, 1.0, ids.device())?;
        let (x, mask) = scope::run("transformer", || {
            let pos = tr
                .wpe
                .try_forward_as("wpe", pos)?
                .into_dyn()
                .unsqueeze::<0>();
            let tok = scope::run("wte", || tr.wte.try_lookup(ids))?.into_dyn();
            let x: Tensor<(Dyn, Dyn, C<H>), E, D> = restore(&tok + &pos);
            Ok((
                tr.drop.try_forward_as("drop", x)?,
                causal_mask::<E, D>(t, past, ids.device())?,
            ))
        })?;
        run_layers(
            x,
            cache,
            tr.h.len(),
            outputs,
            ("transformer", "h"),
            |i, x, slot, output_attentions| tr.h[i].step(x, slot, &mask, output_attentions),
            |x| tr.ln_f.try_forward_as("ln_f", x),
            |x| x.try_matmul(&tr.wte.weight.t()),
        )
    }

    /// The prompt followed by `max_new_tokens` generated tokens, each
    /// picked by `sampling` from the logits of the last position, with a
    /// [`KvCache`] so that each new token runs one position (no graph is
    /// recorded). Like `generate(input_ids, max_new_tokens=..)` without a
    /// stop token. Set eval mode first unless dropout is wanted.
    ///
    /// # Errors
    /// [`ModelError::Sampling`] for an empty prompt, `k = 0` or a
    /// temperature that is not positive; [`ModelError::SequenceTooLong`]
    /// when the prompt and new tokens exceed `CTX`; [`ModelError::Tensor`]
    /// for a prompt id outside the vocabulary.
    pub fn generate(
        &self,
        prompt: &[i64],
        max_new_tokens: usize,
        sampling: Sampling,
        rng: &mut Rng,
    ) -> Result<Vec<i64>, ModelError> {
        let device = self.transformer.wte.weight.device();
        let context = Some(("GPT-2", CTX));
        decoder::generate(
            prompt,
            max_new_tokens,
            sampling,
            rng,
            context,
            device,
            |ids, cache| self.logits_cached(ids, cache),
        )
    }
}

fn conv1d<const NX: usize, const NF: usize, E: Float, D: Device<E>>(
    init: &mut Init<'_>,
    scale: f64,
    device: &D,
) -> Conv1D<NX, NF, E, D> {
    let std = match init {
        Init::Normal { std, .. } => *std * scale,
        Init::Meta => 0.0,
    };
    let weight = init.draw((C, C), device, |s, rng| {
        Tensor::normal_on(s, 0.0, std, rng, device)
    });
    Conv1D {
        weight,
        bias: init.constant((C,), 0.0, device),
    }
}

/// Adds `transformer.` to a bare `GPT2Model` file, and drops the causal-mask
/// buffers and a tied head.
fn normalize_hf_gpt2(sd: StateDict) -> Result<(StateDict, HfLoadReport), ModelError> {
    let keys = HfKeys::new(sd)
        .add_prefix("transformer.")
        .drop_tied_head("transformer.wte.weight")?
        .drop(|k| {
            k.starts_with("transformer.h.")
                && (k.ends_with(".attn.bias") || k.ends_with(".attn.masked_bias"))
        });
    Ok(keys.finish())
}

impl<
        const H: usize,
        const QKV: usize,
        const HEADS: usize,
        const FF: usize,
        E: Float,
        D: Device<E>,
    > Gpt2Block<H, QKV, HEADS, FF, E, D>
{
    /// One block on hidden states `[batch, len, H]` (positions `0..len`,
    /// no cache), like `GPT2Block(hidden_states, output_attentions=..)`:
    /// `x + attn(ln_1(x))`, then `+ mlp(ln_2(..))`. Returns the block's
    /// output and, when `output_attentions`, its causal attention
    /// probabilities `[batch, HEADS, len, len]` (after dropout; otherwise
    /// they are never materialised where the attention can run fused).
    ///
    /// # Errors
    /// When the device cannot hold the causal mask.
    pub fn run(
        &self,
        x: Tensor<(Dyn, Dyn, C<H>), E, D>,
        output_attentions: bool,
    ) -> forma::Result<(Tensor<(Dyn, Dyn, C<H>), E, D>, Option<Dyn4<E, D>>)> {
        let mask = causal_mask::<E, D>(x.size(1), 0, x.device())?;
        self.step(x, None, &mask, output_attentions)
    }

    /// [`Gpt2Block::run`] over `slot`'s cached positions too (which it
    /// extends), with the causal `mask` of those positions.
    fn step(
        &self,
        x: Tensor<(Dyn, Dyn, C<H>), E, D>,
        slot: Option<&mut Option<Kv<E, D>>>,
        mask: &Dyn4<E, D>,
        output_attentions: bool,
    ) -> forma::Result<(Tensor<(Dyn, Dyn, C<H>), E, D>, Option<Dyn4<E, D>>)> {
        let h = self.ln_1.try_forward_as("ln_1", x.clone())?;
        let (a, probs) = scope::run("attn", || self.attn.step(h, slot, mask, output_attentions))?;
        let x = &x + &a;
        let h = self.ln_2.try_forward_as("ln_2", x.clone())?;
        let m = scope::run("mlp", || self.mlp.run(h))?;
        Ok((&x + &m, probs))
    }
}

impl<const H: usize, const QKV: usize, const HEADS: usize, E: Float, D: Device<E>>
    Gpt2Attention<H, QKV, HEADS, E, D>
{
    /// Attention of `x`'s positions over the cached ones and themselves,
    /// with `mask` (additive, `[1, 1, len, past + len]`); `slot` (this
    /// layer's cache entry) is extended with `x`'s keys and values.
    fn step(
        &self,
        x: Tensor<(Dyn, Dyn, C<H>), E, D>,
        slot: Option<&mut Option<Kv<E, D>>>,
        mask: &Dyn4<E, D>,
        output_attentions: bool,
    ) -> forma::Result<(Tensor<(Dyn, Dyn, C<H>), E, D>, Option<Dyn4<E, D>>)> {
        let qkv = self.c_attn.try_forward_as("c_attn", x)?.into_dyn();
        let q = split_heads(&qkv.narrow::<2>(0, H), HEADS)?;
        let k = split_heads(&qkv.narrow::<2>(H, H), HEADS)?;
        let v = split_heads(&qkv.narrow::<2>(2 * H, H), HEADS)?;
        let (k, v) = decoder::extend(slot, k, v)?;
        let (ctx, probs) = attend(
            &q,
            &k,
            &v,
            Some(mask),
            &self.attn_dropout,
            output_attentions,
        )?;
        let ctx: Tensor<(Dyn, Dyn, C<H>), E, D> = restore(merge_heads(&ctx)?);
        let y = self.c_proj.try_forward_as("c_proj", ctx)?;
        Ok((
            self.resid_dropout.try_forward_as("resid_dropout", y)?,
            probs,
        ))
    }
}

impl<const H: usize, const FF: usize, E: Float, D: Device<E>> Gpt2Mlp<H, FF, E, D> {
    /// `dropout(c_proj(gelu_new(c_fc(x))))`, like `GPT2MLP`.
    ///
    /// # Errors
    /// A tensor error of its ops.
    pub fn run(
        &self,
        x: Tensor<(Dyn, Dyn, C<H>), E, D>,
    ) -> forma::Result<Tensor<(Dyn, Dyn, C<H>), E, D>> {
        let h = self.c_fc.try_forward_as("c_fc", x)?.gelu_tanh();
        let y = self.c_proj.try_forward_as("c_proj", h)?;
        self.dropout.try_forward_as("dropout", y)
    }
}

impl<
        const V: usize,
        const CTX: usize,
        const H: usize,
        const QKV: usize,
        const HEADS: usize,
        const FF: usize,
        E: Float,
        D: Device<E>,
    > Forward<Tensor<(Dyn, Dyn), i64, D>, Tensor<(Dyn, Dyn, C<V>), E, D>>
    for Gpt2LMHeadModel<V, CTX, H, QKV, HEADS, FF, E, D>
{
    /// [`Gpt2LMHeadModel::logits`].
    ///
    /// # Errors
    /// Where [`Gpt2LMHeadModel::logits`] returns one, as a tensor error.
    fn try_forward(
        &self,
        ids: Tensor<(Dyn, Dyn), i64, D>,
    ) -> forma::Result<Tensor<(Dyn, Dyn, C<V>), E, D>> {
        Ok(self.logits(&ids)?)
    }
}
