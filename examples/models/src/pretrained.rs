//! Hugging Face model folders in one call: `config.json`,
//! `model.safetensors` and `tokenizer.json`, as `from_pretrained(path)`
//! reads them ([`Bert::from_pretrained_dir`],
//! [`Gpt2LMHeadModel::from_pretrained_dir`],
//! [`LlamaForCausalLM::from_pretrained_dir`],
//! [`ViTForImageClassification::from_pretrained_dir`], which has no
//! tokenizer).
//!
//! The sizes that shape the weights are the Rust type's const generics, so
//! `config.json` is checked against the type rather than obeyed: a size
//! that differs, or a setting the model does not implement (another
//! activation, relative positions), is refused with
//! [`ModelError::ConfigMismatch`] naming the field, both values and, when
//! only sizes differ, the type to write for the file (`Bert<143, 32, 4, 37,
//! 40, 2>`; derived sizes such as GPT-2's `3 × n_embd` computed). The
//! [`hf_config!`](crate::hf_config) macro writes that type when the program
//! is built, from the same reading of the file. What
//! the type leaves open (the layer count, LayerNorm eps, dropout rates) is
//! read from the file. A field the file leaves out takes `transformers`'
//! default for that config class, as `from_pretrained` does.

use crate::bert::{Bert, BertConfig};
use crate::gpt2::{Gpt2Config, Gpt2LMHeadModel};
use crate::llama::{LlamaConfig, LlamaForCausalLM};
use crate::text::{load_tokenizer, Tokenizer};
use crate::vit::{ViTConfig, ViTForImageClassification};
use crate::{HfLoadReport, Loaded, ModelError};
use forma::core::device::Device;
use forma::prelude::*;
use forma_models_config::{Config, ModelType};
use std::path::{Path, PathBuf};

/// A model read from a Hugging Face model folder, with the folder's
/// tokenizer and what the weight load set aside (the triple of
/// `AutoModel.from_pretrained(path, output_loading_info=True)` and
/// `AutoTokenizer.from_pretrained(path)`).
#[derive(Debug)]
pub struct Pretrained<M> {
    /// The model, in eval mode.
    pub model: M,
    /// The folder's `tokenizer.json`, as the file sets it up.
    pub tokenizer: Tokenizer,
    /// What was dropped or renamed on the way ([`HfLoadReport`]).
    pub report: HfLoadReport,
}

/// Reads `model.safetensors` of `dir` into a state dict.
fn read_weights(dir: &Path) -> Result<(forma::nn::StateDict, String), ModelError> {
    let path = dir.join("model.safetensors");
    let sd = forma::nn::state::load_file(&path)?.tensors;
    Ok((sd, path.display().to_string()))
}

/// Names the weight file in a strict load's error (the loaders' own say
/// `<state_dict>`).
fn in_file(path: String) -> impl FnOnce(ModelError) -> ModelError {
    move |e| match e {
        ModelError::Load { source, .. } => ModelError::Load { path, source },
        e => e,
    }
}

/// The settings BERT's and ViT's configs share beside their sizes, read
/// into `$config` (a struct with these fields), an absent field keeping
/// `$defaults`' value: `num_hidden_layers`, `layer_norm_eps`,
/// `hidden_dropout_prob`, `attention_probs_dropout_prob`,
/// `initializer_range`.
macro_rules! encoder_settings {
    ($c:expr, $config:ident, $defaults:expr) => {{
        let (c, d): (&Config, $config) = ($c, $defaults);
        $config {
            num_hidden_layers: c.usize("num_hidden_layers", d.num_hidden_layers)?,
            layer_norm_eps: c.f64("layer_norm_eps", d.layer_norm_eps)?,
            hidden_dropout_prob: c.f64("hidden_dropout_prob", d.hidden_dropout_prob)?,
            attention_probs_dropout_prob: c.f64(
                "attention_probs_dropout_prob",
                d.attention_probs_dropout_prob,
            )?,
            initializer_range: c.f64("initializer_range", d.initializer_range)?,
        }
    }};
}

/// `from_pretrained_dir`'s steps for every model with a tokenizer: the
/// config read and checked, the tokenizer, then [`load_model`].
fn load_folder<M: forma::nn::Module, C>(
    dir: &Path,
    read_config: impl FnOnce(PathBuf) -> Result<C, ModelError>,
    build: impl FnOnce(&C) -> Result<M, ModelError>,
    load: impl FnOnce(&mut M, forma::nn::StateDict) -> Result<HfLoadReport, ModelError>,
) -> Result<Pretrained<M>, ModelError> {
    let config = read_config(dir.join("config.json"))?;
    let tokenizer = load_tokenizer(dir.join("tokenizer.json"))?;
    let Loaded { model, report } = load_model(dir, &config, build, load)?;
    Ok(Pretrained {
        model,
        tokenizer,
        report,
    })
}

/// The model of a folder whose config was read: built, its
/// `model.safetensors` loaded strictly (errors name the file), then eval
/// mode.
fn load_model<M: forma::nn::Module, C>(
    dir: &Path,
    config: &C,
    build: impl FnOnce(&C) -> Result<M, ModelError>,
    load: impl FnOnce(&mut M, forma::nn::StateDict) -> Result<HfLoadReport, ModelError>,
) -> Result<Loaded<M>, ModelError> {
    let (sd, path) = read_weights(dir)?;
    let mut model = build(config)?;
    let report = load(&mut model, sd).map_err(in_file(path))?;
    Ok(Loaded::eval(model, report))
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
    /// Reads a `BertConfig` `config.json`, checks it against this type and
    /// returns the settings the type leaves open.
    ///
    /// Checked: `vocab_size` = `V`, `hidden_size` = `H`,
    /// `num_attention_heads` = `HEADS`, `intermediate_size` = `FFN`,
    /// `max_position_embeddings` = `P`, `type_vocab_size` = `TV`,
    /// `hidden_act` = `"gelu"` (the exact GELU), `position_embedding_type`
    /// = `"absolute"`, `model_type` = `"bert"`. Read: `num_hidden_layers`,
    /// `layer_norm_eps`, `hidden_dropout_prob`,
    /// `attention_probs_dropout_prob`, `initializer_range`.
    ///
    /// # Errors
    /// [`ModelError::ConfigFile`] when the file cannot be read or a field has
    /// the wrong JSON type, [`ModelError::ConfigMismatch`] naming the first
    /// field that does not fit.
    pub fn read_hf_config(path: impl AsRef<Path>) -> Result<BertConfig, ModelError> {
        let c = Config::read(path.as_ref())?;
        ModelType::bert(&c)?.check(&c, &[V, H, HEADS, FFN, P, TV])?;
        Ok(encoder_settings!(
            &c,
            BertConfig,
            BertConfig::with_layers(12)
        ))
    }

    /// Loads a Hugging Face BERT folder (a sentence-transformers model such
    /// as all-MiniLM-L6-v2 is one): `config.json`, checked against the type
    /// ([`Bert::read_hf_config`]), `model.safetensors`, loaded strictly as
    /// [`Bert::load_hf_state_dict`] does, and `tokenizer.json`. The model
    /// is in eval mode.
    ///
    /// ```no_run
    /// use forma::prelude::*;
    /// use forma_models::bert::MiniLmL6;
    ///
    /// # fn main() -> Result<(), forma_models::ModelError> {
    /// let minilm = MiniLmL6::from_pretrained_dir("all-MiniLM-L6-v2", &Cpu)?;
    /// println!("dropped {:?}", minilm.report.dropped);
    /// let tokens = minilm.tokenizer.encode("Hello world", true).expect("encodes");
    /// assert_eq!(tokens.get_tokens(), ["[CLS]", "hello", "world", "[SEP]"]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Bert::read_hf_config`], [`Bert::from_safetensors`] and
    /// [`load_tokenizer`]; a layer count in `config.json` that differs from
    /// the file's shows as [`ModelError::Load`] listing the missing or
    /// unexpected layers' keys.
    pub fn from_pretrained_dir(
        dir: impl AsRef<Path>,
        device: &D,
    ) -> Result<Pretrained<Self>, ModelError> {
        load_folder(
            dir.as_ref(),
            Self::read_hf_config,
            |c| Ok(Self::new(c, device, &mut Rng::seed_from(0))),
            Self::load_hf_state_dict,
        )
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
    > Gpt2LMHeadModel<V, CTX, H, QKV, HEADS, FF, E, D>
{
    /// Reads a `GPT2Config` `config.json`, checks it against this type and
    /// returns the settings the type leaves open.
    ///
    /// Checked: `vocab_size` = `V`, `n_positions` = `CTX`, `n_embd` = `H`,
    /// `n_head` = `HEADS`, `n_inner` = `FF` (null means `4 * n_embd`),
    /// `activation_function` = `"gelu_new"` (or `"gelu_pytorch_tanh"`, the
    /// same function), `scale_attn_weights` = true,
    /// `scale_attn_by_inverse_layer_idx` = false, `add_cross_attention` =
    /// false, `model_type` = `"gpt2"`. Read: `n_layer`,
    /// `layer_norm_epsilon`, `embd_pdrop`, `attn_pdrop`, `resid_pdrop`,
    /// `initializer_range`.
    ///
    /// # Errors
    /// As [`Bert::read_hf_config`].
    pub fn read_hf_config(path: impl AsRef<Path>) -> Result<Gpt2Config, ModelError> {
        let c = Config::read(path.as_ref())?;
        ModelType::gpt2(&c)?.check(&c, &[V, CTX, H, QKV, HEADS, FF])?;
        let defaults = Gpt2Config::gpt2_small();
        Ok(Gpt2Config {
            n_layer: c.usize("n_layer", defaults.n_layer)?,
            layer_norm_epsilon: c.f64("layer_norm_epsilon", defaults.layer_norm_epsilon)?,
            embd_pdrop: c.f64("embd_pdrop", defaults.embd_pdrop)?,
            attn_pdrop: c.f64("attn_pdrop", defaults.attn_pdrop)?,
            resid_pdrop: c.f64("resid_pdrop", defaults.resid_pdrop)?,
            initializer_range: c.f64("initializer_range", defaults.initializer_range)?,
        })
    }

    /// Loads a Hugging Face GPT-2 folder (`config.json`, checked against the
    /// type by [`Gpt2LMHeadModel::read_hf_config`]; `model.safetensors`,
    /// loaded strictly as [`Gpt2LMHeadModel::load_hf_state_dict`] does;
    /// `tokenizer.json`), in eval mode.
    ///
    /// ```no_run
    /// use forma::prelude::*;
    /// use forma_models::gpt2::Gpt2Small;
    ///
    /// # fn main() -> Result<(), forma_models::ModelError> {
    /// let gpt2 = Gpt2Small::from_pretrained_dir("gpt2", &Cpu)?;
    /// println!("{:?}", gpt2.report.dropped);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Gpt2LMHeadModel::read_hf_config`],
    /// [`Gpt2LMHeadModel::from_safetensors`] and [`load_tokenizer`].
    pub fn from_pretrained_dir(
        dir: impl AsRef<Path>,
        device: &D,
    ) -> Result<Pretrained<Self>, ModelError> {
        load_folder(
            dir.as_ref(),
            Self::read_hf_config,
            |c| Ok(Self::new(c, device, &mut Rng::seed_from(0))),
            Self::load_hf_state_dict,
        )
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
    > LlamaForCausalLM<V, H, HEADS, KV, FF, E, D>
{
    /// Reads a `LlamaConfig` `config.json`, checks it against this type and
    /// returns the settings the type leaves open.
    ///
    /// Checked: `vocab_size` = `V`, `hidden_size` = `H`,
    /// `num_attention_heads` = `HEADS`, `num_key_value_heads × head_dim` =
    /// `KV` (key/value heads default to the query heads), `intermediate_size`
    /// = `FF`, `hidden_act` = `"silu"`, no attention or MLP bias, plain
    /// rotary positions (no `rope_scaling`), `model_type` = `"llama"`. Read:
    /// `num_hidden_layers`, `rms_norm_eps`, `rope_theta` (top level, or in
    /// `rope_parameters` as `transformers` 5 writes it),
    /// `max_position_embeddings`, `tie_word_embeddings`,
    /// `attention_dropout`, `initializer_range`.
    ///
    /// # Errors
    /// As [`Bert::read_hf_config`].
    pub fn read_hf_config(path: impl AsRef<Path>) -> Result<LlamaConfig, ModelError> {
        let c = Config::read(path.as_ref())?;
        ModelType::llama(&c)?.check(&c, &[V, H, HEADS, KV, FF])?;
        let d = Self::config(c.usize("num_hidden_layers", 32)?);
        let rope_theta = match c.get("rope_parameters").and_then(|r| r.get("rope_theta")) {
            Some(theta) => theta.as_f64().ok_or_else(|| ModelError::ConfigFile {
                path: c.path().into(),
                what: format!("rope_parameters.rope_theta is {theta}, not a number"),
            })?,
            None => c.f64("rope_theta", d.rope_theta)?,
        };
        Ok(LlamaConfig {
            rms_norm_eps: c.f64("rms_norm_eps", d.rms_norm_eps)?,
            rope_theta,
            max_position_embeddings: c
                .usize("max_position_embeddings", d.max_position_embeddings)?,
            tie_word_embeddings: c.bool("tie_word_embeddings", d.tie_word_embeddings)?,
            attention_dropout: c.f64("attention_dropout", d.attention_dropout)?,
            initializer_range: c.f64("initializer_range", d.initializer_range)?,
            ..d
        })
    }

    /// Loads a Hugging Face Llama folder (`config.json`, checked against the
    /// type by [`LlamaForCausalLM::read_hf_config`]; `model.safetensors`,
    /// loaded strictly as [`LlamaForCausalLM::load_hf_state_dict`] does;
    /// `tokenizer.json`), in eval mode.
    ///
    /// ```no_run
    /// use forma::prelude::*;
    /// use forma_models::llama::TinyLlama;
    ///
    /// # fn main() -> Result<(), forma_models::ModelError> {
    /// let llama = TinyLlama::from_pretrained_dir("TinyLlama-1.1B-Chat-v1.0", &Cpu)?;
    /// println!("{:?}", llama.report.dropped);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`LlamaForCausalLM::read_hf_config`],
    /// [`LlamaForCausalLM::from_safetensors`] and [`load_tokenizer`].
    pub fn from_pretrained_dir(
        dir: impl AsRef<Path>,
        device: &D,
    ) -> Result<Pretrained<Self>, ModelError> {
        load_folder(
            dir.as_ref(),
            Self::read_hf_config,
            |c| Self::new(c, device, &mut Rng::seed_from(0)),
            Self::load_hf_state_dict,
        )
    }
}

impl<
        const IMG: usize,
        const PATCH: usize,
        const CH: usize,
        const H: usize,
        const HEADS: usize,
        const MLP: usize,
        const N: usize,
        E: Float,
        D: Device<E>,
    > ViTForImageClassification<IMG, PATCH, CH, H, HEADS, MLP, N, E, D>
{
    /// Reads a `ViTConfig` `config.json`, checks it against this type and
    /// returns the settings the type leaves open.
    ///
    /// Checked: `image_size` = `IMG`, `patch_size` = `PATCH`,
    /// `num_channels` = `CH`, `hidden_size` = `H`, `num_attention_heads` =
    /// `HEADS`, `intermediate_size` = `MLP`, the number of labels
    /// (`num_labels`, or the size of `id2label`) = `N`, `hidden_act` =
    /// `"gelu"` (the exact GELU), `qkv_bias` = true, `model_type` =
    /// `"vit"`. Read: `num_hidden_layers`, `layer_norm_eps`,
    /// `hidden_dropout_prob`, `attention_probs_dropout_prob`,
    /// `initializer_range`.
    ///
    /// # Errors
    /// As [`Bert::read_hf_config`] (an `image_size` or `patch_size` given
    /// as a pair is refused as not a count: the model takes square images).
    pub fn read_hf_config(path: impl AsRef<Path>) -> Result<ViTConfig, ModelError> {
        let c = Config::read(path.as_ref())?;
        ModelType::vit(&c)?.check(&c, &[IMG, PATCH, CH, H, HEADS, MLP, N])?;
        Ok(encoder_settings!(&c, ViTConfig, ViTConfig::vit_base()))
    }

    /// Loads a Hugging Face ViT folder: `config.json`, checked against the
    /// type ([`ViTForImageClassification::read_hf_config`]), and
    /// `model.safetensors`, loaded strictly as
    /// [`ViTForImageClassification::load_hf_state_dict`] does. The model is
    /// in eval mode. (The folder's `preprocessor_config.json`, the image
    /// resizing and normalisation, is not read: the model takes the
    /// processed `pixel_values`.)
    ///
    /// ```no_run
    /// use forma::prelude::*;
    /// use forma_models::vit::ViTBase16;
    ///
    /// # fn main() -> Result<(), forma_models::ModelError> {
    /// let vit: ViTBase16 = ViTBase16::from_pretrained_dir("vit-base-patch16-224", &Cpu)?.model;
    /// # let _ = vit;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`ViTForImageClassification::read_hf_config`] and
    /// [`ViTForImageClassification::from_safetensors`]; a layer count in
    /// `config.json` that differs from the file's shows as
    /// [`ModelError::Load`] listing the missing or unexpected layers' keys.
    pub fn from_pretrained_dir(
        dir: impl AsRef<Path>,
        device: &D,
    ) -> Result<Loaded<Self>, ModelError> {
        let dir = dir.as_ref();
        let config = Self::read_hf_config(dir.join("config.json"))?;
        load_model(
            dir,
            &config,
            |c| Ok(Self::new(c, device, &mut Rng::seed_from(0))),
            Self::load_hf_state_dict,
        )
    }
}
