//! A Llama decoder with the layout of Hugging Face's `LlamaForCausalLM`:
//! `model.embed_tokens.weight`, `model.layers.0.self_attn.q_proj.weight`
//! (bias-free projections), `model.layers.0.mlp.gate_proj.weight`,
//! `model.layers.0.input_layernorm.weight`, ..., `model.norm.weight`,
//! `lm_head.weight`.
//!
//! **Numerics** follow `transformers`' eager path: RMSNorm
//! `x * rsqrt(mean(x^2) + eps) * weight` ([`RMSNorm`], exactly HF's
//! arithmetic in f32 and f64; HF upcasts f16/bf16 activations to f32 for
//! the normalisation, Forma's layer stays in the element type); the default
//! rotary embedding (`inv_freq = 1 / theta^(2i / head_dim)`, `cos`/`sin` of
//! `cat(freqs, freqs)`, applied as `x * cos + rotate_half(x) * sin` with
//! `rotate_half(x) = cat(-x2, x1)`); a SiLU-gated MLP
//! `down(silu(gate(x)) * up(x))`; grouped-query attention (each key/value
//! head serves `HEADS / num_key_value_heads` query heads, repeated like
//! `repeat_kv`), scaled by `1/sqrt(head_dim)`, causal, hidden positions at
//! the most negative f32. Only the default rope is implemented: a config
//! with `rope_scaling` (Llama 3's `llama3`, `linear`, `dynamic`, ...) has no
//! field here, and its checkpoints would load but compute other positions.
//!
//! **Tied head.** With `tie_word_embeddings` (Llama 3.2 1B and 3B) the
//! output projection is the token embedding: the model has no `lm_head`
//! (the field is `None`), the logits are `norm(h) @ embed_tokens.weight^T`,
//! and `state_dict()` holds no `lm_head.weight`, like the `model.safetensors`
//! that `save_pretrained` writes. A file that does carry it loads when it
//! equals the embedding and is refused otherwise. Untied models (TinyLlama,
//! Llama 2, Llama 3 8B) have `lm_head: Some(..)`.
//!
//! **Checkpoints.** [`LlamaForCausalLM::load_hf_state_dict`] also reads a
//! bare `LlamaModel` file (no `model.` prefix: it is added) and drops the
//! `self_attn.rotary_emb.inv_freq` buffers that older `transformers` saved;
//! the [`HfLoadReport`] lists both.
//!
//! **Generation.** [`LlamaForCausalLM::logits_cached`] runs new positions
//! against a [`KvCache`] of every layer's keys (after the rotary embedding)
//! and values, stored with the key/value heads only (not repeated), so a
//! GQA model's cache is `HEADS / num_key_value_heads` times smaller;
//! [`LlamaForCausalLM::generate`] is greedy decoding, like
//! `generate(do_sample=False)`.
//!
//! **Sizes.** Const generics: vocabulary `V`, hidden `H`, query heads
//! `HEADS` (`head_dim = H / HEADS`), `KV`, the width of `k_proj` and `v_proj`
//! (`num_key_value_heads * head_dim`: stable Rust cannot write that product
//! in a type, so it is a parameter, and the number of key/value heads is
//! `KV / head_dim`), and the MLP's inner size `FF`. The rest (layer count,
//! eps, rope theta, tying) is run-time configuration, [`LlamaConfig`], whose
//! sizes must agree with the type (checked when the model is built). The
//! context length is not a type parameter: the rotary embedding has no
//! table, and, as in `transformers`, positions beyond
//! `max_position_embeddings` are not refused. A `head_dim` other than
//! `H / HEADS` (some Llama derivatives) is not supported.

use crate::decoder::{self, causal_mask, run_layers, Kv};
use crate::util::{
    attend, count_layers, layout_of, load_strict, merge_heads, restore, split_heads, Dyn4, HfKeys,
    Init,
};
use crate::{HfLoadReport, Loaded, ModelError, Outputs};
use forma::core::device::Device;
use forma::core::dtype::DType;
use forma::nn::layers::{Dropout, Embedding, Linear, RMSNorm};
use forma::nn::{scope, StateDict};
use forma::prelude::*;
use std::path::Path;

pub use crate::decoder::{KvCache, Sampling};

const MODEL: &str = "Llama";

/// Hugging Face's `LlamaConfig`, the fields this model reads. The sizes
/// repeat the model type's parameters (so that a config read from
/// `config.json` can be checked against the type); the others are free.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size (the type's `V`).
    pub vocab_size: usize,
    /// Hidden size (the type's `H`).
    pub hidden_size: usize,
    /// The MLP's inner size (the type's `FF`).
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads (the type's `HEADS`).
    pub num_attention_heads: usize,
    /// Key/value heads (the type's `KV / head_dim`): fewer than the query
    /// heads for grouped-query attention, as many for multi-head attention.
    pub num_key_value_heads: usize,
    /// RMSNorm eps (`rms_norm_eps`; HF's default 1e-6, Llama 2 and
    /// TinyLlama 1e-5).
    pub rms_norm_eps: f64,
    /// Base of the rotary frequencies (`rope_theta`, 10000; Llama 3 500000).
    pub rope_theta: f64,
    /// Longest sequence the model was trained for (`max_position_embeddings`).
    /// Informative: as in `transformers`, longer inputs are not refused.
    pub max_position_embeddings: usize,
    /// Whether `lm_head` is the token embedding (`tie_word_embeddings`).
    pub tie_word_embeddings: bool,
    /// Dropout on attention probabilities in training (`attention_dropout`, 0).
    pub attention_dropout: f64,
    /// Standard deviation of the initial weights (`initializer_range`, 0.02).
    pub initializer_range: f64,
}

impl LlamaConfig {
    /// Hugging Face's defaults (eps 1e-6, theta 10000, 2048 positions,
    /// untied head, no dropout) with the given sizes and layer count.
    pub fn new(
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
    ) -> Self {
        LlamaConfig {
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            max_position_embeddings: 2048,
            tie_word_embeddings: false,
            attention_dropout: 0.0,
            initializer_range: 0.02,
        }
    }

    /// TinyLlama-1.1B's (`TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T`
    /// and its chat variant): 22 layers, 32 heads, 4 key/value heads, eps
    /// 1e-5; see [`TinyLlama`].
    pub fn tinyllama_1_1b() -> Self {
        LlamaConfig {
            rms_norm_eps: 1e-5,
            ..Self::new(32000, 2048, 5632, 22, 32, 4)
        }
    }

    /// `head_dim`: the hidden size per query head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }
}

/// TinyLlama-1.1B (vocabulary 32000, hidden 2048, 32 heads of 64, 4
/// key/value heads so `KV = 256`, MLP 5632; 22 layers from
/// [`LlamaConfig::tinyllama_1_1b`]): 1,100,048,384 parameters.
pub type TinyLlama = LlamaForCausalLM<32000, 2048, 32, 256, 5632>;

/// Llama's rotary position embedding, like `LlamaRotaryEmbedding` (the
/// default rope): only the inverse frequencies, a buffer that is not saved
/// (HF's `inv_freq` is registered with `persistent=False`).
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "LlamaRotaryEmbedding")]
pub struct LlamaRotaryEmbedding<E: Float = f32, D: Device<E> = Cpu> {
    /// `1 / theta^(2i / head_dim)` for `i` in `0..head_dim / 2`.
    #[module(buffer(persistent = false))]
    pub inv_freq: Tensor<(Dyn,), E, D>,
    /// `rope_theta`, from which f16 and bf16 models recompute `inv_freq` in
    /// f32 (see [`LlamaRotaryEmbedding::cos_sin`]).
    pub rope_theta: f64,
}

/// Grouped-query self-attention, like `LlamaAttention` (no biases).
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "LlamaAttention")]
pub struct LlamaAttention<
    const H: usize,
    const HEADS: usize,
    const KV: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// `[H, H]`.
    pub q_proj: Linear<H, H, E, D>,
    /// `[KV, H]`.
    pub k_proj: Linear<H, KV, E, D>,
    /// `[KV, H]`.
    pub v_proj: Linear<H, KV, E, D>,
    /// `[H, H]`.
    pub o_proj: Linear<H, H, E, D>,
    /// `attention_dropout`, in training only.
    pub attention_dropout: Dropout,
}

/// The SiLU-gated feed-forward block, like `LlamaMLP`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "LlamaMLP")]
pub struct LlamaMlp<const H: usize, const FF: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[FF, H]`.
    pub gate_proj: Linear<H, FF, E, D>,
    /// `[FF, H]`.
    pub up_proj: Linear<H, FF, E, D>,
    /// `[H, FF]`.
    pub down_proj: Linear<FF, H, E, D>,
}

/// A pre-norm decoder layer, like `LlamaDecoderLayer`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "LlamaDecoderLayer")]
pub struct LlamaDecoderLayer<
    const H: usize,
    const HEADS: usize,
    const KV: usize,
    const FF: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// Self-attention.
    pub self_attn: LlamaAttention<H, HEADS, KV, E, D>,
    /// The feed-forward block.
    pub mlp: LlamaMlp<H, FF, E, D>,
    /// Before attention.
    pub input_layernorm: RMSNorm<H, E, D>,
    /// Before the MLP.
    pub post_attention_layernorm: RMSNorm<H, E, D>,
}

/// The decoder without its head, like `LlamaModel`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "LlamaModel")]
pub struct LlamaModel<
    const V: usize,
    const H: usize,
    const HEADS: usize,
    const KV: usize,
    const FF: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// Token embedding `[V, H]` (also the head when tied).
    pub embed_tokens: Embedding<V, H, E, D>,
    /// The layers, `model.layers.<n>`.
    pub layers: Vec<LlamaDecoderLayer<H, HEADS, KV, FF, E, D>>,
    /// The final norm.
    pub norm: RMSNorm<H, E, D>,
    /// The rotary embedding's frequencies (not saved).
    pub rotary_emb: LlamaRotaryEmbedding<E, D>,
}

/// Llama with its language-model head, like `transformers.LlamaForCausalLM`
/// (see the [module docs](self) for the sizes and the tied head).
///
/// ```
/// use forma::prelude::*;
/// use forma_models::llama::{LlamaConfig, LlamaForCausalLM};
///
/// // Vocabulary 40, hidden 16, 4 heads of 4, 2 key/value heads (KV = 8), MLP 24.
/// type Tiny = LlamaForCausalLM<40, 16, 4, 8, 24>;
/// let config = LlamaConfig::new(40, 16, 24, 2, 4, 2);
/// let mut llama = Tiny::new(&config, &Cpu, &mut Rng::seed_from(0)).unwrap();
/// llama.eval();
/// let out = llama.generate(&[1, 2, 3], 5).unwrap();
/// assert_eq!(out.len(), 8);
/// assert_eq!(llama.state_dict().get("model.layers.1.self_attn.k_proj.weight").unwrap().dims(), [8, 16]);
/// ```
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "LlamaForCausalLM")]
pub struct LlamaForCausalLM<
    const V: usize,
    const H: usize,
    const HEADS: usize,
    const KV: usize,
    const FF: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// The decoder.
    pub model: LlamaModel<V, H, HEADS, KV, FF, E, D>,
    /// The output projection `[V, H]`; `None` when tied to
    /// `model.embed_tokens`.
    pub lm_head: Option<Linear<H, V, E, D>>,
}

/// What [`LlamaForCausalLM::run_with`] returns, like
/// `CausalLMOutputWithPast` (the cache is passed in instead).
pub type LlamaOutputs<const V: usize, const H: usize, E = f32, D = Cpu> =
    crate::CausalLmOutputs<V, H, E, D>;

impl<
        const V: usize,
        const H: usize,
        const HEADS: usize,
        const KV: usize,
        const FF: usize,
        E: Float,
        D: Device<E>,
    > LlamaForCausalLM<V, H, HEADS, KV, FF, E, D>
{
    const SIZES_FIT: () = {
        assert!(
            HEADS > 0 && H.is_multiple_of(HEADS),
            "Llama: the hidden size must split into equal heads"
        );
        assert!(
            (H / HEADS).is_multiple_of(2),
            "Llama: the rotary embedding needs an even head_dim"
        );
        assert!(
            KV > 0 && KV.is_multiple_of(H / HEADS),
            "Llama: KV must be a whole number of heads of H / HEADS"
        );
        assert!(
            HEADS.is_multiple_of(KV / (H / HEADS)),
            "Llama: the query heads must split evenly among the key/value heads"
        );
    };

    /// The number of key/value heads the type fixes: `KV / head_dim`.
    pub const KV_HEADS: usize = KV / (H / HEADS);

    /// Hugging Face's defaults ([`LlamaConfig::new`]) with this type's sizes
    /// and `num_hidden_layers` layers.
    pub fn config(num_hidden_layers: usize) -> LlamaConfig {
        let () = Self::SIZES_FIT;
        LlamaConfig::new(V, H, FF, num_hidden_layers, HEADS, Self::KV_HEADS)
    }

    /// A model initialised like Hugging Face's (weights `N(0,
    /// initializer_range^2)`, norm scales 1), in training mode.
    ///
    /// # Errors
    /// [`ModelError::Config`], naming the field, when `config`'s sizes
    /// differ from the type's or its eps, theta or dropout mean nothing.
    pub fn new(config: &LlamaConfig, device: &D, rng: &mut Rng) -> Result<Self, ModelError> {
        let std = config.initializer_range;
        Self::build(config, &mut Init::Normal { std, rng }, device)
    }

    fn check(config: &LlamaConfig) -> Result<(), ModelError> {
        let () = Self::SIZES_FIT;
        let sizes = [
            ("vocab_size", config.vocab_size, V, "V"),
            ("hidden_size", config.hidden_size, H, "H"),
            ("intermediate_size", config.intermediate_size, FF, "FF"),
            (
                "num_attention_heads",
                config.num_attention_heads,
                HEADS,
                "HEADS",
            ),
            (
                "num_key_value_heads",
                config.num_key_value_heads,
                Self::KV_HEADS,
                "KV / head_dim",
            ),
        ];
        for (field, got, want, param) in sizes {
            if got != want {
                return Err(ModelError::Config {
                    model: MODEL,
                    field,
                    what: format!("is {got}, the model type's {param} is {want}"),
                });
            }
        }
        let (eps, theta, dropout) = (
            config.rms_norm_eps,
            config.rope_theta,
            config.attention_dropout,
        );
        let settings = [
            (
                "rms_norm_eps",
                eps,
                eps.is_finite() && eps >= 0.0,
                "finite and >= 0",
            ),
            (
                "rope_theta",
                theta,
                theta.is_finite() && theta > 0.0,
                "finite and > 0",
            ),
            (
                "attention_dropout",
                dropout,
                (0.0..1.0).contains(&dropout),
                "in [0, 1)",
            ),
        ];
        for (field, value, ok, want) in settings {
            if !ok {
                return Err(ModelError::Config {
                    model: MODEL,
                    field,
                    what: format!("is {value}, it must be {want}"),
                });
            }
        }
        Ok(())
    }

    fn build(config: &LlamaConfig, init: &mut Init<'_>, device: &D) -> Result<Self, ModelError> {
        Self::check(config)?;
        let eps = Some(config.rms_norm_eps);
        let norm = |init: &mut Init<'_>| RMSNorm {
            weight: init.constant((C,), 1.0, device),
            eps,
        };
        let embed_tokens = init.embedding(device);
        let layers = (0..config.num_hidden_layers)
            .map(|_| LlamaDecoderLayer {
                self_attn: LlamaAttention {
                    q_proj: linear(init, device),
                    k_proj: linear(init, device),
                    v_proj: linear(init, device),
                    o_proj: linear(init, device),
                    attention_dropout: init.dropout(config.attention_dropout),
                },
                mlp: LlamaMlp {
                    gate_proj: linear(init, device),
                    up_proj: linear(init, device),
                    down_proj: linear(init, device),
                },
                input_layernorm: norm(init),
                post_attention_layernorm: norm(init),
            })
            .collect();
        let final_norm = norm(init);
        let lm_head = (!config.tie_word_embeddings).then(|| linear(init, device));
        Ok(LlamaForCausalLM {
            model: LlamaModel {
                embed_tokens,
                layers,
                norm: final_norm,
                rotary_emb: LlamaRotaryEmbedding::new(H / HEADS, config.rope_theta, device)?,
            },
            lm_head,
        })
    }

    /// The `state_dict` keys and shapes of a model of this type and
    /// `config`, in order, without allocating its weights.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma_models::llama::{LlamaConfig, TinyLlama};
    /// let keys = TinyLlama::state_dict_layout(&LlamaConfig::tinyllama_1_1b(), &Cpu).unwrap();
    /// assert_eq!(keys[2], ("model.layers.0.self_attn.k_proj.weight".to_string(), vec![256, 2048]));
    /// ```
    ///
    /// # Errors
    /// As [`LlamaForCausalLM::new`].
    pub fn state_dict_layout(
        config: &LlamaConfig,
        device: &D,
    ) -> Result<Vec<(String, Vec<usize>)>, ModelError> {
        Ok(layout_of(&Self::build(config, &mut Init::Meta, device)?))
    }

    /// Loads a Hugging Face Llama checkpoint (`model.safetensors` of a
    /// `LlamaForCausalLM`, or of a `LlamaModel` for a tied config) into a
    /// model built from `config` (the file does not say its eps, theta or
    /// tying: they come from its `config.json`), in eval mode. See
    /// [`LlamaForCausalLM::load_hf_state_dict`] for what is set aside.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when the file cannot be read,
    /// [`ModelError::NoLayers`] when it holds no layer and the config asks
    /// for some, [`ModelError::Config`] for a config that does not fit the
    /// type, [`ModelError::UntiedHead`] for a tied head that differs from
    /// the embedding, and
    /// [`ModelError::Load`] naming the file and every missing, unexpected
    /// and mismatched key.
    pub fn from_safetensors(
        path: impl AsRef<Path>,
        config: &LlamaConfig,
        device: &D,
    ) -> Result<Loaded<Self>, ModelError> {
        let path = path.as_ref();
        Self::check(config)?;
        let sd = forma::nn::state::load_file(path)?.tensors;
        let layers = count_layers(&sd, "model.layers.").max(count_layers(&sd, "layers."));
        if layers == 0 && config.num_hidden_layers > 0 {
            return Err(ModelError::NoLayers(MODEL));
        }
        let mut model = Self::new(config, device, &mut Rng::seed_from(0))?;
        let report = model.load_hf_state_dict(sd).map_err(|e| e.in_file(path))?;
        Ok(Loaded::eval(model, report))
    }

    /// Loads a Hugging Face Llama state dict strictly, after the explicit
    /// adjustments real checkpoints need: `model.` is prefixed when the file
    /// is a bare `LlamaModel`; the `rotary_emb.inv_freq` buffers of older
    /// files are dropped (the model computes them from `rope_theta`); with a
    /// tied head, an `lm_head.weight` equal to the embedding is dropped.
    /// Every other key must match. On error the model is unchanged.
    ///
    /// # Errors
    /// [`ModelError::UntiedHead`] for a tied model given an
    /// `lm_head.weight` that differs from `model.embed_tokens.weight`;
    /// [`ModelError::Load`]
    /// listing every missing, unexpected and mismatched key.
    pub fn load_hf_state_dict(&mut self, sd: StateDict) -> Result<HfLoadReport, ModelError> {
        let (sd, report) = normalize_hf_llama(sd, self.lm_head.is_none())?;
        load_strict(self, &sd, None)?;
        Ok(report)
    }

    /// Logits `[batch, len, V]` for token ids `[batch, len]`, the whole
    /// sequence at once, like `model(input_ids).logits`.
    ///
    /// # Errors
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
    /// An empty cache gives the same logits as [`LlamaForCausalLM::logits`].
    ///
    /// # Errors
    /// As [`LlamaForCausalLM::logits`]; [`ModelError::Input`] when the
    /// batch differs from the cache's. On error the cache is unchanged.
    pub fn logits_cached(
        &self,
        input_ids: &Tensor<(Dyn, Dyn), i64, D>,
        cache: &mut KvCache<E, D>,
    ) -> Result<Tensor<(Dyn, Dyn, C<V>), E, D>, ModelError> {
        Ok(self.run_with(input_ids, Some(cache), Outputs::NONE)?.logits)
    }

    /// The logits and the intermediate results `outputs` asks for, like
    /// `model(input_ids, past_key_values=cache, output_hidden_states=..,
    /// output_attentions=..)`: see [`LlamaOutputs`]. Without a cache this is
    /// [`LlamaForCausalLM::logits`], with one
    /// [`LlamaForCausalLM::logits_cached`].
    ///
    /// # Errors
    /// As [`LlamaForCausalLM::logits_cached`].
    pub fn run_with(
        &self,
        input_ids: &Tensor<(Dyn, Dyn), i64, D>,
        cache: Option<&mut KvCache<E, D>>,
        outputs: Outputs,
    ) -> Result<LlamaOutputs<V, H, E, D>, ModelError> {
        let layers = self.model.layers.len();
        decoder::with_cache(cache, MODEL, input_ids.size(0), layers, |cache| {
            self.run(input_ids, cache, outputs)
        })
    }

    fn run(
        &self,
        ids: &Tensor<(Dyn, Dyn), i64, D>,
        cache: Option<&mut KvCache<E, D>>,
        outputs: Outputs,
    ) -> Result<LlamaOutputs<V, H, E, D>, ModelError> {
        let m = &self.model;
        let past = cache.as_ref().map_or(0, |c| c.len());
        let t = ids.size(1);
        let (x, rope, mask) = scope::run("model", || {
            let x = scope::run("embed_tokens", || m.embed_tokens.try_lookup(ids))?;
            let rope = scope::run("rotary_emb", || m.rotary_emb.cos_sin(past, t))?;
            Ok((x, rope, causal_mask::<E, D>(t, past, ids.device())?))
        })?;
        run_layers(
            x,
            cache,
            m.layers.len(),
            outputs,
            ("model", "layers"),
            |i, x, slot, output_attentions| {
                m.layers[i].step(x, slot, &rope, &mask, output_attentions)
            },
            |x| m.norm.try_forward_as("norm", x),
            |x| match &self.lm_head {
                Some(head) => head.try_forward_as("lm_head", x),
                None => x.try_matmul(&m.embed_tokens.weight.t()),
            },
        )
    }

    /// The prompt followed by `max_new_tokens` greedily chosen tokens (the
    /// most likely one, the lowest id on a tie), with a [`KvCache`] so that
    /// each new token runs one position (no graph is recorded): like
    /// `generate(input_ids, do_sample=False, max_new_tokens=..)` without a
    /// stop token. Set eval mode first unless dropout is wanted.
    /// [`LlamaForCausalLM::generate_with`] samples otherwise.
    ///
    /// # Errors
    /// [`ModelError::Sampling`] for an empty prompt; [`ModelError::Tensor`]
    /// for a prompt id outside the vocabulary.
    pub fn generate(&self, prompt: &[i64], max_new_tokens: usize) -> Result<Vec<i64>, ModelError> {
        let rng = &mut Rng::seed_from(0); // greedy: never drawn from
        self.generate_with(prompt, max_new_tokens, Sampling::Greedy, rng)
    }

    /// The prompt followed by `max_new_tokens` tokens, each picked by
    /// `sampling` from the logits of the last position (greedily, or from
    /// the top k with `rng`), with a [`KvCache`] as
    /// [`LlamaForCausalLM::generate`]: like `generate(input_ids,
    /// do_sample=True, top_k=k, temperature=..)` without a stop token.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma_models::llama::{LlamaForCausalLM, Sampling};
    ///
    /// type Tiny = LlamaForCausalLM<40, 16, 4, 8, 24>;
    /// let mut rng = Rng::seed_from(0);
    /// let mut llama = Tiny::new(&Tiny::config(1), &Cpu, &mut rng).unwrap();
    /// llama.eval();
    /// let top_k = Sampling::TopK { k: 4, temperature: 0.8 };
    /// assert_eq!(llama.generate_with(&[1, 2, 3], 5, top_k, &mut rng).unwrap().len(), 8);
    /// ```
    ///
    /// # Errors
    /// [`ModelError::Sampling`] for an empty prompt, `k = 0` or a
    /// temperature that is not positive; [`ModelError::Tensor`] for a prompt
    /// id outside the vocabulary.
    pub fn generate_with(
        &self,
        prompt: &[i64],
        max_new_tokens: usize,
        sampling: Sampling,
        rng: &mut Rng,
    ) -> Result<Vec<i64>, ModelError> {
        let device = self.model.embed_tokens.weight.device();
        decoder::generate(
            prompt,
            max_new_tokens,
            sampling,
            rng,
            None,
            device,
            |ids, cache| self.logits_cached(ids, cache),
        )
    }
}

/// A bias-free linear layer (`nn.Linear(.., bias=False)`).
fn linear<const I: usize, const O: usize, E: Float, D: Device<E>>(
    init: &mut Init<'_>,
    device: &D,
) -> Linear<I, O, E, D> {
    Linear {
        weight: init.weight((C, C), device),
        bias: None,
    }
}

/// `1 / theta^(2i / head_dim)` for `i` in `0..head_dim / 2`, computed in f32
/// as `transformers` does (`base ** (arange(0, dim, 2).float() / dim)`).
fn inv_freq_f32(head_dim: usize, theta: f64) -> Vec<f32> {
    let base = theta as f32;
    (0..head_dim)
        .step_by(2)
        .map(|i| 1.0 / base.powf(i as f32 / head_dim as f32))
        .collect()
}

impl<E: Float, D: Device<E>> LlamaRotaryEmbedding<E, D> {
    /// The default rope of heads of `head_dim` with base `rope_theta`.
    ///
    /// # Errors
    /// A device error.
    pub fn new(head_dim: usize, rope_theta: f64, device: &D) -> forma::Result<Self> {
        let inv: Vec<E> = inv_freq_f32(head_dim, rope_theta)
            .into_iter()
            .map(|f| E::from_f64(f64::from(f)))
            .collect();
        let n = inv.len();
        Ok(LlamaRotaryEmbedding {
            inv_freq: Tensor::from_vec_on(inv, (Dyn(n),), device)?,
            rope_theta,
        })
    }

    /// `cos` and `sin` of the positions `past..past + len`, each
    /// `[1, 1, len, head_dim]` (`cat(freqs, freqs)` with `freqs = position *
    /// inv_freq`), ready to broadcast over `[batch, heads, len, head_dim]`.
    ///
    /// In f32 and f64 the table is built from tensor ops (so graph capture
    /// sees it follow the sequence length). For f16 and bf16 it is computed
    /// in f32 on the host and rounded once, as `transformers` does (its
    /// rotary embedding runs in f32 whatever the model's dtype): a product
    /// `position * inv_freq` rounded to bf16 would be off by up to 2 radians
    /// at position 1000.
    ///
    /// # Errors
    /// A device error.
    pub fn cos_sin(&self, past: usize, len: usize) -> forma::Result<(Dyn4<E, D>, Dyn4<E, D>)> {
        let device = self.inv_freq.device();
        let half = self.inv_freq.size(0);
        let shape = (Dyn(1), Dyn(1), Dyn(len), Dyn(2 * half));
        if matches!(E::DTYPE, DType::F16 | DType::BF16) {
            // Not the buffer: in bf16 it holds 8 significant bits.
            let inv = inv_freq_f32(2 * half, self.rope_theta);
            let (mut cos, mut sin) = (Vec::with_capacity(len * 2 * half), Vec::new());
            for p in past..past + len {
                let freqs: Vec<f32> = inv.iter().map(|&f| p as f32 * f).collect();
                for &a in freqs.iter().chain(&freqs) {
                    cos.push(E::from_f64(f64::from(a.cos())));
                    sin.push(E::from_f64(f64::from(a.sin())));
                }
            }
            return Ok((
                Tensor::from_vec_on(cos, shape, device)?,
                Tensor::from_vec_on(sin, shape, device)?,
            ));
        }
        let pos = Tensor::<(Dyn,), E, D>::arange_on(past as f64, (past + len) as f64, 1.0, device)?;
        let freqs = pos
            .unsqueeze::<1>()
            .into_dyn()
            .try_mul(&self.inv_freq.unsqueeze::<0>().into_dyn())?;
        let emb = forma::try_cat::<1, _, _>(&[freqs.clone(), freqs])?;
        Ok((
            emb.cos().try_reshape_to(shape)?,
            emb.sin().try_reshape_to(shape)?,
        ))
    }
}

/// `x * cos + rotate_half(x) * sin` on `[batch, heads, len, head_dim]`, with
/// `rotate_half(x) = cat(-x[.., d/2..], x[.., ..d/2])`, like
/// `apply_rotary_pos_emb`.
fn apply_rope<E: Float, D: Device<E>>(
    x: &Dyn4<E, D>,
    rope: &Kv<E, D>,
) -> forma::Result<Dyn4<E, D>> {
    let (cos, sin) = rope;
    let half = x.size(3) / 2;
    let x1 = x.narrow::<3>(0, half);
    let x2 = x.narrow::<3>(half, half);
    let rotated = forma::try_cat::<3, _, _>(&[-&x2, x1])?;
    x.try_mul(cos)?.try_add(&rotated.try_mul(sin)?)
}

/// `[batch, kv_heads, len, head_dim]` with each head repeated `n_rep` times
/// in place: `[batch, kv_heads * n_rep, len, head_dim]`, like `repeat_kv`.
fn repeat_kv<E: Float, D: Device<E>>(x: Dyn4<E, D>, n_rep: usize) -> forma::Result<Dyn4<E, D>> {
    if n_rep == 1 {
        return Ok(x);
    }
    let (b, kvh, s, hd) = (x.size(0), x.size(1), x.size(2), x.size(3));
    x.unsqueeze::<2>()
        .try_expand((Dyn(b), Dyn(kvh), Dyn(n_rep), Dyn(s), Dyn(hd)))?
        .contiguous()
        .try_reshape_to((Dyn(b), Dyn(kvh * n_rep), Dyn(s), Dyn(hd)))
}

/// Adds `model.` to a bare `LlamaModel` file, drops the `inv_freq` buffers
/// of older files and, for a tied model, an `lm_head.weight` equal to the
/// embedding.
fn normalize_hf_llama(sd: StateDict, tied: bool) -> Result<(StateDict, HfLoadReport), ModelError> {
    let mut keys = HfKeys::new(sd).add_prefix("model.");
    if tied {
        keys = keys.drop_tied_head("model.embed_tokens.weight")?;
    }
    let keys = keys
        .drop(|k| k.starts_with("model.layers.") && k.ends_with(".self_attn.rotary_emb.inv_freq"));
    Ok(keys.finish())
}

impl<
        const H: usize,
        const HEADS: usize,
        const KV: usize,
        const FF: usize,
        E: Float,
        D: Device<E>,
    > LlamaDecoderLayer<H, HEADS, KV, FF, E, D>
{
    /// One layer on hidden states `[batch, len, H]` at positions `0..len`
    /// (no cache), with `rope` from [`LlamaRotaryEmbedding::cos_sin`], like
    /// `LlamaDecoderLayer(hidden_states, position_embeddings=..)`:
    /// `x + self_attn(input_layernorm(x))`, then
    /// `+ mlp(post_attention_layernorm(..))`. Returns the output and, when
    /// `output_attentions`, the causal attention probabilities
    /// `[batch, HEADS, len, len]`.
    ///
    /// # Errors
    /// A tensor error of its ops (a `rope` of the wrong length).
    pub fn run(
        &self,
        x: Tensor<(Dyn, Dyn, C<H>), E, D>,
        rope: &(Dyn4<E, D>, Dyn4<E, D>),
        output_attentions: bool,
    ) -> forma::Result<(Tensor<(Dyn, Dyn, C<H>), E, D>, Option<Dyn4<E, D>>)> {
        let mask = causal_mask::<E, D>(x.size(1), 0, x.device())?;
        self.step(x, None, rope, &mask, output_attentions)
    }

    fn step(
        &self,
        x: Tensor<(Dyn, Dyn, C<H>), E, D>,
        slot: Option<&mut Option<Kv<E, D>>>,
        rope: &Kv<E, D>,
        mask: &Dyn4<E, D>,
        output_attentions: bool,
    ) -> forma::Result<(Tensor<(Dyn, Dyn, C<H>), E, D>, Option<Dyn4<E, D>>)> {
        let h = self
            .input_layernorm
            .try_forward_as("input_layernorm", x.clone())?;
        let (a, probs) = scope::run("self_attn", || {
            self.self_attn.step(h, slot, rope, mask, output_attentions)
        })?;
        let x = &x + &a;
        let h = self
            .post_attention_layernorm
            .try_forward_as("post_attention_layernorm", x.clone())?;
        let m = scope::run("mlp", || self.mlp.run(h))?;
        Ok((&x + &m, probs))
    }
}

impl<const H: usize, const HEADS: usize, const KV: usize, E: Float, D: Device<E>>
    LlamaAttention<H, HEADS, KV, E, D>
{
    /// Attention of `x`'s positions over the cached ones and themselves;
    /// `slot` (this layer's cache entry) is extended with `x`'s keys (after
    /// the rotary embedding) and values, before their heads are repeated.
    fn step(
        &self,
        x: Tensor<(Dyn, Dyn, C<H>), E, D>,
        slot: Option<&mut Option<Kv<E, D>>>,
        rope: &Kv<E, D>,
        mask: &Dyn4<E, D>,
        output_attentions: bool,
    ) -> forma::Result<(Tensor<(Dyn, Dyn, C<H>), E, D>, Option<Dyn4<E, D>>)> {
        let kv_heads = KV / (H / HEADS);
        let q = self.q_proj.try_forward_as("q_proj", x.clone())?.into_dyn();
        let k = self.k_proj.try_forward_as("k_proj", x.clone())?.into_dyn();
        let v = self.v_proj.try_forward_as("v_proj", x)?.into_dyn();
        let q = apply_rope(&split_heads(&q, HEADS)?, rope)?;
        let k = apply_rope(&split_heads(&k, kv_heads)?, rope)?;
        let v = split_heads(&v, kv_heads)?;
        let (k, v) = decoder::extend(slot, k, v)?;
        let n_rep = HEADS / kv_heads;
        let (ctx, probs) = attend(
            &q,
            &repeat_kv(k, n_rep)?,
            &repeat_kv(v, n_rep)?,
            Some(mask),
            &self.attention_dropout,
            output_attentions,
        )?;
        let ctx: Tensor<(Dyn, Dyn, C<H>), E, D> = restore(merge_heads(&ctx)?);
        Ok((self.o_proj.try_forward_as("o_proj", ctx)?, probs))
    }
}

impl<const H: usize, const FF: usize, E: Float, D: Device<E>> LlamaMlp<H, FF, E, D> {
    /// `down_proj(silu(gate_proj(x)) * up_proj(x))`, like `LlamaMLP`.
    ///
    /// # Errors
    /// A tensor error of its ops.
    pub fn run(
        &self,
        x: Tensor<(Dyn, Dyn, C<H>), E, D>,
    ) -> forma::Result<Tensor<(Dyn, Dyn, C<H>), E, D>> {
        let gate = self
            .gate_proj
            .try_forward_as("gate_proj", x.clone())?
            .silu();
        let up = self.up_proj.try_forward_as("up_proj", x)?;
        self.down_proj.try_forward_as("down_proj", &gate * &up)
    }
}

impl<
        const V: usize,
        const H: usize,
        const HEADS: usize,
        const KV: usize,
        const FF: usize,
        E: Float,
        D: Device<E>,
    > Forward<Tensor<(Dyn, Dyn), i64, D>, Tensor<(Dyn, Dyn, C<V>), E, D>>
    for LlamaForCausalLM<V, H, HEADS, KV, FF, E, D>
{
    /// [`LlamaForCausalLM::logits`].
    ///
    /// # Errors
    /// Where [`LlamaForCausalLM::logits`] returns one, as a tensor error.
    fn try_forward(
        &self,
        ids: Tensor<(Dyn, Dyn), i64, D>,
    ) -> forma::Result<Tensor<(Dyn, Dyn, C<V>), E, D>> {
        Ok(self.logits(&ids)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeat_kv_repeats_each_head_in_place() {
        // Two key/value heads [0, 1] of one position, head_dim 1, n_rep 2:
        // heads 0, 0, 1, 1 (repeat_interleave, not tile).
        let x = Tensor::<(Dyn, Dyn, Dyn, Dyn)>::from_vec(
            vec![10.0, 20.0],
            (Dyn(1), Dyn(2), Dyn(1), Dyn(1)),
        )
        .unwrap();
        assert_eq!(repeat_kv(x, 2).unwrap().to_vec(), [10.0, 10.0, 20.0, 20.0]);
    }

    #[test]
    fn rotate_half_at_position_zero_is_the_identity() {
        let rope = LlamaRotaryEmbedding::<f32>::new(4, 10000.0, &Cpu).unwrap();
        assert_eq!(rope.inv_freq.to_vec(), [1.0, 0.01]);
        let cs = rope.cos_sin(0, 2).unwrap();
        let x = Tensor::<(Dyn, Dyn, Dyn, Dyn)>::from_vec(
            vec![1.0, 2.0, 3.0, 4.0, 1.0, 0.0, 0.0, 0.0],
            (Dyn(1), Dyn(1), Dyn(2), Dyn(4)),
        )
        .unwrap();
        let y = apply_rope(&x, &cs).unwrap().to_vec();
        assert_eq!(y[..4], [1.0, 2.0, 3.0, 4.0]);
        // Position 1, pair (x0, x2) = (1, 0) rotated by 1 radian.
        assert!((y[4] - 1f32.cos()).abs() < 1e-6 && (y[6] - 1f32.sin()).abs() < 1e-6);
    }
}
