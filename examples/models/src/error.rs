//! [`ModelError`]: why loading, running or sampling a model failed.

use forma::nn::state::{CheckpointError, LoadError};

/// Why a model could not be loaded or run. A failed load leaves no
/// half-built model behind.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The checkpoint file could not be read (it names the file). Boxed,
    /// like [`ModelError::Load`]'s lists, to keep results small.
    #[error(transparent)]
    Checkpoint(Box<CheckpointError>),
    /// The checkpoint's tensors do not fit the model: every missing,
    /// unexpected and mismatched key is listed.
    #[error("{path}: {source}")]
    Load {
        /// The file, or `<state_dict>` for an in-memory load.
        path: String,
        /// What did not fit.
        source: Box<LoadError>,
    },
    /// A checkpoint holds an `lm_head.weight` that differs from the token
    /// embedding (GPT-2's `transformer.wte.weight`, Llama's
    /// `model.embed_tokens.weight`) while the model ties its head to the
    /// embedding (GPT-2 always, Llama with `tie_word_embeddings`), so
    /// loading it would silently drop the head.
    #[error("lm_head.weight differs from the token embedding, but the head is tied to the token embedding")]
    UntiedHead,
    /// The checkpoint holds no transformer layer.
    #[error("the checkpoint holds no {0} layer")]
    NoLayers(&'static str),
    /// A sequence is longer than the model's position table.
    #[error("{model}: {len} positions do not fit the {max} of the position table")]
    SequenceTooLong {
        /// The model.
        model: &'static str,
        /// The positions asked for (cached ones included).
        len: usize,
        /// The table's size.
        max: usize,
    },
    /// Inputs of the wrong sizes (e.g. a mask whose shape differs from the ids').
    #[error("{model}: {what}")]
    Input {
        /// The model.
        model: &'static str,
        /// What is wrong.
        what: String,
    },
    /// A configuration that does not fit the model's type (a size other
    /// than the type's parameter) or holds a setting that means nothing.
    #[error("{model}: the config's {field} {what}")]
    Config {
        /// The model.
        model: &'static str,
        /// The configuration field, as Hugging Face's config names it.
        field: &'static str,
        /// What is wrong with its value.
        what: String,
    },
    /// Sampling settings that mean nothing (`k = 0`, a temperature that is
    /// not positive, an empty prompt).
    #[error("invalid generation settings: {0}")]
    Sampling(String),
    /// A model folder's `config.json` could not be read, or is not a JSON
    /// object with the fields this model needs (it names the file).
    #[error("{path}: {what}")]
    ConfigFile {
        /// The `config.json` file.
        path: String,
        /// What is wrong.
        what: String,
    },
    /// A model folder's `config.json` describes a model that the Rust type
    /// cannot hold: a size that differs from the type's const generics, or
    /// a setting (activation, position embedding) it does not implement.
    #[error(
        "{path}: the file has {field} = {found}, the type has {expected}{}",
        describes.as_ref().map(|ty| format!(" (the file describes `{ty}`)")).unwrap_or_default()
    )]
    ConfigMismatch {
        /// The `config.json` file.
        path: String,
        /// The field, in Hugging Face's spelling (`n_embd`, `hidden_act`).
        field: String,
        /// The file's value, as JSON.
        found: String,
        /// What the type needs.
        expected: String,
        /// The type the file describes (`Bert<143, 32, 4, 37, 40, 2>`),
        /// when only the sizes differ: what to write instead.
        describes: Option<String>,
    },
    /// Hugging Face's `tokenizers` failed: a `tokenizer.json` that cannot be
    /// read, a text it cannot encode, ids it cannot decode.
    #[error("{context}: {source}")]
    Tokenizer {
        /// What was being done (the file, or `encoding 3 texts`).
        context: String,
        /// The tokenizer's error.
        source: tokenizers::Error,
    },
    /// A tensor operation failed (a token id outside the vocabulary, a
    /// device error).
    #[error(transparent)]
    Tensor(#[from] forma::Error),
}

/// A model error as the tensor error `Forward::try_forward` returns: a
/// tensor error as it is, the others as an invalid argument of the model.
impl From<ModelError> for forma::Error {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Tensor(e) => e,
            ModelError::SequenceTooLong { model, .. }
            | ModelError::Input { model, .. }
            | ModelError::Config { model, .. } => forma::Error::invalid(model, e.to_string()),
            other => forma::Error::invalid("model", other.to_string()),
        }
    }
}

impl ModelError {
    /// A [`ModelError::Load`] naming `path` as the file that did not fit;
    /// other errors as they are.
    pub(crate) fn in_file(self, path: &std::path::Path) -> Self {
        match self {
            ModelError::Load { source, .. } => ModelError::Load {
                path: path.display().to_string(),
                source,
            },
            e => e,
        }
    }
}

impl From<CheckpointError> for ModelError {
    fn from(e: CheckpointError) -> Self {
        ModelError::Checkpoint(Box::new(e))
    }
}

impl From<forma_models_config::ConfigError> for ModelError {
    fn from(e: forma_models_config::ConfigError) -> Self {
        use forma_models_config::ConfigError;
        match e {
            ConfigError::File { path, what } => ModelError::ConfigFile { path, what },
            ConfigError::Mismatch {
                path,
                field,
                found,
                expected,
                describes,
            } => ModelError::ConfigMismatch {
                path,
                field,
                found,
                expected,
                describes,
            },
        }
    }
}
