//! Text in, text out: Hugging Face tokenizers (`tokenizer.json`, read by
//! Hugging Face's own [`tokenizers`] crate) in front of the models, and the
//! two pipelines built on them: sentence embeddings from strings
//! ([`SentenceEncoder`], sentence-transformers' `encode`) and text
//! generation from a prompt ([`TextGenerator`], `generate` then `decode`).
//!
//! Both load a Hugging Face model folder in one call
//! ([`SentenceEncoder::from_pretrained_dir`],
//! [`TextGenerator::from_pretrained_dir`]; the bare models' loaders are in
//! [`crate::pretrained`]).
//!
//! A `tokenizer.json` may carry padding and truncation settings (the hub's
//! all-MiniLM-L6-v2 pads every text to 128 positions); `transformers`
//! ignores them unless a call asks for padding or truncation, and so do
//! these pipelines, which set their own: the sentence encoder pads to the
//! longest text of the batch and truncates to its `max_len`, like
//! sentence-transformers; the generator neither pads nor truncates.

use crate::bert::{Bert, MiniLmL6};
use crate::gpt2::{Gpt2LMHeadModel, Gpt2Small, Sampling};
use crate::pretrained::Pretrained;
use crate::{Loaded, ModelError};
use forma::core::device::Device;
use forma::prelude::*;
use std::path::Path;
use tokenizers::{PaddingParams, PaddingStrategy, TruncationParams};

pub use tokenizers::Tokenizer;

/// Reads a Hugging Face `tokenizer.json` (what `save_pretrained` writes
/// for a fast tokenizer), with the settings the file holds.
///
/// ```
/// use forma_models::text::load_tokenizer;
///
/// # fn main() -> Result<(), forma_models::ModelError> {
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/fixtures/models/bert_text/tokenizer.json");
/// let tokenizer = load_tokenizer(path)?;
/// let tokens = tokenizer.encode("The lazy dog", true).expect("encodes");
/// assert_eq!(tokens.get_tokens(), ["[CLS]", "the", "lazy", "dog", "[SEP]"]);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`ModelError::Tokenizer`] naming the file when it cannot be read or is
/// not a tokenizer.
pub fn load_tokenizer(path: impl AsRef<Path>) -> Result<Tokenizer, ModelError> {
    let path = path.as_ref();
    Tokenizer::from_file(path).map_err(|source| ModelError::Tokenizer {
        context: path.display().to_string(),
        source,
    })
}

/// Token ids and attention masks `[batch, len]` of a padded batch of texts,
/// as `tokenizer(texts, padding=True, return_tensors="pt")` returns them (1
/// marks a token, 0 padding).
#[derive(Clone, Debug)]
pub struct TokenBatch<D: forma::core::Backend = Cpu> {
    /// `input_ids`.
    pub input_ids: Tensor<(Dyn, Dyn), i64, D>,
    /// `attention_mask`.
    pub attention_mask: Tensor<(Dyn, Dyn), i64, D>,
}

/// `tokenizer.encode_batch`, with special tokens, as a [`TokenBatch`] on
/// `device`. The batch is padded (to the longest text, or as `tokenizer`'s
/// padding settings say) and every text must come out the same length.
///
/// # Errors
/// [`ModelError::Tokenizer`] when a text cannot be encoded,
/// [`ModelError::Input`] when the texts come out of different lengths (the
/// tokenizer does not pad).
pub fn encode_batch<D: forma::core::Backend>(
    tokenizer: &Tokenizer,
    texts: &[&str],
    device: &D,
) -> Result<TokenBatch<D>, ModelError> {
    let encodings = tokenizer
        .encode_batch(texts.to_vec(), true)
        .map_err(|source| ModelError::Tokenizer {
            context: format!("encoding {} texts", texts.len()),
            source,
        })?;
    let len = encodings.first().map_or(0, |e| e.len());
    if let Some(e) = encodings.iter().find(|e| e.len() != len) {
        return Err(ModelError::Input {
            model: "tokenizer",
            what: format!(
                "texts of {} and {len} tokens in one batch: the tokenizer does not pad",
                e.len()
            ),
        });
    }
    let ids = encodings
        .iter()
        .flat_map(|e| e.get_ids().iter().map(|&i| i64::from(i)))
        .collect();
    let mask = encodings
        .iter()
        .flat_map(|e| e.get_attention_mask().iter().map(|&m| i64::from(m)))
        .collect();
    let dims = (Dyn(texts.len()), Dyn(len));
    Ok(TokenBatch {
        input_ids: Tensor::from_vec_on(ids, dims, device)?,
        attention_mask: Tensor::from_vec_on(mask, dims, device)?,
    })
}

/// Decodes ids with `tokenizer`, special tokens kept, like
/// `tokenizer.decode(ids)`.
///
/// # Errors
/// [`ModelError::Tokenizer`] when the tokenizer refuses the ids.
pub fn decode(tokenizer: &Tokenizer, ids: &[u32]) -> Result<String, ModelError> {
    tokenizer
        .decode(ids, false)
        .map_err(|source| ModelError::Tokenizer {
            context: format!("decoding {} ids", ids.len()),
            source,
        })
}

/// Cosine similarities `[a, b]` of the rows of two embedding matrices
/// (`sentence_transformers.util.cos_sim`): each row is L2-normalised (norms
/// below 1e-12 count as 1e-12, like `F.normalize`), then `a @ b^T`.
///
/// ```
/// use forma::prelude::*;
/// use forma_models::text::cos_sim;
///
/// # fn main() -> forma::Result<()> {
/// let a = Tensor::<(Dyn, C<2>)>::from_vec(vec![3.0, 4.0, 1.0, 0.0], (Dyn(2), C))?;
/// let sim = cos_sim(&a, &a)?.to_vec();
/// assert!((sim[1] - 0.6).abs() < 1e-6 && (sim[3] - 1.0).abs() < 1e-6);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// When the device cannot run the ops.
pub fn cos_sim<const H: usize, E: Float, D: Device<E>>(
    a: &Tensor<(Dyn, C<H>), E, D>,
    b: &Tensor<(Dyn, C<H>), E, D>,
) -> forma::Result<Tensor<(Dyn, Dyn), E, D>> {
    let unit = |x: &Tensor<(Dyn, C<H>), E, D>| -> forma::Result<Tensor<(Dyn, C<H>), E, D>> {
        let x = x.into_dyn();
        let norm = x
            .square()
            .sum_keepdim::<1>()
            .sqrt()
            .clamp(1e-12, f64::INFINITY);
        (&x / &norm).try_into_shape()
    };
    unit(a)?.try_matmul(&unit(b)?.t())
}

/// Sentence embeddings from strings, as sentence-transformers' `encode`
/// computes them for a BERT model with mean pooling and normalisation
/// (all-MiniLM-L6-v2's pipeline): tokenise with special tokens, pad to the
/// longest text, truncate to [`SentenceEncoder::max_len`] tokens, run the
/// encoder, average the last hidden states over the real tokens and
/// L2-normalise ([`Bert::sentence_embeddings`]).
///
/// ```
/// use forma::prelude::*;
/// use forma_models::bert::Bert;
/// use forma_models::text::{cos_sim, SentenceEncoder};
///
/// # fn main() -> Result<(), forma_models::ModelError> {
/// // The test fixture: a tiny random BERT with a WordPiece vocabulary of 143.
/// type Tiny = Bert<143, 32, 4, 37, 40, 2>;
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/fixtures/models/bert_text");
/// let encoder = SentenceEncoder::<Tiny>::from_pretrained_dir(dir, &Cpu)?.model;
/// let e = encoder.embed(&["The lazy dog.", "A sleepy dog."])?; // [2, 32]
/// let sim = cos_sim(&e, &e)?; // [2, 2], ones on the diagonal
/// assert_eq!(sim.dims()[..], [2, 2]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct SentenceEncoder<M = MiniLmL6> {
    /// The encoder, in eval mode.
    pub model: M,
    /// Its tokenizer, set to pad to the longest text and truncate to
    /// `max_len` (see [`SentenceEncoder::new`]).
    pub tokenizer: Tokenizer,
    /// The most tokens of a text, special tokens included; longer texts are
    /// cut (sentence-transformers' `max_seq_length`).
    pub max_len: usize,
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
    > SentenceEncoder<Bert<V, H, HEADS, FFN, P, TV, E, D>>
{
    /// Pairs a model with its tokenizer, and sets the tokenizer as
    /// sentence-transformers calls it: padding to the longest text of each
    /// batch (with the pad token of the file's padding settings, or
    /// `[PAD]`), truncation of the longest text first down to `max_len`
    /// tokens. `max_len` is capped at the position table `P`.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] when the tokenizer has no padding token
    /// (neither padding settings nor a `[PAD]` token) or `max_len` leaves no
    /// room beside the special tokens.
    pub fn new(
        model: Bert<V, H, HEADS, FFN, P, TV, E, D>,
        mut tokenizer: Tokenizer,
        max_len: usize,
    ) -> Result<Self, ModelError> {
        let max_len = max_len.min(P);
        let padding = match tokenizer.get_padding() {
            Some(p) => PaddingParams {
                strategy: PaddingStrategy::BatchLongest,
                pad_to_multiple_of: None,
                ..p.clone()
            },
            None => {
                let pad_id =
                    tokenizer
                        .token_to_id("[PAD]")
                        .ok_or_else(|| ModelError::Tokenizer {
                            context: "SentenceEncoder".into(),
                            source: "the tokenizer has no padding settings and no [PAD] token"
                                .into(),
                        })?;
                PaddingParams {
                    pad_id,
                    pad_token: "[PAD]".into(),
                    ..PaddingParams::default()
                }
            }
        };
        tokenizer.with_padding(Some(padding));
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_len,
                ..TruncationParams::default()
            }))
            .map_err(|source| ModelError::Tokenizer {
                context: format!("truncating to {max_len} tokens"),
                source,
            })?;
        Ok(SentenceEncoder {
            model,
            tokenizer,
            max_len,
        })
    }

    /// Loads a Hugging Face (sentence-transformers) model folder with
    /// [`Bert::from_pretrained_dir`] and pairs the two with
    /// [`SentenceEncoder::new`]; `max_len` is `max_seq_length` of the
    /// folder's `sentence_bert_config.json` when there is one (256 for
    /// all-MiniLM-L6-v2), else `P`.
    ///
    /// # Errors
    /// As [`Bert::from_pretrained_dir`] and [`SentenceEncoder::new`];
    /// [`ModelError::ConfigFile`] for a `sentence_bert_config.json` without a
    /// numeric `max_seq_length`.
    pub fn from_pretrained_dir(
        dir: impl AsRef<Path>,
        device: &D,
    ) -> Result<Loaded<Self>, ModelError> {
        let dir = dir.as_ref();
        let max_len = max_seq_length(&dir.join("sentence_bert_config.json"))?.unwrap_or(P);
        let Pretrained {
            model,
            tokenizer,
            report,
        } = Bert::from_pretrained_dir(dir, device)?;
        Ok(Loaded {
            model: Self::new(model, tokenizer, max_len)?,
            report,
        })
    }

    /// The padded token ids and attention mask of `texts`, on the model's
    /// device (`model.tokenize(texts)` in sentence-transformers).
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] when a text cannot be encoded.
    pub fn tokenize(&self, texts: &[&str]) -> Result<TokenBatch<D>, ModelError> {
        let device = self.model.embeddings.word_embeddings.weight.device();
        encode_batch(&self.tokenizer, texts, device)
    }

    /// One unit-length embedding per text, `[texts.len(), H]`, computed
    /// without recording gradients (`model.encode(texts)`). No texts give
    /// `[0, H]`.
    ///
    /// # Errors
    /// As [`SentenceEncoder::tokenize`] and [`Bert::run`].
    pub fn embed(&self, texts: &[&str]) -> Result<Tensor<(Dyn, C<H>), E, D>, ModelError> {
        let device = self.model.embeddings.word_embeddings.weight.device();
        if texts.is_empty() {
            return Ok(Tensor::from_vec_on(Vec::new(), (Dyn(0), C::<H>), device)?);
        }
        let batch = self.tokenize(texts)?;
        let _guard = forma::core::tape::no_grad();
        self.model
            .sentence_embeddings(&batch.input_ids, &batch.attention_mask)
    }
}

/// `max_seq_length` of a `sentence_bert_config.json`, `None` when there is
/// no such file.
fn max_seq_length(path: &Path) -> Result<Option<usize>, ModelError> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(None);
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::ConfigFile {
            path: path.display().to_string(),
            what: format!("not JSON: {e}"),
        })?;
    match value.get("max_seq_length").and_then(|v| v.as_u64()) {
        Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        None => Err(ModelError::ConfigFile {
            path: path.display().to_string(),
            what: "no numeric max_seq_length".into(),
        }),
    }
}

/// What [`TextGenerator::generate`] produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generated {
    /// The prompt's ids followed by the new ones.
    pub ids: Vec<u32>,
    /// How many of `ids` are the prompt's.
    pub prompt_len: usize,
    /// `ids` decoded, the prompt included (`tokenizer.decode(output[0])`).
    pub text: String,
}

/// Text generation from a prompt string: the prompt is tokenised (GPT-2's
/// byte-level BPE adds no special tokens), [`Gpt2LMHeadModel::generate`]
/// extends it, and the ids are decoded back to a string.
///
/// ```
/// use forma::prelude::*;
/// use forma_models::gpt2::{Gpt2LMHeadModel, Sampling};
/// use forma_models::text::TextGenerator;
///
/// # fn main() -> Result<(), forma_models::ModelError> {
/// // The test fixture: a tiny random GPT-2 with a byte-level BPE of 320 tokens.
/// type Tiny = Gpt2LMHeadModel<320, 64, 32, 96, 4, 128>;
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/fixtures/models/gpt2_text");
/// let generator = TextGenerator::<Tiny>::from_pretrained_dir(dir, &Cpu)?.model;
/// let out = generator.generate("The quick brown fox", 5, Sampling::Greedy, &mut Rng::seed_from(0))?;
/// assert_eq!(out.ids.len(), out.prompt_len + 5);
/// assert!(out.text.starts_with("The quick brown fox"));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TextGenerator<M = Gpt2Small> {
    /// The decoder, in eval mode.
    pub model: M,
    /// Its tokenizer, without padding or truncation.
    pub tokenizer: Tokenizer,
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
    > TextGenerator<Gpt2LMHeadModel<V, CTX, H, QKV, HEADS, FF, E, D>>
{
    /// Pairs a model with its tokenizer, whose padding and truncation
    /// settings are cleared (`transformers` applies them only on request).
    pub fn new(
        model: Gpt2LMHeadModel<V, CTX, H, QKV, HEADS, FF, E, D>,
        mut tokenizer: Tokenizer,
    ) -> Self {
        tokenizer.with_padding(None);
        // Clearing truncation cannot fail: only a new limit is checked.
        let _ = tokenizer.with_truncation(None);
        TextGenerator { model, tokenizer }
    }

    /// Loads a Hugging Face GPT-2 folder with
    /// [`Gpt2LMHeadModel::from_pretrained_dir`].
    ///
    /// # Errors
    /// As [`Gpt2LMHeadModel::from_pretrained_dir`].
    pub fn from_pretrained_dir(
        dir: impl AsRef<Path>,
        device: &D,
    ) -> Result<Loaded<Self>, ModelError> {
        let Pretrained {
            model,
            tokenizer,
            report,
        } = Gpt2LMHeadModel::from_pretrained_dir(dir, device)?;
        Ok(Loaded {
            model: Self::new(model, tokenizer),
            report,
        })
    }

    /// The prompt's token ids, as `tokenizer(prompt)["input_ids"]`.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] when the prompt cannot be encoded.
    pub fn encode(&self, prompt: &str) -> Result<Vec<u32>, ModelError> {
        let encoding =
            self.tokenizer
                .encode(prompt, true)
                .map_err(|source| ModelError::Tokenizer {
                    context: "encoding the prompt".into(),
                    source,
                })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The prompt extended by `max_new_tokens` tokens picked by `sampling`
    /// ([`Gpt2LMHeadModel::generate`]: no stop token), and the whole
    /// sequence decoded.
    ///
    /// # Errors
    /// As [`TextGenerator::encode`], [`Gpt2LMHeadModel::generate`] (an
    /// empty prompt is refused) and [`decode`].
    pub fn generate(
        &self,
        prompt: &str,
        max_new_tokens: usize,
        sampling: Sampling,
        rng: &mut Rng,
    ) -> Result<Generated, ModelError> {
        let prompt_ids = self.encode(prompt)?;
        let wide: Vec<i64> = prompt_ids.iter().map(|&i| i64::from(i)).collect();
        let out = self.model.generate(&wide, max_new_tokens, sampling, rng)?;
        // The model picks ids below its vocabulary size V, so they fit.
        let ids: Vec<u32> = prompt_ids
            .iter()
            .copied()
            .chain(out[wide.len()..].iter().map(|&i| i as u32))
            .collect();
        let text = decode(&self.tokenizer, &ids)?;
        Ok(Generated {
            ids,
            prompt_len: prompt_ids.len(),
            text,
        })
    }
}
