//! A BERT encoder with the layout of Hugging Face's `BertModel`: its
//! `state_dict` keys and shapes are `transformers`' own
//! (`embeddings.word_embeddings.weight`,
//! `encoder.layer.0.attention.self.query.weight`, `pooler.dense.weight`, ...),
//! so a Hugging Face `model.safetensors` loads with one call
//! ([`Bert::from_safetensors`]), and [`Module::save_safetensors`] writes a file
//! `BertModel.from_pretrained` reads.
//!
//! The sizes that decide parameter shapes are const generics: vocabulary
//! `V`, hidden size `H`, attention heads `HEADS`, feed-forward size `FFN`,
//! position table `P` and token types `TV`. The layer count, the LayerNorm eps
//! and the dropout rates are a run-time [`BertConfig`]. [`MiniLmL6`] is the
//! shape of sentence-transformers' all-MiniLM-L6-v2.
//!
//! Numerics follow `transformers`: exact (erf) GELU, LayerNorm eps 1e-12,
//! scores scaled by `1/sqrt(head_dim)`, padding hidden with the most negative
//! f32. [`Bert::sentence_embeddings`] adds sentence-transformers' pooling.
//!
//! [`Bert::run_with`] also returns every layer's hidden states and attention
//! probabilities on request ([`Outputs`]), like `output_hidden_states=True`
//! and `output_attentions=True`; the layers' own forward passes
//! ([`BertEmbeddings::run`], [`BertLayer::run`]) are public too.

use crate::util::{
    attend, count_layers, host_ids, layout_of, load_strict, merge_heads, restore, split_heads,
    Dyn4, HfKeys, Init, HIDDEN,
};
use crate::{HfLoadReport, Loaded, ModelError, Outputs};
use forma::core::device::Device;
use forma::core::graph::{Slot, Slots, Traced};
use forma::nn::layers::{Dropout, Embedding, LayerNorm, Linear};
use forma::nn::{scope, StateDict};
use forma::prelude::*;
use std::path::Path;

/// What a BERT model's type does not fix, like the rest of Hugging Face's
/// `BertConfig`.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// Number of encoder layers (`num_hidden_layers`).
    pub num_hidden_layers: usize,
    /// LayerNorm eps (`layer_norm_eps`, 1e-12).
    pub layer_norm_eps: f64,
    /// Dropout after embeddings and sub-layers (`hidden_dropout_prob`, 0.1).
    pub hidden_dropout_prob: f64,
    /// Dropout on attention weights (`attention_probs_dropout_prob`, 0.1).
    pub attention_probs_dropout_prob: f64,
    /// Standard deviation of the initial weights (`initializer_range`, 0.02).
    pub initializer_range: f64,
}

impl BertConfig {
    /// Hugging Face's defaults with `num_hidden_layers` layers.
    pub fn with_layers(num_hidden_layers: usize) -> Self {
        BertConfig {
            num_hidden_layers,
            layer_norm_eps: 1e-12,
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            initializer_range: 0.02,
        }
    }

    /// all-MiniLM-L6-v2's: 6 layers, otherwise the defaults.
    pub fn minilm_l6() -> Self {
        Self::with_layers(6)
    }
}

/// The shape of sentence-transformers' all-MiniLM-L6-v2 (vocabulary 30522,
/// hidden 384, 12 heads, feed-forward 1536, 512 positions, 2 token types;
/// 6 layers from [`BertConfig::minilm_l6`]), in f32 on the CPU (write the
/// `Bert` type out for another dtype or device).
pub type MiniLmL6 = Bert<30522, 384, 12, 1536, 512, 2>;

/// Word, position and token-type embeddings, summed and normalised, like
/// `BertEmbeddings`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "BertEmbeddings")]
pub struct BertEmbeddings<
    const V: usize,
    const H: usize,
    const P: usize,
    const TV: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// `[V, H]`.
    pub word_embeddings: Embedding<V, H, E, D>,
    /// `[P, H]`.
    pub position_embeddings: Embedding<P, H, E, D>,
    /// `[TV, H]`.
    pub token_type_embeddings: Embedding<TV, H, E, D>,
    /// Hugging Face keeps TensorFlow's capitalised name.
    #[module(rename = "LayerNorm")]
    pub layer_norm: LayerNorm<H, E, D>,
    /// `hidden_dropout_prob`.
    pub dropout: Dropout,
}

/// The query, key and value projections, like `BertSelfAttention`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "BertSelfAttention")]
pub struct BertSelfAttention<const H: usize, const HEADS: usize, E: Float = f32, D: Device<E> = Cpu>
{
    /// `[H, H]`.
    pub query: Linear<H, H, E, D>,
    /// `[H, H]`.
    pub key: Linear<H, H, E, D>,
    /// `[H, H]`.
    pub value: Linear<H, H, E, D>,
    /// `attention_probs_dropout_prob`, on the attention weights.
    pub dropout: Dropout,
}

/// A projection, dropout, residual and LayerNorm, like `BertSelfOutput`
/// (`I = H`) and `BertOutput` (`I = FFN`).
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "BertOutput")]
pub struct BertOutput<const I: usize, const H: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[H, I]`.
    pub dense: Linear<I, H, E, D>,
    /// Hugging Face keeps TensorFlow's capitalised name.
    #[module(rename = "LayerNorm")]
    pub layer_norm: LayerNorm<H, E, D>,
    /// `hidden_dropout_prob`.
    pub dropout: Dropout,
}

/// Self-attention and its output block, like `BertAttention`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "BertAttention")]
pub struct BertAttention<const H: usize, const HEADS: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `self` is a Rust keyword, so the field is `self_`.
    #[module(rename = "self")]
    pub self_: BertSelfAttention<H, HEADS, E, D>,
    /// `BertSelfOutput`.
    pub output: BertOutput<H, H, E, D>,
}

/// The feed-forward expansion with exact GELU, like `BertIntermediate`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "BertIntermediate")]
pub struct BertIntermediate<const H: usize, const FFN: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[FFN, H]`.
    pub dense: Linear<H, FFN, E, D>,
}

/// One encoder layer, like `BertLayer`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "BertLayer")]
pub struct BertLayer<
    const H: usize,
    const HEADS: usize,
    const FFN: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// Self-attention with residual and norm.
    pub attention: BertAttention<H, HEADS, E, D>,
    /// `H -> FFN`.
    pub intermediate: BertIntermediate<H, FFN, E, D>,
    /// `FFN -> H` with residual and norm.
    pub output: BertOutput<FFN, H, E, D>,
}

/// The stack of layers, like `BertEncoder`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "BertEncoder")]
pub struct BertEncoder<
    const H: usize,
    const HEADS: usize,
    const FFN: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// `encoder.layer.<n>`.
    pub layer: Vec<BertLayer<H, HEADS, FFN, E, D>>,
}

/// `tanh(dense(first token))`, like `BertPooler`.
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "BertPooler")]
pub struct BertPooler<const H: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[H, H]`.
    pub dense: Linear<H, H, E, D>,
}

/// A BERT encoder with a pooler, like `transformers.BertModel`.
///
/// ```
/// use forma::prelude::*;
/// use forma_models::bert::{Bert, BertConfig};
///
/// // A tiny BERT: vocabulary 50, hidden 16, 2 heads, feed-forward 24,
/// // 32 positions, 2 token types, 1 layer.
/// let mut bert = Bert::<50, 16, 2, 24, 32, 2>::new(&BertConfig::with_layers(1), &Cpu, &mut Rng::seed_from(0));
/// bert.eval();
/// let ids = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![1, 7, 9, 2], (Dyn(1), Dyn(4))).unwrap();
/// let out = bert.run(&ids, None, None).unwrap();
/// assert_eq!(out.last_hidden_state.dims()[..], [1, 4, 16]);
/// assert_eq!(out.pooler_output.dims()[..], [1, 16]);
/// assert!(out.hidden_states.is_none() && out.attentions.is_none());
///
/// // Like `output_hidden_states=True, output_attentions=True`.
/// let out = bert.run_with(&ids, None, None, forma_models::Outputs::ALL).unwrap();
/// assert_eq!(out.hidden_states.unwrap().len(), 1 + 1); // the embeddings', then each layer's
/// assert_eq!(out.attentions.unwrap()[0].dims()[..], [1, 2, 4, 4]); // [batch, heads, query, key]
/// assert_eq!(bert.state_dict().keys().nth(5), Some("encoder.layer.0.attention.self.query.weight"));
/// ```
#[derive(Module, Debug)]
#[module(crate = "::forma::nn", name = "BertModel")]
pub struct Bert<
    const V: usize,
    const H: usize,
    const HEADS: usize,
    const FFN: usize,
    const P: usize,
    const TV: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// Token, position and type embeddings.
    pub embeddings: BertEmbeddings<V, H, P, TV, E, D>,
    /// The layers.
    pub encoder: BertEncoder<H, HEADS, FFN, E, D>,
    /// The first token's projection.
    pub pooler: BertPooler<H, E, D>,
}

/// What [`Bert::run`] and [`Bert::run_with`] return, like
/// `BaseModelOutputWithPooling`.
#[derive(Debug)]
pub struct BertOutputs<const H: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[batch, len, H]`.
    pub last_hidden_state: Tensor<(Dyn, Dyn, C<H>), E, D>,
    /// `[batch, H]`: `tanh(dense(last_hidden_state[:, 0]))`.
    pub pooler_output: Tensor<(Dyn, C<H>), E, D>,
    /// With [`Outputs::output_hidden_states`]: `1 + layers` tensors
    /// `[batch, len, H]`, the embeddings' output (after their LayerNorm and
    /// dropout) and then each layer's, so the last is `last_hidden_state`.
    /// `None` otherwise.
    pub hidden_states: Option<Vec<Tensor<(Dyn, Dyn, C<H>), E, D>>>,
    /// With [`Outputs::output_attentions`]: each layer's attention
    /// probabilities `[batch, HEADS, len, len]` (`[.., query, key]`, after
    /// the softmax and the attention dropout); padded keys get exactly 0.
    /// `None` otherwise.
    pub attentions: Option<Vec<Dyn4<E, D>>>,
}

impl<
        const V: usize,
        const H: usize,
        const HEADS: usize,
        const FFN: usize,
        const P: usize,
        const TV: usize,
        E: Float,
        D: Device<E>,
    > Bert<V, H, HEADS, FFN, P, TV, E, D>
{
    const HEADS_DIVIDE: () = assert!(
        HEADS > 0 && H.is_multiple_of(HEADS),
        "Bert: the hidden size must split into equal heads"
    );

    /// A model initialised like Hugging Face's (`N(0, initializer_range^2)`
    /// weights, zero biases, unit LayerNorm scales), in training mode.
    pub fn new(config: &BertConfig, device: &D, rng: &mut Rng) -> Self {
        let std = config.initializer_range;
        Self::build(config, &mut Init::Normal { std, rng }, device)
    }

    fn build(config: &BertConfig, init: &mut Init<'_>, device: &D) -> Self {
        let () = Self::HEADS_DIVIDE;
        let eps = config.layer_norm_eps;
        let p = config.hidden_dropout_prob;
        let embeddings = BertEmbeddings {
            word_embeddings: init.embedding(device),
            position_embeddings: init.embedding(device),
            token_type_embeddings: init.embedding(device),
            layer_norm: init.layer_norm(eps, device),
            dropout: init.dropout(p),
        };
        let layer = (0..config.num_hidden_layers)
            .map(|_| BertLayer {
                attention: BertAttention {
                    self_: BertSelfAttention {
                        query: init.linear(device),
                        key: init.linear(device),
                        value: init.linear(device),
                        dropout: init.dropout(config.attention_probs_dropout_prob),
                    },
                    output: BertOutput {
                        dense: init.linear(device),
                        layer_norm: init.layer_norm(eps, device),
                        dropout: init.dropout(p),
                    },
                },
                intermediate: BertIntermediate {
                    dense: init.linear(device),
                },
                output: BertOutput {
                    dense: init.linear(device),
                    layer_norm: init.layer_norm(eps, device),
                    dropout: init.dropout(p),
                },
            })
            .collect();
        Bert {
            embeddings,
            encoder: BertEncoder { layer },
            pooler: BertPooler {
                dense: init.linear(device),
            },
        }
    }

    /// The `state_dict` keys and shapes of a model of this type and
    /// `config`, in order, without allocating its weights (each tensor of
    /// the model built to list them is a view of a single zero).
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma_models::bert::{BertConfig, MiniLmL6};
    /// let keys = MiniLmL6::state_dict_layout(&BertConfig::minilm_l6(), &Cpu);
    /// assert_eq!(keys[0], ("embeddings.word_embeddings.weight".to_string(), vec![30522, 384]));
    /// assert_eq!(keys.len(), 5 + 6 * 16 + 2);
    /// ```
    pub fn state_dict_layout(config: &BertConfig, device: &D) -> Vec<(String, Vec<usize>)> {
        layout_of(&Self::build(config, &mut Init::Meta, device))
    }

    /// Loads a Hugging Face BERT checkpoint (`model.safetensors` of a
    /// `BertModel`, or of a `BertFor*` model whose encoder sits under
    /// `bert.`), in eval mode, with the layer count read from the file and
    /// the other settings from [`BertConfig::with_layers`]. See
    /// [`Bert::load_hf_state_dict`] for what is set aside; the returned
    /// [`Loaded::report`] lists it.
    ///
    /// # Errors
    /// [`ModelError::Checkpoint`] when the file cannot be read,
    /// [`ModelError::NoLayers`] when it holds no encoder layer, and
    /// [`ModelError::Load`] listing every missing, unexpected and mismatched
    /// key.
    pub fn from_safetensors(
        path: impl AsRef<Path>,
        device: &D,
    ) -> Result<Loaded<Self>, ModelError> {
        let path = path.as_ref();
        let sd = forma::nn::state::load_file(path)?.tensors;
        let (sd, report) = normalize_hf_bert(sd);
        let layers = count_layers(&sd, "encoder.layer.");
        if layers == 0 {
            return Err(ModelError::NoLayers("encoder"));
        }
        let config = BertConfig::with_layers(layers);
        let mut model = Self::build(
            &config,
            &mut Init::Normal {
                std: 0.0,
                rng: &mut Rng::seed_from(0),
            },
            device,
        );
        load_strict(&mut model, &sd, Some(path))?;
        Ok(Loaded::eval(model, report))
    }

    /// Loads a Hugging Face BERT state dict strictly, after the explicit
    /// adjustments real checkpoints need: a `bert.` prefix (from `BertFor*`
    /// models) is stripped, and the `embeddings.position_ids` buffer that
    /// `transformers` saved before 4.31 and pre-training heads (`cls.*`)
    /// are dropped. Every other key must match. On error the model is
    /// unchanged.
    ///
    /// # Errors
    /// [`ModelError::Load`] listing every missing, unexpected and mismatched key.
    pub fn load_hf_state_dict(&mut self, sd: StateDict) -> Result<HfLoadReport, ModelError> {
        let (sd, report) = normalize_hf_bert(sd);
        load_strict(self, &sd, None)?;
        Ok(report)
    }

    /// The encoder's output for token ids `[batch, len]`, with optional
    /// token types (default all 0) and attention mask (1 keeps a position, 0
    /// hides it; default all 1), like `model(input_ids, token_type_ids,
    /// attention_mask)`. No hidden states or attentions are kept
    /// ([`Bert::run_with`] returns them).
    ///
    /// # Errors
    /// [`ModelError::SequenceTooLong`] past `P` positions,
    /// [`ModelError::Input`] when the types or mask differ in shape from the
    /// ids, [`ModelError::Tensor`] for an id outside the vocabulary.
    pub fn run(
        &self,
        input_ids: &Tensor<(Dyn, Dyn), i64, D>,
        token_type_ids: Option<&Tensor<(Dyn, Dyn), i64, D>>,
        attention_mask: Option<&Tensor<(Dyn, Dyn), i64, D>>,
    ) -> Result<BertOutputs<H, E, D>, ModelError> {
        self.run_with(input_ids, token_type_ids, attention_mask, Outputs::NONE)
    }

    /// [`Bert::run`] that also returns the intermediate results `outputs`
    /// asks for, like `model(input_ids, token_type_ids, attention_mask,
    /// output_hidden_states=.., output_attentions=..)`: see
    /// [`BertOutputs::hidden_states`] and [`BertOutputs::attentions`]. The
    /// other outputs do not depend on `outputs` (beyond float error: without
    /// attentions the attention may run fused).
    ///
    /// # Errors
    /// As [`Bert::run`].
    pub fn run_with(
        &self,
        input_ids: &Tensor<(Dyn, Dyn), i64, D>,
        token_type_ids: Option<&Tensor<(Dyn, Dyn), i64, D>>,
        attention_mask: Option<&Tensor<(Dyn, Dyn), i64, D>>,
        outputs: Outputs,
    ) -> Result<BertOutputs<H, E, D>, ModelError> {
        let b = input_ids.size(0);
        let t = input_ids.size(1);
        if t > P {
            return Err(ModelError::SequenceTooLong {
                model: "Bert",
                len: t,
                max: P,
            });
        }
        for (name, x) in [
            ("token_type_ids", token_type_ids),
            ("attention_mask", attention_mask),
        ] {
            if let Some(x) = x {
                if x.dims() != input_ids.dims() {
                    return Err(ModelError::Input {
                        model: "Bert",
                        what: format!(
                            "{name} is {:?} but input_ids is {:?}",
                            x.dims(),
                            input_ids.dims()
                        ),
                    });
                }
            }
        }
        let mut x = scope::run("embeddings", || {
            self.embeddings.run(input_ids, token_type_ids)
        })?;
        let mask = match attention_mask {
            Some(m) => Some(extended_attention_mask::<E, D>(m)?),
            None => None,
        };
        let mut hidden_states = outputs.output_hidden_states.then(Vec::new);
        let mut attentions = outputs.output_attentions.then(Vec::new);
        for (i, layer) in self.encoder.layer.iter().enumerate() {
            if let Some(all) = &mut hidden_states {
                all.push(x.clone());
            }
            let (y, probs) = scope::run("encoder", || {
                scope::run("layer", || {
                    scope::run(i, || layer.run(x, mask.as_ref(), outputs.output_attentions))
                })
            })?;
            if let (Some(all), Some(p)) = (&mut attentions, probs) {
                all.push(p);
            }
            x = y;
        }
        if let Some(all) = &mut hidden_states {
            all.push(x.clone());
        }
        let first = x.narrow::<1>(0, 1).try_reshape_to((Dyn(b), C::<H>))?;
        let pooler_output = scope::run("pooler", || {
            self.pooler.dense.try_forward_as("dense", first)
        })?
        .tanh();
        Ok(BertOutputs {
            last_hidden_state: x,
            pooler_output,
            hidden_states,
            attentions,
        })
    }

    /// Sentence embeddings as sentence-transformers computes them for
    /// all-MiniLM-L6-v2: the mean of the last hidden states over the
    /// positions the mask keeps, L2-normalised (`Pooling(mode="mean")` then
    /// `Normalize()`). `[batch, len]` ids and mask give `[batch, H]`.
    ///
    /// # Errors
    /// As [`Bert::run`].
    pub fn sentence_embeddings(
        &self,
        input_ids: &Tensor<(Dyn, Dyn), i64, D>,
        attention_mask: &Tensor<(Dyn, Dyn), i64, D>,
    ) -> Result<Tensor<(Dyn, C<H>), E, D>, ModelError> {
        let out = self.run(input_ids, None, Some(attention_mask))?;
        Ok(mean_pool_normalize(&out.last_hidden_state, attention_mask)?)
    }
}

/// Mean over the positions `mask` keeps, then `x / max(|x|, 1e-12)`, like
/// sentence-transformers' mean pooling and `F.normalize`.
///
/// # Errors
/// When the mask's shape differs from the states' first two sizes.
pub fn mean_pool_normalize<const H: usize, E: Float, D: Device<E>>(
    hidden: &Tensor<(Dyn, Dyn, C<H>), E, D>,
    mask: &Tensor<(Dyn, Dyn), i64, D>,
) -> forma::Result<Tensor<(Dyn, C<H>), E, D>> {
    let (b, t) = (hidden.size(0), hidden.size(1));
    let keep: Vec<E> = host_ids(mask)
        .iter()
        .map(|&v| E::from_f64(v as f64))
        .collect();
    let keep = Tensor::<(Dyn, Dyn, Dyn), E, D>::from_vec_on(
        keep,
        (Dyn(b), Dyn(t), Dyn(1)),
        hidden.device(),
    )?;
    let h = hidden.into_dyn();
    let summed = (&h * &keep).sum::<1>();
    let counts = keep.sum::<1>().clamp(1e-9, f64::INFINITY);
    let mean = &summed / &counts;
    let norm = mean
        .square()
        .sum_keepdim::<1>()
        .sqrt()
        .clamp(1e-12, f64::INFINITY);
    Ok(restore(&mean / &norm))
}

/// Hugging Face's `get_extended_attention_mask` for an encoder: the
/// additive mask `[batch, 1, 1, len]` of an `attention_mask` `[batch, len]`
/// (1 keeps a key position, 0 hides it), 0 where kept and the most negative
/// f32 where hidden, which broadcasts to the attention scores
/// `[batch, heads, query, key]` ([`BertLayer::run`] takes it).
///
/// # Errors
/// When the device cannot hold it.
pub fn extended_attention_mask<E: Float, D: Device<E>>(
    attention_mask: &Tensor<(Dyn, Dyn), i64, D>,
) -> forma::Result<Dyn4<E, D>> {
    let (b, t) = (attention_mask.size(0), attention_mask.size(1));
    let add: Vec<E> = host_ids(attention_mask)
        .iter()
        .map(|&v| E::from_f64(if v == 0 { HIDDEN } else { 0.0 }))
        .collect();
    Tensor::from_vec_on(
        add,
        (Dyn(b), Dyn(1), Dyn(1), Dyn(t)),
        attention_mask.device(),
    )
}

/// Graph capture (ONNX export) reads a BERT forward's two outputs,
/// `last_hidden_state` and `pooler_output`, in that order.
impl<const H: usize, E: Float, D: Device<E>> Traced for BertOutputs<H, E, D> {
    fn traced(&self) -> Vec<(forma::core::graph::Val, Vec<bool>)> {
        let mut v = self.last_hidden_state.traced();
        v.extend(self.pooler_output.traced());
        v
    }

    fn grown(&self, extra: &[Vec<usize>], next: &mut usize) -> forma::Result<Self> {
        Ok(BertOutputs {
            last_hidden_state: self.last_hidden_state.grown(extra, next)?,
            pooler_output: self.pooler_output.grown(extra, next)?,
            hidden_states: None,
            attentions: None,
        })
    }
}

/// `forma::compile` replays a BERT forward into its two outputs, in the
/// order [`Traced`] reads them.
impl<const H: usize, E: Float, D: Device<E>> Slots for BertOutputs<H, E, D> {
    type Device = D;

    fn device(&self) -> D {
        self.last_hidden_state.device().clone()
    }

    fn slots<X: Float>(&self, out: &mut Vec<Slot<X, D>>) -> forma::Result<()> {
        self.last_hidden_state.slots(out)?;
        self.pooler_output.slots(out)
    }

    fn from_slots<X: Float>(it: &mut dyn Iterator<Item = Slot<X, D>>) -> forma::Result<Self> {
        Ok(BertOutputs {
            last_hidden_state: Slots::from_slots(it)?,
            pooler_output: Slots::from_slots(it)?,
            hidden_states: None,
            attentions: None,
        })
    }
}

/// Strips `bert.` and drops what is not a `BertModel` weight.
fn normalize_hf_bert(sd: StateDict) -> (StateDict, HfLoadReport) {
    let mut keys = HfKeys::new(sd);
    if keys.has_prefix("bert.") {
        keys = keys.rename("bert.", |k| k.strip_prefix("bert.").map(String::from));
    }
    keys.drop(|k| k == "embeddings.position_ids" || k.starts_with("cls."))
        .finish()
}

impl<const V: usize, const H: usize, const P: usize, const TV: usize, E: Float, D: Device<E>>
    BertEmbeddings<V, H, P, TV, E, D>
{
    /// `dropout(LayerNorm(word + position + token type embeddings))`
    /// `[batch, len, H]` for token ids `[batch, len]` and optional token
    /// types (default all 0), like `BertEmbeddings(input_ids,
    /// token_type_ids)`: the first of [`BertOutputs::hidden_states`].
    ///
    /// # Errors
    /// For an id outside the vocabulary or types, types of another shape
    /// than the ids, or more than `P` positions.
    pub fn run(
        &self,
        input_ids: &Tensor<(Dyn, Dyn), i64, D>,
        token_type_ids: Option<&Tensor<(Dyn, Dyn), i64, D>>,
    ) -> forma::Result<Tensor<(Dyn, Dyn, C<H>), E, D>> {
        let t = input_ids.size(1);
        let words = scope::run("word_embeddings", || {
            self.word_embeddings.try_lookup(input_ids)
        })?;
        let types = match token_type_ids {
            Some(ty) => self
                .token_type_embeddings
                .try_forward_as("token_type_embeddings", ty.clone())?,
            None => {
                // Every position of type 0: its row, broadcast (a zeros
                // tensor of the ids' sizes would be the same, but graph
                // capture would record it at the example's sizes).
                let row = self.token_type_embeddings.weight.try_narrow::<0>(0, 1)?;
                scope::run("token_type_embeddings", || {
                    row.try_reshape_to((Dyn(1), Dyn(1), C::<H>))
                })?
                .try_expand((Dyn(input_ids.size(0)), Dyn(t), C::<H>))?
            }
        };
        let pos = Tensor::<(Dyn,), i64, D>::arange_on(0.0, t as f64, 1.0, input_ids.device())?;
        let pos = self
            .position_embeddings
            .try_forward_as("position_embeddings", pos)?
            .into_dyn()
            .unsqueeze::<0>();
        let x: Tensor<(Dyn, Dyn, C<H>), E, D> =
            restore(&(&words.into_dyn() + &types.into_dyn()) + &pos);
        let x = self.layer_norm.try_forward_as("LayerNorm", x)?;
        self.dropout.try_forward_as("dropout", x)
    }
}

impl<const H: usize, const HEADS: usize, const FFN: usize, E: Float, D: Device<E>>
    BertLayer<H, HEADS, FFN, E, D>
{
    /// One encoder layer on hidden states `[batch, len, H]`, like
    /// `BertLayer(hidden_states, attention_mask, output_attentions=..)`:
    /// self-attention with residual and LayerNorm, then the feed-forward
    /// block with residual and LayerNorm. `mask` is additive and broadcasts
    /// to the scores `[batch, HEADS, len, len]` (see
    /// [`extended_attention_mask`]). Returns the layer's output and, when
    /// `output_attentions`, its attention probabilities `[batch, HEADS, len,
    /// len]` (see [`BertSelfAttention::run`]).
    ///
    /// # Errors
    /// When the mask does not broadcast to the scores.
    pub fn run(
        &self,
        x: Tensor<(Dyn, Dyn, C<H>), E, D>,
        mask: Option<&Dyn4<E, D>>,
        output_attentions: bool,
    ) -> forma::Result<(Tensor<(Dyn, Dyn, C<H>), E, D>, Option<Dyn4<E, D>>)> {
        let att = &self.attention;
        let (ctx, probs) = scope::run("attention", || {
            scope::run("self", || att.self_.run(&x, mask, output_attentions))
        })?;
        let x = scope::run("attention", || {
            scope::run("output", || att.output.run(ctx, &x))
        })?;
        let inter = scope::run("intermediate", || {
            self.intermediate.dense.try_forward_as("dense", x.clone())
        })?
        .gelu();
        let y = scope::run("output", || self.output.run(inter, &x))?;
        Ok((y, probs))
    }
}

impl<const H: usize, const HEADS: usize, E: Float, D: Device<E>> BertSelfAttention<H, HEADS, E, D> {
    /// The heads' context `[batch, len, H]` (before `BertSelfOutput`) for
    /// hidden states `[batch, len, H]` and an additive `mask` that
    /// broadcasts to the scores `[batch, HEADS, len, len]`:
    /// `softmax(q k^T / sqrt(H / HEADS) + mask) v` with dropout on the
    /// probabilities. When `output_attentions`, the probabilities (after
    /// dropout) come back too; otherwise they are never materialised where
    /// the attention can run fused.
    ///
    /// # Errors
    /// When the mask does not broadcast to the scores.
    pub fn run(
        &self,
        x: &Tensor<(Dyn, Dyn, C<H>), E, D>,
        mask: Option<&Dyn4<E, D>>,
        output_attentions: bool,
    ) -> forma::Result<(Tensor<(Dyn, Dyn, C<H>), E, D>, Option<Dyn4<E, D>>)> {
        let heads = |name: &'static str, l: &Linear<H, H, E, D>| {
            split_heads(&l.try_forward_as(name, x.clone())?.into_dyn(), HEADS)
        };
        let q = heads("query", &self.query)?;
        let k = heads("key", &self.key)?;
        let v = heads("value", &self.value)?;
        let (ctx, probs) = attend(&q, &k, &v, mask, &self.dropout, output_attentions)?;
        Ok((restore(merge_heads(&ctx)?), probs))
    }
}

impl<const I: usize, const H: usize, E: Float, D: Device<E>> BertOutput<I, H, E, D> {
    /// `LayerNorm(dropout(dense(x)) + residual)`, like `BertSelfOutput`
    /// and `BertOutput`.
    pub fn run(
        &self,
        x: Tensor<(Dyn, Dyn, C<I>), E, D>,
        residual: &Tensor<(Dyn, Dyn, C<H>), E, D>,
    ) -> forma::Result<Tensor<(Dyn, Dyn, C<H>), E, D>> {
        let y = self.dense.try_forward_as("dense", x)?;
        let y = self.dropout.try_forward_as("dropout", y)?;
        self.layer_norm.try_forward_as("LayerNorm", &y + residual)
    }
}

impl<
        const V: usize,
        const H: usize,
        const HEADS: usize,
        const FFN: usize,
        const P: usize,
        const TV: usize,
        E: Float,
        D: Device<E>,
    > Forward<Tensor<(Dyn, Dyn), i64, D>, BertOutputs<H, E, D>>
    for Bert<V, H, HEADS, FFN, P, TV, E, D>
{
    /// [`Bert::run`] without token types or mask.
    ///
    /// # Errors
    /// Where [`Bert::run`] returns one, as a tensor error.
    fn try_forward(&self, ids: Tensor<(Dyn, Dyn), i64, D>) -> forma::Result<BertOutputs<H, E, D>> {
        Ok(self.run(&ids, None, None)?)
    }
}
