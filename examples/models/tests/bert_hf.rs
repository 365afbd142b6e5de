//! Forma's BERT against Hugging Face's `BertModel` (fixtures from
//! `tools/gen_model_fixtures.py`): a `save_pretrained` file loads with one
//! call and gives the same hidden states, pooler output and sentence
//! embeddings within 1e-4 (f32), and on request every layer's hidden states
//! and attention probabilities (`output_hidden_states=True,
//! output_attentions=True`); older and `BertFor*` file layouts load too,
//! with a report of what was dropped and renamed; a wrong file is refused
//! with every bad key named.

mod common;

use common::*;
use forma::nn::{Module, StateDict};
use forma::prelude::*;
use forma::TensorData;
use forma_models::bert::BertOutputs;
use forma_models::{ModelError, Outputs};

const TOL: f32 = 1e-4;

fn hf_model() -> TinyBert {
    TinyBert::from_safetensors(fixture("bert_tiny.safetensors"), &Cpu)
        .expect("load bert_tiny")
        .model
}

/// The model on the fixture's ids, token types and mask.
fn run_fixture(bert: &TinyBert, outputs: Outputs) -> BertOutputs<32> {
    let io = io();
    bert.run_with(
        &ids(&io, "bert.input_ids"),
        Some(&ids(&io, "bert.token_type_ids")),
        Some(&ids(&io, "bert.attention_mask")),
        outputs,
    )
    .unwrap()
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
    let hf = fixture_file("bert_tiny.safetensors");
    assert_same_tensors("bert_tiny", &bert.state_dict(), &hf);
}

/// An older `transformers` file (with the `embeddings.position_ids` buffer)
/// of a `BertForPreTraining` (weights under `bert.`, heads under `cls.`).
#[test]
fn legacy_and_prefixed_files_load() {
    let hf = fixture_file("bert_tiny.safetensors");
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
        assert_eq!(bert.state_dict(), hf_model().state_dict());
        r
    };
    assert_eq!(report.prefix.as_deref(), Some("bert."));
    assert_eq!(
        report.dropped,
        ["cls.predictions.bias", "embeddings.position_ids"]
    );
    // Every `bert.` key, with its new name.
    assert_eq!(report.renamed.len(), hf.len() + 1);
    for (from, to) in &report.renamed {
        assert_eq!(
            from.strip_prefix("bert."),
            Some(to.as_str()),
            "{from} -> {to}"
        );
    }
    assert!(report
        .renamed
        .iter()
        .any(|(f, t)| f == "bert.embeddings.position_ids" && t == "embeddings.position_ids"));
    assert!(!report.renamed.iter().any(|(f, _)| f.starts_with("cls.")));
    // The one-call loader returns the same report beside the model.
    let loaded = with_file("legacy_bert", &sd, |p| TinyBert::from_safetensors(p, &Cpu)).unwrap();
    assert_eq!(loaded.report, report);
    let io = io();
    let ids = ids(&io, "bert.input_ids");
    let want = hf_model().forward(ids.clone()).last_hidden_state.to_vec();
    assert_eq!(loaded.model.forward(ids).last_hidden_state.to_vec(), want);
}

#[test]
fn a_plain_file_reports_nothing_set_aside() {
    let loaded = TinyBert::from_safetensors(fixture("bert_tiny.safetensors"), &Cpu).unwrap();
    assert_eq!(loaded.report, forma_models::HfLoadReport::default());
    assert!(!loaded.model.is_training());
}

#[test]
fn hidden_states_and_attentions_match_transformers() {
    let io = io();
    let out = run_fixture(&hf_model(), Outputs::ALL);
    let hidden = out.hidden_states.as_ref().expect("requested hidden states");
    assert_eq!(hidden.len(), 3, "the embeddings' output, then each layer's");
    for (i, h) in hidden.iter().enumerate() {
        assert_eq!(h.dims()[..], [2, 7, 32]);
        let key = format!("bert.hidden_states.{i}");
        assert_close(&key, &h.to_vec(), &entry(&io, &key).to_vec::<f32>(), TOL);
    }
    // The last one is the output itself.
    assert_eq!(hidden[2].to_vec(), out.last_hidden_state.to_vec());
    assert_close(
        "last_hidden_state",
        &out.last_hidden_state.to_vec(),
        &entry(&io, "bert.last_hidden_state").to_vec::<f32>(),
        TOL,
    );
    let attentions = out.attentions.as_ref().expect("requested attentions");
    assert_eq!(attentions.len(), 2);
    for (i, a) in attentions.iter().enumerate() {
        assert_eq!(a.dims()[..], [2, 4, 7, 7]);
        let key = format!("bert.attentions.{i}");
        assert_close(&key, &a.to_vec(), &entry(&io, &key).to_vec::<f32>(), TOL);
    }
}

#[test]
fn attention_rows_are_distributions_that_skip_padding() {
    let io = io();
    let mask = entry(&io, "bert.attention_mask").to_vec::<i64>();
    let out = run_fixture(&hf_model(), Outputs::ALL);
    for a in out.attentions.unwrap() {
        let a = a.to_vec();
        // [batch 2, heads 4, query 7, key 7]
        for (r, row) in a.chunks(7).enumerate() {
            let b = r / (4 * 7);
            let sum: f32 = row.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "row {r} sums to {sum}");
            for (j, &p) in row.iter().enumerate() {
                if mask[b * 7 + j] == 0 {
                    assert_eq!(p, 0.0, "row {r}: padded key {j} gets {p}");
                } else {
                    assert!(p > 0.0, "row {r}: key {j} gets {p}");
                }
            }
        }
    }
}

#[test]
fn intermediates_are_none_unless_requested() {
    let bert = hf_model();
    let plain = run_fixture(&bert, Outputs::NONE);
    assert!(plain.hidden_states.is_none() && plain.attentions.is_none());
    let io = io();
    let ran = bert.run(&ids(&io, "bert.input_ids"), None, None).unwrap();
    assert!(ran.hidden_states.is_none() && ran.attentions.is_none());
    let hidden = run_fixture(
        &bert,
        Outputs {
            output_hidden_states: true,
            ..Outputs::NONE
        },
    );
    assert_eq!(hidden.hidden_states.map(|h| h.len()), Some(3));
    assert!(hidden.attentions.is_none());
    let attn = run_fixture(
        &bert,
        Outputs {
            output_attentions: true,
            ..Outputs::NONE
        },
    );
    assert!(attn.hidden_states.is_none());
    assert_eq!(attn.attentions.map(|a| a.len()), Some(2));
    // Asking for them changes no other output.
    assert_eq!(
        plain.last_hidden_state.to_vec(),
        hidden.last_hidden_state.to_vec()
    );
    assert_close(
        "with attentions",
        &attn.last_hidden_state.to_vec(),
        &plain.last_hidden_state.to_vec(),
        1e-5,
    );
}

/// Without a graph the plain path may run the attention fused, which does
/// not materialise the probabilities; with attentions requested it runs the
/// explicit softmax. Both give Hugging Face's outputs.
#[test]
fn fused_and_explicit_attention_agree() {
    let bert = hf_model();
    let io = io();
    let _guard = forma::core::tape::no_grad();
    let fused = run_fixture(&bert, Outputs::NONE);
    let explicit = run_fixture(&bert, Outputs::ALL);
    for (what, a, b, want) in [
        (
            "last_hidden_state",
            fused.last_hidden_state.to_vec(),
            explicit.last_hidden_state.to_vec(),
            "bert.last_hidden_state",
        ),
        (
            "pooler_output",
            fused.pooler_output.to_vec(),
            explicit.pooler_output.to_vec(),
            "bert.pooler_output",
        ),
    ] {
        assert_close(what, &a, &b, 1e-5);
        assert_close(what, &a, &entry(&io, want).to_vec::<f32>(), TOL);
    }
}

/// The public layer forward passes compose to the model's.
#[test]
fn the_layers_run_one_by_one() {
    let bert = hf_model();
    let io = io();
    let out = run_fixture(&bert, Outputs::ALL);
    let hidden = out.hidden_states.unwrap();
    let attentions = out.attentions.unwrap();
    let x = bert
        .embeddings
        .run(
            &ids(&io, "bert.input_ids"),
            Some(&ids(&io, "bert.token_type_ids")),
        )
        .unwrap();
    assert_eq!(x.to_vec(), hidden[0].to_vec());
    let mask =
        forma_models::bert::extended_attention_mask::<f32, Cpu>(&ids(&io, "bert.attention_mask"))
            .unwrap();
    assert_eq!(mask.dims()[..], [2, 1, 1, 7]);
    let (y, probs) = bert.encoder.layer[0].run(x, Some(&mask), true).unwrap();
    assert_eq!(y.to_vec(), hidden[1].to_vec());
    assert_eq!(probs.unwrap().to_vec(), attentions[0].to_vec());
    let (z, none) = bert.encoder.layer[1].run(y, Some(&mask), false).unwrap();
    assert!(none.is_none());
    assert_close("layer 1", &z.to_vec(), &hidden[2].to_vec(), 1e-5);
}

#[test]
fn a_wrong_file_is_refused_naming_every_bad_key() {
    let hf = fixture_file("bert_tiny.safetensors");
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
    match bert.run(&bad, None, None) {
        Err(ModelError::Tensor(e)) => {
            // The error names the module that raised it, in state_dict names.
            assert_eq!(e.module_path(), Some("embeddings.word_embeddings"));
            let msg = e.to_string();
            assert!(msg.starts_with("embeddings.word_embeddings: "), "{msg}");
            assert!(msg.contains("index 99 is out of range"), "{msg}");
        }
        other => panic!("expected a tensor error, got {other:?}"),
    }
}

/// A forward hook on every layer's last LayerNorm (`encoder.layer.*.output.LayerNorm`)
/// sees exactly the hidden states `output_hidden_states` returns after the
/// embeddings, in order, with their paths.
#[test]
fn a_forward_hook_sees_each_layers_output() {
    use std::sync::{Arc, Mutex};
    let bert = hf_model();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    // Hooks are process-wide, as PyTorch's global ones are, and the other
    // tests here run BERT forwards on other threads meanwhile: keep only
    // this thread's calls.
    let me = std::thread::current().id();
    let handle = forma::nn::hooks::register_forward_hook(
        "encoder.layer.*.output.LayerNorm",
        move |path, y: &Tensor<(Dyn, Dyn, C<32>)>| {
            if std::thread::current().id() == me {
                s.lock().unwrap().push((path.to_string(), y.to_vec()));
            }
            None
        },
    );
    let out = run_fixture(
        &bert,
        Outputs {
            output_hidden_states: true,
            output_attentions: false,
        },
    );
    handle.remove();
    let seen = seen.lock().unwrap();
    let hidden = out.hidden_states.expect("requested");
    assert_eq!(seen.len(), hidden.len() - 1);
    for (i, (path, y)) in seen.iter().enumerate() {
        assert_eq!(path, &format!("encoder.layer.{i}.output.LayerNorm"));
        assert_eq!(y, &hidden[i + 1].to_vec());
    }
}
