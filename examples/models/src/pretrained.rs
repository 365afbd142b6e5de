//! Hugging Face model folders in one call: `config.json`,
//! `model.safetensors` and `tokenizer.json`, as `from_pretrained(path)`
//! reads them ([`Bert::from_pretrained_dir`],
//! [`Gpt2LMHeadModel::from_pretrained_dir`],
//! [`ViTForImageClassification::from_pretrained_dir`], which has no
//! tokenizer).
//!
//! The sizes that shape the weights are the Rust type's const generics, so
//! `config.json` is checked against the type rather than obeyed: a size
//! that differs, or a setting the model does not implement (another
//! activation, relative positions), is refused with
//! [`ModelError::ConfigMismatch`] naming the field and both values. What
//! the type leaves open (the layer count, LayerNorm eps, dropout rates) is
//! read from the file. A field the file leaves out takes `transformers`'
//! default for that config class, as `from_pretrained` does.

use crate::bert::{Bert, BertConfig};
use crate::gpt2::{Gpt2Config, Gpt2LMHeadModel};
use crate::text::{load_tokenizer, Tokenizer};
use crate::vit::{ViTConfig, ViTForImageClassification};
use crate::{HfLoadReport, Loaded, ModelError};
use forma::core::device::Device;
use forma::prelude::*;
use serde_json::{Map, Value};
use std::path::Path;

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

/// A parsed `config.json`, with the file's name for messages.
struct HfConfig {
    path: String,
    fields: Map<String, Value>,
}

impl HfConfig {
    fn read(path: &Path) -> Result<Self, ModelError> {
        let shown = path.display().to_string();
        let config = |what: String| ModelError::ConfigFile {
            path: shown.clone(),
            what,
        };
        let text = std::fs::read_to_string(path).map_err(|e| config(e.to_string()))?;
        match serde_json::from_str(&text) {
            Ok(Value::Object(fields)) => Ok(HfConfig {
                path: shown,
                fields,
            }),
            Ok(_) => Err(config("not a JSON object".into())),
            Err(e) => Err(config(format!("not JSON: {e}"))),
        }
    }

    /// The field, or `None` when the file leaves it out or sets it to null
    /// (both mean the class default in `transformers`).
    fn get(&self, field: &str) -> Option<&Value> {
        self.fields.get(field).filter(|v| !v.is_null())
    }

    fn wrong_type(&self, field: &str, want: &str) -> ModelError {
        ModelError::ConfigFile {
            path: self.path.clone(),
            what: format!("{field} is {}, not {want}", self.fields[field]),
        }
    }

    fn usize(&self, field: &str, default: usize) -> Result<usize, ModelError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| self.wrong_type(field, "a count")),
        }
    }

    fn f64(&self, field: &str, default: f64) -> Result<f64, ModelError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.wrong_type(field, "a number")),
        }
    }

    /// Checks a size the type fixes.
    fn expect_size(&self, field: &str, default: usize, expected: usize) -> Result<(), ModelError> {
        let found = self.usize(field, default)?;
        if found == expected {
            return Ok(());
        }
        Err(self.mismatch(field, found.to_string(), expected.to_string()))
    }

    /// Checks a setting the model implements in one of `allowed` ways (the
    /// first is named in the message).
    fn expect_value(
        &self,
        field: &str,
        default: Value,
        allowed: &[Value],
    ) -> Result<(), ModelError> {
        let found = self.get(field).cloned().unwrap_or(default);
        if allowed.contains(&found) {
            return Ok(());
        }
        Err(self.mismatch(field, found.to_string(), allowed[0].to_string()))
    }

    /// Checks the number of classes, `num_labels`: the field if the file
    /// has it, else the size of `id2label` (what `save_pretrained` writes),
    /// else `transformers`' default 2.
    fn expect_labels(&self, expected: usize) -> Result<(), ModelError> {
        let found = match (self.get("num_labels"), self.get("id2label")) {
            (Some(_), _) => self.usize("num_labels", 2)?,
            (None, Some(Value::Object(labels))) => labels.len(),
            (None, Some(_)) => return Err(self.wrong_type("id2label", "an object")),
            (None, None) => 2,
        };
        if found == expected {
            return Ok(());
        }
        Err(self.mismatch("num_labels", found.to_string(), expected.to_string()))
    }

    fn mismatch(&self, field: &str, found: String, expected: String) -> ModelError {
        ModelError::ConfigMismatch {
            path: self.path.clone(),
            field: field.into(),
            found,
            expected,
        }
    }
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
        let c = HfConfig::read(path.as_ref())?;
        c.expect_value("model_type", "bert".into(), &["bert".into()])?;
        c.expect_size("vocab_size", 30522, V)?;
        c.expect_size("hidden_size", 768, H)?;
        c.expect_size("num_attention_heads", 12, HEADS)?;
        c.expect_size("intermediate_size", 3072, FFN)?;
        c.expect_size("max_position_embeddings", 512, P)?;
        c.expect_size("type_vocab_size", 2, TV)?;
        c.expect_value("hidden_act", "gelu".into(), &["gelu".into()])?;
        c.expect_value(
            "position_embedding_type",
            "absolute".into(),
            &["absolute".into()],
        )?;
        let defaults = BertConfig::with_layers(12);
        Ok(BertConfig {
            num_hidden_layers: c.usize("num_hidden_layers", defaults.num_hidden_layers)?,
            layer_norm_eps: c.f64("layer_norm_eps", defaults.layer_norm_eps)?,
            hidden_dropout_prob: c.f64("hidden_dropout_prob", defaults.hidden_dropout_prob)?,
            attention_probs_dropout_prob: c.f64(
                "attention_probs_dropout_prob",
                defaults.attention_probs_dropout_prob,
            )?,
            initializer_range: c.f64("initializer_range", defaults.initializer_range)?,
        })
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
        let dir = dir.as_ref();
        let config = Self::read_hf_config(dir.join("config.json"))?;
        let tokenizer = load_tokenizer(dir.join("tokenizer.json"))?;
        let (sd, path) = read_weights(dir)?;
        let mut model = Self::new(&config, device, &mut Rng::seed_from(0));
        let report = model.load_hf_state_dict(sd).map_err(in_file(path))?;
        model.eval();
        Ok(Pretrained {
            model,
            tokenizer,
            report,
        })
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
        let c = HfConfig::read(path.as_ref())?;
        c.expect_value("model_type", "gpt2".into(), &["gpt2".into()])?;
        c.expect_size("vocab_size", 50257, V)?;
        c.expect_size("n_positions", 1024, CTX)?;
        c.expect_size("n_embd", 768, H)?;
        c.expect_size("n_head", 12, HEADS)?;
        let n_embd = c.usize("n_embd", 768)?;
        c.expect_size("n_inner", 4 * n_embd, FF)?;
        c.expect_value(
            "activation_function",
            "gelu_new".into(),
            &["gelu_new".into(), "gelu_pytorch_tanh".into()],
        )?;
        c.expect_value("scale_attn_weights", true.into(), &[true.into()])?;
        c.expect_value(
            "scale_attn_by_inverse_layer_idx",
            false.into(),
            &[false.into()],
        )?;
        c.expect_value("add_cross_attention", false.into(), &[false.into()])?;
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
        let dir = dir.as_ref();
        let config = Self::read_hf_config(dir.join("config.json"))?;
        let tokenizer = load_tokenizer(dir.join("tokenizer.json"))?;
        let (sd, path) = read_weights(dir)?;
        let mut model = Self::new(&config, device, &mut Rng::seed_from(0));
        let report = model.load_hf_state_dict(sd).map_err(in_file(path))?;
        model.eval();
        Ok(Pretrained {
            model,
            tokenizer,
            report,
        })
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
        let c = HfConfig::read(path.as_ref())?;
        c.expect_value("model_type", "vit".into(), &["vit".into()])?;
        c.expect_size("image_size", 224, IMG)?;
        c.expect_size("patch_size", 16, PATCH)?;
        c.expect_size("num_channels", 3, CH)?;
        c.expect_size("hidden_size", 768, H)?;
        c.expect_size("num_attention_heads", 12, HEADS)?;
        c.expect_size("intermediate_size", 3072, MLP)?;
        c.expect_labels(N)?;
        c.expect_value("hidden_act", "gelu".into(), &["gelu".into()])?;
        c.expect_value("qkv_bias", true.into(), &[true.into()])?;
        let defaults = ViTConfig::vit_base();
        Ok(ViTConfig {
            num_hidden_layers: c.usize("num_hidden_layers", defaults.num_hidden_layers)?,
            layer_norm_eps: c.f64("layer_norm_eps", defaults.layer_norm_eps)?,
            hidden_dropout_prob: c.f64("hidden_dropout_prob", defaults.hidden_dropout_prob)?,
            attention_probs_dropout_prob: c.f64(
                "attention_probs_dropout_prob",
                defaults.attention_probs_dropout_prob,
            )?,
            initializer_range: c.f64("initializer_range", defaults.initializer_range)?,
        })
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
        let (sd, path) = read_weights(dir)?;
        let mut model = Self::new(&config, device, &mut Rng::seed_from(0));
        let report = model.load_hf_state_dict(sd).map_err(in_file(path))?;
        Ok(Loaded::eval(model, report))
    }
}
