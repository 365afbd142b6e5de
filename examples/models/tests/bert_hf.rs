//! Forma's BERT against Hugging Face's `BertModel` (fixtures from
//! `tools/gen_model_fixtures.py`): a `save_pretrained` file loads with one
//! call and gives the same hidden states, pooler output and sentence
//! embeddings within 1e-4 (f32); older and `BertFor*` file layouts load too;
//! a wrong file is refused with every bad key named.

mod common;

use common::*;
use forma::nn::{Module, StateDict};
use forma::prelude::*;
use forma::TensorData;
use forma_models::ModelError;

const TOL: f32 = 1e-4;

fn hf_model() -> TinyBert {
    TinyBert::from_safetensors(fixture("bert_tiny.safetensors"), &Cpu).expect("load bert_tiny")
}

#[test]
fn hidden_states_and_pooler_match_transformers() {
    let bert = hf_model();
    assert!(!bert.is_training(), "a loaded model is in eval mode");
    assert_eq!(
        bert.encoder.layer.len(),
        2,
        "the layer count comes from the file"
    );
    let io = io();
    let out = bert
        .run(
            &ids(&io, "bert.input_ids"),
            Some(&ids(&io, "bert.token_type_ids")),
            Some(&ids(&io, "bert.attention_mask")),
        )
        .unwrap();
    assert_eq!(out.last_hidden_state.dims()[..], [2, 7, 32]);
    assert_close(
        "last_hidden_state",
        &out.last_hidden_state.to_vec(),
        &entry(&io, "bert.last_hidden_state").to_vec::<f32>(),
        TOL,
    );
    assert_close(
        "pooler_output",
        &out.pooler_output.to_vec(),
        &entry(&io, "bert.pooler_output").to_vec::<f32>(),
        TOL,
    );
}

#[test]
fn sentence_embeddings_match_sentence_transformers_pooling() {
    let bert = hf_model();
    let io = io();
    let emb = bert
        .sentence_embeddings(
            &ids(&io, "bert.input_ids"),
            &ids(&io, "bert.attention_mask"),
        )
        .unwrap();
    assert_eq!(emb.dims()[..], [2, 32]);
    let v = emb.to_vec();
    for row in v.chunks(32) {
        let norm: f32 = row.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "unit length, got {norm}");
    }
    assert_close(
        "sentence_embedding",
        &v,
        &entry(&io, "bert.sentence_embedding").to_vec::<f32>(),
        TOL,
    );
}

#[test]
fn save_then_load_round_trips_the_hf_keys() {
    let bert = hf_model();
    let hf = forma::nn::state::load_file(fixture("bert_tiny.safetensors"))
        .unwrap()
        .tensors;
    let ours = bert.state_dict();
    let mut a: Vec<&str> = ours.keys().collect();
    let mut b: Vec<&str> = hf.keys().collect();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b, "Forma's state_dict keys are the file's");
    for (k, d) in hf.iter() {
        assert_eq!(ours.get(k), Some(d), "{k} holds the file's values");
    }
}

/// An older `transformers` file (with the `embeddings.position_ids` buffer)
/// of a `BertForPreTraining` (weights under `bert.`, heads under `cls.`).
#[test]
fn legacy_and_prefixed_files_load() {
    let hf = forma::nn::state::load_file(fixture("bert_tiny.safetensors"))
        .unwrap()
        .tensors;
    let mut sd: StateDict = hf.clone().rename_prefixes(&[("", "bert.")]);
    let pos: Vec<i64> = (0..40).collect();
    sd.insert(
        "bert.embeddings.position_ids",
        TensorData::from_vec(&pos, vec![1, 40]).unwrap(),
    );
    sd.insert(
        "cls.predictions.bias",
        TensorData::from_vec(&[0.5f32; 99], vec![99]).unwrap(),
    );
    let report = {
        let mut bert = TinyBert::new(
            &forma_models::bert::BertConfig::with_layers(2),
            &Cpu,
            &mut Rng::seed_from(1),
        );
        let r = bert.load_hf_state_dict(sd.clone()).unwrap();
        assert_eq!(
            bert.state_dict(),
            TinyBert::from_safetensors(fixture("bert_tiny.safetensors"), &Cpu)
                .unwrap()
                .state_dict()
        );
        r
    };
    assert_eq!(report.prefix.as_deref(), Some("bert."));
    assert_eq!(
        report.dropped,
        ["embeddings.position_ids", "cls.predictions.bias"]
    );
    let loaded = with_file("legacy_bert", &sd, |p| TinyBert::from_safetensors(p, &Cpu)).unwrap();
    let io = io();
    let ids = ids(&io, "bert.input_ids");
    let want = hf_model().forward(ids.clone()).last_hidden_state.to_vec();
    assert_eq!(loaded.forward(ids).last_hidden_state.to_vec(), want);
}

#[test]
fn a_wrong_file_is_refused_naming_every_bad_key() {
    let hf = forma::nn::state::load_file(fixture("bert_tiny.safetensors"))
        .unwrap()
        .tensors;
    let sd = hf.remap(|k| {
        Some(k.replace(
            "encoder.layer.1.output.dense.weight",
            "encoder.layer.1.output.dense.wieght",
        ))
    });
    let mut bert = TinyBert::new(
        &forma_models::bert::BertConfig::with_layers(2),
        &Cpu,
        &mut Rng::seed_from(1),
    );
    let before = bert.state_dict();
    match bert.load_hf_state_dict(sd) {
        Err(ModelError::Load { source, .. }) => {
            assert_eq!(source.missing_keys, ["encoder.layer.1.output.dense.weight"]);
            assert_eq!(source.unexpected_keys.len(), 1);
            assert_eq!(
                source.unexpected_keys[0].0,
                "encoder.layer.1.output.dense.wieght"
            );
        }
        other => panic!("expected a load error, got {other:?}"),
    }
    assert_eq!(bert.state_dict(), before, "a refused load changes nothing");
}

#[test]
fn too_long_and_mismatched_inputs_are_errors() {
    let bert = hf_model();
    let long = Tensor::<(Dyn, Dyn), i64>::zeros_with((Dyn(1), Dyn(41)));
    assert!(matches!(
        bert.run(&long, None, None),
        Err(ModelError::SequenceTooLong {
            len: 41,
            max: 40,
            ..
        })
    ));
    let ids = Tensor::<(Dyn, Dyn), i64>::zeros_with((Dyn(1), Dyn(4)));
    let mask = Tensor::<(Dyn, Dyn), i64>::ones_with((Dyn(1), Dyn(3)));
    assert!(matches!(
        bert.run(&ids, None, Some(&mask)),
        Err(ModelError::Input { .. })
    ));
    let bad = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![1, 99], (Dyn(1), Dyn(2))).unwrap();
    assert!(matches!(
        bert.run(&bad, None, None),
        Err(ModelError::Tensor(_))
    ));
}
