//! `hf_config!` (a `config.json` read when the test is built) and the
//! run-time readers it shares its reading with, on the tiny models' config
//! files the fixture generators wrote with `transformers`
//! (`tools/gen_text_fixtures.py`, `tools/gen_llama_fixtures.py`).

mod common;

use forma::prelude::*;
use forma_models::bert::Bert;
use forma_models::gpt2::Gpt2LMHeadModel;
use forma_models::llama::LlamaForCausalLM;
use forma_models::vit::ViTForImageClassification;
use forma_models::{hf_config, ModelError};
use std::marker::PhantomData;

// Paths are relative to this file, as `include_str!`'s are.
hf_config!(
    /// The tiny BERT folder's model.
    type TextBert = "../../../tools/fixtures/models/bert_text/config.json";
);
hf_config!(type TextGpt2 = "../../../tools/fixtures/models/gpt2_text/config.json";);
hf_config!(pub(crate) type TinyLlama = "../../../tools/fixtures/models/llama_tiny.config.json";);
hf_config!(type MhaLlama = "../../../tools/fixtures/models/llama_mha.config.json";);
hf_config!(type TinyVit = "../../../tools/fixtures/models/vit_tiny_config.json";);
hf_config!(type TextBertOf<E, D> = "../../../tools/fixtures/models/bert_text/config.json";);

/// Compiles only when `A` and `B` are the same type.
fn same_type<A>(_: PhantomData<A>, _: PhantomData<A>) {}

#[test]
fn the_macro_writes_the_type_with_derived_sizes_computed() {
    // BertConfig: vocab 143, hidden 32, 4 heads, FFN 37, 40 positions, 2 token types.
    same_type(
        PhantomData::<TextBert>,
        PhantomData::<Bert<143, 32, 4, 37, 40, 2>>,
    );
    // GPT2Config: QKV = 3 × n_embd = 96 and FF = n_inner (null) = 4 × 32.
    same_type(
        PhantomData::<TextGpt2>,
        PhantomData::<Gpt2LMHeadModel<320, 64, 32, 96, 4, 128>>,
    );
    // LlamaConfig: KV = 2 key/value heads × head_dim 16.
    same_type(
        PhantomData::<TinyLlama>,
        PhantomData::<LlamaForCausalLM<256, 64, 4, 32, 128>>,
    );
    same_type(
        PhantomData::<MhaLlama>,
        PhantomData::<LlamaForCausalLM<128, 32, 4, 32, 48>>,
    );
    // ViTConfig: the classes are the labels of `id2label`.
    same_type(
        PhantomData::<TinyVit>,
        PhantomData::<ViTForImageClassification<20, 4, 3, 32, 4, 64, 5>>,
    );
    // With parameters, the element type and device are left open.
    same_type(
        PhantomData::<TextBertOf<f64, Cpu>>,
        PhantomData::<Bert<143, 32, 4, 37, 40, 2, f64, Cpu>>,
    );
}

#[test]
fn the_alias_loads_its_folder() {
    let bert = TextBert::from_pretrained_dir(common::fixture("bert_text"), &Cpu).unwrap();
    assert_eq!(bert.model.encoder.layer.len(), 2);
    let gpt2 = TextGpt2::from_pretrained_dir(common::fixture("gpt2_text"), &Cpu).unwrap();
    assert_eq!(gpt2.model.transformer.h.len(), 2);
}

#[test]
fn llama_config_is_read_into_the_run_time_settings() {
    let tiny = TinyLlama::read_hf_config(common::fixture("llama_tiny.config.json")).unwrap();
    assert_eq!(
        (
            tiny.num_hidden_layers,
            tiny.num_key_value_heads,
            tiny.rms_norm_eps
        ),
        (2, 2, 1e-5)
    );
    assert_eq!(
        (tiny.rope_theta, tiny.max_position_embeddings),
        (10000.0, 64)
    );
    assert!(!tiny.tie_word_embeddings);
    // Read from `rope_parameters`, as transformers 5 writes it.
    let mha = MhaLlama::read_hf_config(common::fixture("llama_mha.config.json")).unwrap();
    assert_eq!(
        (mha.num_hidden_layers, mha.rope_theta, mha.rms_norm_eps),
        (1, 500000.0, 1e-6)
    );
    assert!(mha.tie_word_embeddings);
    // The weights the generator saved load into the model the config builds.
    let mut llama = MhaLlama::new(&mha, &Cpu, &mut Rng::seed_from(0)).unwrap();
    llama
        .load_hf_state_dict(common::fixture_file("llama_mha.safetensors"))
        .unwrap();
}

#[test]
fn a_size_that_differs_names_the_type_the_file_describes() {
    // Two key/value heads of 16 in the file, one in the type.
    type OneKvHead = LlamaForCausalLM<256, 64, 4, 16, 128>;
    let err = OneKvHead::read_hf_config(common::fixture("llama_tiny.config.json")).unwrap_err();
    let ModelError::ConfigMismatch {
        field,
        found,
        expected,
        describes,
        ..
    } = &err
    else {
        panic!("expected a config mismatch, got {err:?}");
    };
    assert_eq!(
        (field.as_str(), found.as_str(), expected.as_str()),
        ("num_key_value_heads × head_dim", "32", "16")
    );
    assert_eq!(
        describes.as_deref(),
        Some("LlamaForCausalLM<256, 64, 4, 32, 128>")
    );
    assert!(
        err.to_string().ends_with(
            "llama_tiny.config.json: the file has num_key_value_heads × head_dim = 32, \
             the type has 16 (the file describes `LlamaForCausalLM<256, 64, 4, 32, 128>`)"
        ),
        "{err}"
    );
}
