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
//!   cache, and greedy / top-k generation ([`gpt2::Gpt2Small`]).
//!
//! ```no_run
//! use forma::prelude::*;
//! use forma_models::bert::MiniLmL6;
//! use forma_models::gpt2::{Gpt2Small, Sampling};
//!
//! # fn main() -> Result<(), forma_models::ModelError> {
//! let minilm = MiniLmL6::from_safetensors("all-MiniLM-L6-v2/model.safetensors", &Cpu)?;
//! let ids = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![101, 7592, 2088, 102], (Dyn(1), Dyn(4)))?;
//! let mask = Tensor::<(Dyn, Dyn), i64>::ones_with((Dyn(1), Dyn(4)));
//! let embedding = minilm.sentence_embeddings(&ids, &mask)?; // [1, 384], unit length
//!
//! let gpt2 = Gpt2Small::from_safetensors("gpt2/model.safetensors", &Cpu)?;
//! let tokens = gpt2.generate(&[15496, 11, 616, 1438, 318], 20, Sampling::Greedy, &mut Rng::seed_from(0))?;
//! # let _ = (embedding, tokens);
//! # Ok(())
//! # }
//! ```
//!
//! Tokenisation is not part of this crate: the models take token ids.

pub mod bert;
mod error;
pub mod gpt2;
mod util;

pub use error::ModelError;

/// What loading a Hugging Face checkpoint set aside, beyond a strict load's
/// checks ([`bert::Bert::load_hf_state_dict`],
/// [`gpt2::Gpt2LMHeadModel::load_hf_state_dict`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HfLoadReport {
    /// Keys of the file that are not weights of `BertModel`/`GPT2Model` and
    /// were dropped: buffers older `transformers` saved
    /// (`embeddings.position_ids`, GPT-2's `attn.bias`/`attn.masked_bias`),
    /// pre-training heads (`cls.*`), a tied `lm_head.weight` equal to the
    /// embedding.
    pub dropped: Vec<String>,
    /// The prefix that was stripped (`bert.`) or added (`transformer.`), if any.
    pub prefix: Option<String>,
}
