//! What a Hugging Face `config.json` says about a `forma-models` type.
//!
//! A model's sizes are its Rust type's const generics, so a config file is
//! matched rather than obeyed: [`ModelType::of`] reads which type a file
//! describes (`bert::Bert<30522, 384, 12, 1536, 512, 2>` for
//! all-MiniLM-L6-v2), computing every derived size (GPT-2's `3 × n_embd`,
//! Llama's key/value width `num_key_value_heads × head_dim`) and refusing
//! settings the models do not implement (another activation, rope
//! scaling). The run-time loaders (`from_pretrained_dir`) compare it with
//! the type they are called on ([`ModelType::check`]); `hf_config!` writes
//! it as a type alias when the program is built. One reading serves both,
//! so a file the macro accepts is one the loader accepts for the type the
//! macro wrote.
//!
//! A field the file leaves out (or sets to null) takes `transformers`'
//! default for that config class, as `from_pretrained` does.

use serde_json::{Map, Value};
use std::fmt;
use std::path::Path;

/// Why a config file does not give the model asked for.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigError {
    /// The file cannot be read, is not a JSON object, or a field has the
    /// wrong JSON type.
    File {
        /// The file, as given.
        path: String,
        /// What is wrong.
        what: String,
    },
    /// A field does not fit: a setting no model implements (another
    /// activation), or a size other than the type's.
    Mismatch {
        /// The file, as given.
        path: String,
        /// The field in Hugging Face's spelling (`n_embd`), or the
        /// arithmetic on fields a derived size comes from (`3 × n_embd`).
        field: String,
        /// The file's value, as JSON.
        found: String,
        /// What the type needs.
        expected: String,
        /// The type the file describes (`Bert<143, 32, 4, 37, 40, 2>`),
        /// when only the sizes differ: what to write instead.
        describes: Option<String>,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::File { path, what } => write!(f, "{path}: {what}"),
            ConfigError::Mismatch {
                path,
                field,
                found,
                expected,
                describes,
            } => {
                write!(
                    f,
                    "{path}: the file has {field} = {found}, the type has {expected}"
                )?;
                match describes {
                    Some(ty) => write!(f, " (the file describes `{ty}`)"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// A parsed `config.json`, with the file's name for messages.
#[derive(Clone, Debug)]
pub struct Config {
    path: String,
    fields: Map<String, Value>,
}

impl Config {
    /// Reads and parses a `config.json`.
    ///
    /// # Errors
    /// [`ConfigError::File`] when the file cannot be read or is not a JSON
    /// object.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: shown.clone(),
            what: e.to_string(),
        })?;
        Self::parse(&text, shown)
    }

    /// Parses the text of a `config.json`; `path` names it in messages.
    ///
    /// # Errors
    /// [`ConfigError::File`] when the text is not a JSON object.
    pub fn parse(text: &str, path: impl Into<String>) -> Result<Self, ConfigError> {
        let path = path.into();
        let what = match serde_json::from_str(text) {
            Ok(Value::Object(fields)) => return Ok(Config { path, fields }),
            Ok(_) => "not a JSON object".to_string(),
            Err(e) => format!("not JSON: {e}"),
        };
        Err(ConfigError::File { path, what })
    }

    /// The file's name, as given.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The field, or `None` when the file leaves it out or sets it to null
    /// (both mean the class default in `transformers`).
    pub fn get(&self, field: &str) -> Option<&Value> {
        self.fields.get(field).filter(|v| !v.is_null())
    }

    fn wrong_type(&self, field: &str, want: &str) -> ConfigError {
        ConfigError::File {
            path: self.path.clone(),
            what: format!("{field} is {}, not {want}", self.fields[field]),
        }
    }

    /// A count (a non-negative integer), or `default` when absent.
    ///
    /// # Errors
    /// [`ConfigError::File`] when the field is not a count.
    pub fn usize(&self, field: &str, default: usize) -> Result<usize, ConfigError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| self.wrong_type(field, "a count")),
        }
    }

    /// A number, or `default` when absent.
    ///
    /// # Errors
    /// [`ConfigError::File`] when the field is not a number.
    pub fn f64(&self, field: &str, default: f64) -> Result<f64, ConfigError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.wrong_type(field, "a number")),
        }
    }

    /// A boolean, or `default` when absent.
    ///
    /// # Errors
    /// [`ConfigError::File`] when the field is not a boolean.
    pub fn bool(&self, field: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.wrong_type(field, "a boolean")),
        }
    }

    /// Checks a setting the model implements in one of `allowed` ways (the
    /// first is named in the message).
    ///
    /// # Errors
    /// [`ConfigError::Mismatch`] naming the field and both values.
    pub fn expect_value(
        &self,
        field: &str,
        default: Value,
        allowed: &[Value],
    ) -> Result<(), ConfigError> {
        let found = self.get(field).cloned().unwrap_or(default);
        if allowed.contains(&found) {
            return Ok(());
        }
        Err(self.mismatch(field, found.to_string(), allowed[0].to_string(), None))
    }

    fn mismatch(
        &self,
        field: &str,
        found: String,
        expected: String,
        describes: Option<String>,
    ) -> ConfigError {
        ConfigError::Mismatch {
            path: self.path.clone(),
            field: field.into(),
            found,
            expected,
            describes,
        }
    }
}

/// One const-generic size of a model type and where the file has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeArg {
    /// The type's parameter (`H`).
    pub param: &'static str,
    /// The field it is read from (`hidden_size`), or the arithmetic on
    /// fields it is computed by (`3 × n_embd`).
    pub field: String,
    /// Its value for this file.
    pub value: usize,
}

/// The `forma-models` type a config file describes: the type's path in the
/// crate and its const-generic sizes, in the type's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelType {
    /// The module and type, relative to the crate root (`bert::Bert`).
    pub path: &'static str,
    /// The sizes, in the order of the type's const generics.
    pub args: Vec<TypeArg>,
}

impl ModelType {
    /// The type a config file describes, chosen by its `model_type` (`bert`,
    /// `gpt2`, `llama`).
    ///
    /// # Errors
    /// [`ConfigError::Mismatch`] for a `model_type` without a Forma model or
    /// a setting the model does not implement; [`ConfigError::File`] for a
    /// field of the wrong JSON type.
    pub fn of(config: &Config) -> Result<Self, ConfigError> {
        let kind = config.get("model_type").cloned().unwrap_or(Value::Null);
        match kind.as_str() {
            Some("bert") => Self::bert(config),
            Some("gpt2") => Self::gpt2(config),
            Some("llama") => Self::llama(config),
            Some("vit") => Self::vit(config),
            _ => Err(config.mismatch(
                "model_type",
                kind.to_string(),
                "one of \"bert\", \"gpt2\", \"llama\", \"vit\"".into(),
                None,
            )),
        }
    }

    /// `bert::Bert<V, H, HEADS, FFN, P, TV>` from a `BertConfig`: checks
    /// `model_type` = `"bert"`, `hidden_act` = `"gelu"` (the exact GELU)
    /// and `position_embedding_type` = `"absolute"`.
    ///
    /// # Errors
    /// As [`ModelType::of`].
    pub fn bert(c: &Config) -> Result<Self, ConfigError> {
        c.expect_value("model_type", "bert".into(), &["bert".into()])?;
        c.expect_value("hidden_act", "gelu".into(), &["gelu".into()])?;
        c.expect_value(
            "position_embedding_type",
            "absolute".into(),
            &["absolute".into()],
        )?;
        Ok(ModelType {
            path: "bert::Bert",
            args: vec![
                field(c, "V", "vocab_size", 30522)?,
                field(c, "H", "hidden_size", 768)?,
                field(c, "HEADS", "num_attention_heads", 12)?,
                field(c, "FFN", "intermediate_size", 3072)?,
                field(c, "P", "max_position_embeddings", 512)?,
                field(c, "TV", "type_vocab_size", 2)?,
            ],
        })
    }

    /// `gpt2::Gpt2LMHeadModel<V, CTX, H, QKV, HEADS, FF>` from a
    /// `GPT2Config`: `QKV` is `3 × n_embd`, `FF` is `n_inner` (null means
    /// `4 × n_embd`). Checks `activation_function` = `"gelu_new"` (or
    /// `"gelu_pytorch_tanh"`, the same function), `scale_attn_weights` =
    /// true, `scale_attn_by_inverse_layer_idx` = false and
    /// `add_cross_attention` = false.
    ///
    /// # Errors
    /// As [`ModelType::of`].
    pub fn gpt2(c: &Config) -> Result<Self, ConfigError> {
        c.expect_value("model_type", "gpt2".into(), &["gpt2".into()])?;
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
        let n_embd = c.usize("n_embd", 768)?;
        let ff = match c.get("n_inner") {
            Some(_) => field(c, "FF", "n_inner", 0)?,
            None => derived("FF", "4 × n_embd", 4 * n_embd),
        };
        Ok(ModelType {
            path: "gpt2::Gpt2LMHeadModel",
            args: vec![
                field(c, "V", "vocab_size", 50257)?,
                field(c, "CTX", "n_positions", 1024)?,
                field(c, "H", "n_embd", 768)?,
                derived("QKV", "3 × n_embd", 3 * n_embd),
                field(c, "HEADS", "n_head", 12)?,
                ff,
            ],
        })
    }

    /// `llama::LlamaForCausalLM<V, H, HEADS, KV, FF>` from a `LlamaConfig`:
    /// `KV` is `num_key_value_heads × head_dim` (the key/value heads default
    /// to the query heads; `head_dim` is `hidden_size / num_attention_heads`,
    /// and a file whose `head_dim` differs is refused). Checks `hidden_act`
    /// = `"silu"`, no `attention_bias`, no `mlp_bias`, `pretraining_tp` = 1
    /// and plain rotary positions (`rope_scaling` null, `rope_type`
    /// `"default"`).
    ///
    /// # Errors
    /// As [`ModelType::of`].
    pub fn llama(c: &Config) -> Result<Self, ConfigError> {
        c.expect_value("model_type", "llama".into(), &["llama".into()])?;
        c.expect_value("hidden_act", "silu".into(), &["silu".into()])?;
        c.expect_value("attention_bias", false.into(), &[false.into()])?;
        c.expect_value("mlp_bias", false.into(), &[false.into()])?;
        c.expect_value("pretraining_tp", 1.into(), &[1.into()])?;
        c.expect_value("rope_scaling", Value::Null, &[Value::Null])?;
        if let Some(Value::Object(rope)) = c.get("rope_parameters") {
            let kind = rope.get("rope_type").cloned().unwrap_or(Value::Null);
            if kind != "default" && !kind.is_null() {
                return Err(c.mismatch(
                    "rope_parameters.rope_type",
                    kind.to_string(),
                    "\"default\"".into(),
                    None,
                ));
            }
        }
        let hidden = c.usize("hidden_size", 4096)?;
        let heads = c.usize("num_attention_heads", 32)?;
        let kv_heads = c.usize("num_key_value_heads", heads)?;
        if heads == 0 || hidden % heads != 0 {
            return Err(c.mismatch(
                "num_attention_heads",
                heads.to_string(),
                format!("a divisor of hidden_size = {hidden}"),
                None,
            ));
        }
        let head_dim = hidden / heads;
        let file_head_dim = c.usize("head_dim", head_dim)?;
        if file_head_dim != head_dim {
            return Err(c.mismatch(
                "head_dim",
                file_head_dim.to_string(),
                format!("{head_dim} (hidden_size / num_attention_heads)"),
                None,
            ));
        }
        Ok(ModelType {
            path: "llama::LlamaForCausalLM",
            args: vec![
                field(c, "V", "vocab_size", 32000)?,
                field(c, "H", "hidden_size", 4096)?,
                field(c, "HEADS", "num_attention_heads", 32)?,
                derived("KV", "num_key_value_heads × head_dim", kv_heads * head_dim),
                field(c, "FF", "intermediate_size", 11008)?,
            ],
        })
    }

    /// `vit::ViTForImageClassification<IMG, PATCH, CH, H, HEADS, MLP, N>`
    /// from a `ViTConfig`: `N` is `num_labels`, or the size of `id2label`
    /// (what `save_pretrained` writes), or `transformers`' default 2.
    /// Checks `hidden_act` = `"gelu"` (the exact GELU) and `qkv_bias` =
    /// true; an `image_size` or `patch_size` given as a pair is refused as
    /// not a count (the model takes square images).
    ///
    /// # Errors
    /// As [`ModelType::of`].
    pub fn vit(c: &Config) -> Result<Self, ConfigError> {
        c.expect_value("model_type", "vit".into(), &["vit".into()])?;
        c.expect_value("hidden_act", "gelu".into(), &["gelu".into()])?;
        c.expect_value("qkv_bias", true.into(), &[true.into()])?;
        let labels = match (c.get("num_labels"), c.get("id2label")) {
            (Some(_), _) => field(c, "N", "num_labels", 2)?,
            (None, Some(Value::Object(labels))) => derived("N", "len(id2label)", labels.len()),
            (None, Some(_)) => return Err(c.wrong_type("id2label", "an object")),
            (None, None) => derived("N", "num_labels", 2),
        };
        Ok(ModelType {
            path: "vit::ViTForImageClassification",
            args: vec![
                field(c, "IMG", "image_size", 224)?,
                field(c, "PATCH", "patch_size", 16)?,
                field(c, "CH", "num_channels", 3)?,
                field(c, "H", "hidden_size", 768)?,
                field(c, "HEADS", "num_attention_heads", 12)?,
                field(c, "MLP", "intermediate_size", 3072)?,
                labels,
            ],
        })
    }

    /// The type's name without its module (`Bert`).
    pub fn name(&self) -> &'static str {
        self.path.rsplit("::").next().unwrap_or(self.path)
    }

    /// The type as one writes it (`Bert<143, 32, 4, 37, 40, 2>`).
    pub fn written(&self) -> String {
        let sizes: Vec<String> = self.args.iter().map(|a| a.value.to_string()).collect();
        format!("{}<{}>", self.name(), sizes.join(", "))
    }

    /// Checks the file's sizes against a type's (`ours`, in the type's
    /// order).
    ///
    /// # Errors
    /// [`ConfigError::Mismatch`] for the first size that differs, naming
    /// its field, both values and the type the file describes.
    pub fn check(&self, config: &Config, ours: &[usize]) -> Result<(), ConfigError> {
        assert_eq!(ours.len(), self.args.len(), "{} sizes", self.path);
        match self.args.iter().zip(ours).find(|(a, &o)| a.value != o) {
            None => Ok(()),
            Some((arg, &o)) => Err(config.mismatch(
                &arg.field,
                arg.value.to_string(),
                o.to_string(),
                Some(self.written()),
            )),
        }
    }
}

/// A size read from one field.
fn field(
    c: &Config,
    param: &'static str,
    name: &str,
    default: usize,
) -> Result<TypeArg, ConfigError> {
    Ok(TypeArg {
        param,
        field: name.into(),
        value: c.usize(name, default)?,
    })
}

/// A size computed from fields.
fn derived(param: &'static str, how: &str, value: usize) -> TypeArg {
    TypeArg {
        param,
        field: how.into(),
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        Config::parse(text, "config.json").unwrap()
    }

    #[test]
    fn gpt2_sizes_are_derived_from_n_embd() {
        let c = parse(
            r#"{"model_type": "gpt2", "vocab_size": 320, "n_positions": 64, "n_embd": 32, "n_head": 4, "n_inner": null}"#,
        );
        let ty = ModelType::of(&c).unwrap();
        assert_eq!(ty.written(), "Gpt2LMHeadModel<320, 64, 32, 96, 4, 128>");
        let err = ty.check(&c, &[320, 64, 32, 90, 4, 128]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "config.json: the file has 3 × n_embd = 96, the type has 90 \
             (the file describes `Gpt2LMHeadModel<320, 64, 32, 96, 4, 128>`)"
        );
        assert!(ty.check(&c, &[320, 64, 32, 96, 4, 128]).is_ok());
    }

    #[test]
    fn llama_kv_width_counts_key_value_heads() {
        let c = parse(
            r#"{"model_type": "llama", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}"#,
        );
        assert_eq!(
            ModelType::of(&c).unwrap().written(),
            "LlamaForCausalLM<40, 16, 4, 8, 24>"
        );
        // Without num_key_value_heads, as many as the query heads.
        let c = parse(
            r#"{"model_type": "llama", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 4}"#,
        );
        assert_eq!(ModelType::of(&c).unwrap().args[3].value, 16);
    }

    #[test]
    fn vit_counts_its_labels() {
        let c = parse(
            r#"{"model_type": "vit", "image_size": 20, "patch_size": 4, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64, "id2label": {"0": "a", "1": "b", "2": "c"}}"#,
        );
        let ty = ModelType::of(&c).unwrap();
        assert_eq!(
            ty.written(),
            "ViTForImageClassification<20, 4, 3, 32, 4, 64, 3>"
        );
        assert_eq!(ty.args[6].field, "len(id2label)");
        let c = parse(r#"{"model_type": "vit", "image_size": [20, 20]}"#);
        assert_eq!(
            ModelType::of(&c).unwrap_err().to_string(),
            "config.json: image_size is [20,20], not a count"
        );
    }

    #[test]
    fn settings_without_a_model_are_refused_by_name() {
        let err = |text: &str| ModelType::of(&parse(text)).unwrap_err().to_string();
        assert_eq!(
            err(r#"{"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}"#),
            "config.json: the file has rope_scaling = {\"factor\":8.0,\"rope_type\":\"llama3\"}, the type has null"
        );
        assert_eq!(
            err(r#"{"model_type": "llama", "hidden_size": 16, "num_attention_heads": 4, "head_dim": 8}"#),
            "config.json: the file has head_dim = 8, the type has 4 (hidden_size / num_attention_heads)"
        );
        assert_eq!(
            err(r#"{"model_type": "t5"}"#),
            "config.json: the file has model_type = \"t5\", the type has one of \"bert\", \"gpt2\", \"llama\", \"vit\""
        );
        assert_eq!(
            err(r#"{"model_type": "bert", "hidden_size": "big"}"#),
            "config.json: hidden_size is \"big\", not a count"
        );
        assert!(matches!(
            Config::parse("[1]", "c.json"),
            Err(ConfigError::File { what, .. }) if what == "not a JSON object"
        ));
    }
}
