//! Real model layouts as typed Forma structs: a BERT encoder
//! ([`bert::Bert`], Hugging Face's `BertModel`) and a GPT-2 decoder
//! ([`gpt2::Gpt2LMHeadModel`], `GPT2LMHeadModel`) whose `state_dict` keys and
//! shapes are exactly `transformers`', so Hugging Face `model.safetensors`
//! files load with one call and Forma's saves load back into `transformers`.
//!
//! - [`bert`]: the encoder, its pooler, and sentence-transformers' sentence
//!   embeddings (mean pooling, L2 normalisation) for all-MiniLM-L6-v2
//!   ([`bert::MiniLmL6`]);
//! - [`gpt2`]: the decoder with its head tied to the token embedding, a KV
//!   cache, and greedy / top-k generation ([`gpt2::Gpt2Small`]);
//! - [`llama`]: a Llama decoder (`LlamaForCausalLM`: RMSNorm, rotary
//!   positions, SiLU-gated MLP, grouped-query attention, tied or untied
//!   head) with a KV cache and greedy / top-k generation
//!   ([`llama::TinyLlama`]);
//! - [`resnet`]: torchvision's ResNet-18 and ResNet-50 ([`resnet::ResNet18`],
//!   [`resnet::ResNet50`]) with torchvision's keys, and a fresh head for
//!   transfer learning.
//! - [`vit`]: a Vision Transformer classifier
//!   (`ViTForImageClassification`: patch convolution, class token, pre-norm
//!   layers) with the keys of Hugging Face's checkpoints
//!   ([`vit::ViTBase16`], google/vit-base-patch16-224).
//!
//! ```no_run
//! use forma::prelude::*;
//! use forma_models::bert::MiniLmL6;
//! use forma_models::gpt2::{Gpt2Small, Sampling};
//!
//! # fn main() -> Result<(), forma_models::ModelError> {
//! let minilm = MiniLmL6::from_safetensors("all-MiniLM-L6-v2/model.safetensors", &Cpu)?.model;
//! let ids = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![101, 7592, 2088, 102], (Dyn(1), Dyn(4)))?;
//! let mask = Tensor::<(Dyn, Dyn), i64>::ones_with((Dyn(1), Dyn(4)));
//! let embedding = minilm.sentence_embeddings(&ids, &mask)?; // [1, 384], unit length
//!
//! let gpt2 = Gpt2Small::from_safetensors("gpt2/model.safetensors", &Cpu)?.model;
//! let tokens = gpt2.generate(&[15496, 11, 616, 1438, 318], 20, Sampling::Greedy, &mut Rng::seed_from(0))?;
//! # let _ = (embedding, tokens);
//! # Ok(())
//! # }
//! ```
//!
//! The transformers return their intermediate results on request, like
//! `output_hidden_states=True, output_attentions=True` ([`Outputs`],
//! [`bert::Bert::run_with`], [`gpt2::Gpt2LMHeadModel::run_with`],
//! [`llama::LlamaForCausalLM::run_with`]); the two decoders share their
//! [`KvCache`], [`Sampling`] and [`CausalLmOutputs`]; and the one-call
//! loaders return what they set aside next to the model ([`Loaded`]).
//!
//! Text goes in and out through Hugging Face's own tokenizers
//! (`tokenizer.json`): [`text::SentenceEncoder`] turns strings into
//! sentence embeddings and [`text::TextGenerator`] a prompt into text, and
//! [`pretrained`] loads a Hugging Face model folder (`config.json`, checked
//! against the Rust type, `model.safetensors`, `tokenizer.json`) in one call.

pub mod bert;
mod decoder;
mod error;
pub mod gpt2;
pub mod llama;
pub mod pretrained;
pub mod resnet;
pub mod text;
mod util;
pub mod vit;

pub use decoder::{CausalLmOutputs, KvCache, Sampling};
pub use error::ModelError;

/// A type alias for the model a Hugging Face `config.json` describes, read
/// when the program is built.
///
/// ```text
/// forma_models::hf_config!(
///     /// all-MiniLM-L6-v2.
///     pub type MiniLm = "all-MiniLM-L6-v2/config.json";
/// );
/// // expands to
/// /// all-MiniLM-L6-v2.
/// pub type MiniLm = forma_models::bert::Bert<30522, 384, 12, 1536, 512, 2>;
///
/// let minilm = MiniLm::from_pretrained_dir("all-MiniLM-L6-v2", &Cpu)?;
/// ```
///
/// The alias is of `f32` on the CPU, as the model's own defaults are; one
/// with type parameters (`type MiniLm<E, D> = "..."`) leaves the element
/// type and device to its uses (`MiniLm<bf16, Cuda>`).
///
/// The path is relative to the source file the macro is written in, as
/// `include_str!`'s is, and the program is rebuilt when the file changes.
/// `model_type` picks the model ([`bert::Bert`], [`gpt2::Gpt2LMHeadModel`],
/// [`llama::LlamaForCausalLM`], [`vit::ViTForImageClassification`]) and
/// the sizes its const generics, derived sizes computed (GPT-2's `QKV = 3 ×
/// n_embd` and `n_inner` null as `4 × n_embd`; Llama's `KV =
/// num_key_value_heads × head_dim`; ViT's classes the labels of
/// `id2label`), so none is
/// written by hand. A file that asks for what the model does not implement
/// (another activation, rope scaling, an unknown `model_type`) does not
/// compile, and the error names the field:
///
/// ```text
/// error: hf_config!: relu.json has hidden_act = "relu", which forma_models does not implement (it needs "gelu")
/// ```
///
/// The layer count, eps and dropout rates are not part of the type: the
/// alias's `from_pretrained_dir` (or `read_hf_config`) reads them from the
/// same file when the program runs, and checks the sizes again there, so a
/// file edited after the build is refused rather than misread.
pub use forma_models_macros::hf_config;

/// What loading a checkpoint set aside, beyond a strict load's checks
/// ([`bert::Bert::load_hf_state_dict`],
/// [`gpt2::Gpt2LMHeadModel::load_hf_state_dict`],
/// [`llama::LlamaForCausalLM::load_hf_state_dict`], and the one-call
/// loaders' [`Loaded::report`], ResNet's included), like the
/// `loading_info` of `from_pretrained(output_loading_info=True)`. The load
/// itself is strict, so nothing is missing: every weight of the model comes
/// from the file (a file that lacks one, or has a key left over after the
/// adjustments below, is refused with [`ModelError::Load`] naming every
/// such key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadInfo {
    /// Keys of the file that are not weights of the model and were dropped:
    /// buffers older `transformers` saved (`embeddings.position_ids`,
    /// GPT-2's `attn.bias`/`attn.masked_bias`, Llama's
    /// `rotary_emb.inv_freq`), pre-training heads (`cls.*`), a tied
    /// `lm_head.weight` equal to the embedding, a ResNet head replaced by a
    /// new one. Sorted.
    pub dropped: Vec<String>,
    /// The prefix that was stripped (`bert.`) or added (`transformer.`,
    /// `model.`), if any.
    pub prefix: Option<String>,
    /// Every key whose name that prefix changed, or that was renamed from
    /// a newer `transformers`' module names (ViT's, see
    /// [`vit::ViTForImageClassification::load_hf_state_dict`]), as (the
    /// file's name, the name it was loaded or dropped under), sorted. The
    /// names in [`LoadInfo::dropped`] are the second ones.
    pub renamed: Vec<(String, String)>,
}

/// [`LoadInfo`]'s first name, from when only Hugging Face checkpoints were
/// loaded.
pub type HfLoadReport = LoadInfo;

/// A model a one-call loader read from a file, with what the loader set
/// aside (`BertModel.from_pretrained(path, output_loading_info=True)`'s pair).
///
/// ```no_run
/// use forma::prelude::*;
/// use forma_models::bert::MiniLmL6;
///
/// # fn main() -> Result<(), forma_models::ModelError> {
/// let loaded = MiniLmL6::from_safetensors("all-MiniLM-L6-v2/model.safetensors", &Cpu)?;
/// println!("dropped {:?}", loaded.report.dropped);
/// let model = loaded.model;
/// # let _ = model;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Loaded<M> {
    /// The model, in eval mode.
    pub model: M,
    /// What was dropped or renamed on the way.
    pub report: LoadInfo,
}

impl<M: forma::nn::Module> Loaded<M> {
    /// `model`, put in eval mode, with `report`.
    pub(crate) fn eval(mut model: M, report: LoadInfo) -> Self {
        model.eval();
        Loaded { model, report }
    }
}

/// Which intermediate results a forward pass returns beside its output, like
/// Hugging Face's `output_hidden_states` and `output_attentions` arguments
/// (both off by default: then nothing extra is kept, and attention may run
/// fused, without materialising its probabilities).
///
/// ```
/// use forma_models::Outputs;
/// let only_attn = Outputs { output_attentions: true, ..Outputs::NONE };
/// assert_eq!(Outputs::default(), Outputs::NONE);
/// assert!(Outputs::ALL.output_hidden_states && only_attn.output_attentions);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Outputs {
    /// Return the hidden states: the embedding output, then each layer's
    /// (for GPT-2 the last one after the final norm, as `transformers` does).
    pub output_hidden_states: bool,
    /// Return each layer's attention probabilities `[batch, heads, query, key]`.
    pub output_attentions: bool,
}

impl Outputs {
    /// Nothing beside the output (the default).
    pub const NONE: Outputs = Outputs {
        output_hidden_states: false,
        output_attentions: false,
    };
    /// Hidden states and attentions.
    pub const ALL: Outputs = Outputs {
        output_hidden_states: true,
        output_attentions: true,
    };
}
