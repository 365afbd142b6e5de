//! Forma's Llama against Hugging Face's `LlamaForCausalLM` (fixtures from
//! `tools/gen_llama_fixtures.py`, transformers 5.25, eager attention, f32):
//! the `save_pretrained` files load with one call and give the same logits
//! within 1e-5 normwise, for grouped-query attention with an untied head and
//! for multi-head attention with a tied head; the rotary table is HF's;
//! greedy generation gives HF's tokens exactly; the KV cache gives the
//! logits of a full recomputation; the full-size TinyLlama-1.1B and
//! Llama-3.2-1B-shaped layouts are `transformers`' keys and shapes; wrong
//! files and configs are refused, naming what is wrong.

mod common;

use common::{assert_same_tensors, elements, entry, fixture, fixture_file as file, ids, with_file};
use forma::nn::Module;
use forma::nn::StateDict;
use forma::prelude::*;
use forma::TensorData;
use forma_models::llama::{KvCache, LlamaConfig, LlamaForCausalLM, TinyLlama};
use forma_models::{HfLoadReport, ModelError, Outputs};

/// `TINY_LLAMA`: vocabulary 256, hidden 64, 4 heads of 16, 2 key/value
/// heads (KV = 32), MLP 128; 2 layers, untied head.
type Tiny = LlamaForCausalLM<256, 64, 4, 32, 128>;
/// `MHA_LLAMA`: vocabulary 128, hidden 32, 4 heads of 8, 4 key/value heads
/// (KV = 32), MLP 48; 1 layer, tied head.
type Mha = LlamaForCausalLM<128, 32, 4, 32, 48>;

fn tiny_config() -> LlamaConfig {
    LlamaConfig {
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        max_position_embeddings: 64,
        ..Tiny::config(2)
    }
}

fn mha_config() -> LlamaConfig {
    LlamaConfig {
        rms_norm_eps: 1e-6,
        rope_theta: 500000.0,
        max_position_embeddings: 32,
        tie_word_embeddings: true,
        ..Mha::config(1)
    }
}

fn tiny() -> Tiny {
    let loaded = Tiny::from_safetensors(fixture("llama_tiny.safetensors"), &tiny_config(), &Cpu)
        .expect("load llama_tiny");
    assert_eq!(loaded.report, HfLoadReport::default());
    loaded.model
}

fn io() -> StateDict {
    file("llama_io.safetensors")
}

/// `|got - want|_2 / |want|_2 <= tol`, printing it and the largest
/// elementwise difference.
fn assert_normwise(what: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let (mut diff, mut norm, mut worst) = (0.0f64, 0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = f64::from(g) - f64::from(w);
        assert!(!d.is_nan(), "{what}: NaN");
        diff += d * d;
        norm += f64::from(w) * f64::from(w);
        worst = worst.max(d.abs());
    }
    let rel = diff.sqrt() / norm.sqrt();
    println!("{what}: normwise {rel:e}, max |diff| {worst:e} (tolerance {tol:e})");
    assert!(rel <= tol, "{what}: normwise error {rel:e} > {tol:e}");
}

/// `llama`'s logits for `<name>.input_ids` against HF's `<name>.logits`,
/// which it returns.
fn assert_logits<
    const V: usize,
    const H: usize,
    const HEADS: usize,
    const KV: usize,
    const FF: usize,
>(
    llama: &LlamaForCausalLM<V, H, HEADS, KV, FF>,
    name: &str,
    dims: [usize; 3],
) -> Vec<f32> {
    let io = io();
    let logits = llama
        .logits(&ids(&io, &format!("{name}.input_ids")))
        .unwrap();
    assert_eq!(logits.dims()[..], dims);
    let want = entry(&io, &format!("{name}.logits")).to_vec::<f32>();
    assert_normwise(&format!("{name} logits"), &logits.to_vec(), &want, 1e-5);
    want
}

#[test]
fn logits_match_transformers_with_grouped_query_attention() {
    let llama = tiny();
    assert!(!llama.is_training());
    assert_eq!(llama.model.layers.len(), 2);
    assert_eq!(Tiny::KV_HEADS, 2);
    let want = assert_logits(&llama, "tiny", [2, 7, 256]);
    // Not trivially close: the logits spread over several units.
    let spread = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(spread > 5.0, "{spread}");
}

#[test]
fn logits_match_transformers_with_multi_head_attention_and_a_tied_head() {
    let loaded = Mha::from_safetensors(fixture("llama_mha.safetensors"), &mha_config(), &Cpu)
        .expect("load llama_mha");
    assert_eq!(loaded.report, HfLoadReport::default());
    let llama = loaded.model;
    assert!(llama.lm_head.is_none());
    assert_eq!(Mha::KV_HEADS, 4);
    assert_logits(&llama, "mha", [2, 5, 128]);
    // The saved file leaves the tied head out, and so does the state dict.
    let saved = file("llama_mha.safetensors");
    let ours = llama.state_dict();
    assert!(!saved.contains_key("lm_head.weight") && !ours.contains_key("lm_head.weight"));
    assert_eq!(ours.len(), saved.len());
}

/// The wrong theta is a different model: the MHA file run with the default
/// 10000 instead of its 500000 does not give HF's logits.
#[test]
fn rope_theta_comes_from_the_config() {
    let config = LlamaConfig {
        rope_theta: 10000.0,
        ..mha_config()
    };
    let llama = Mha::from_safetensors(fixture("llama_mha.safetensors"), &config, &Cpu)
        .unwrap()
        .model;
    let io = io();
    let got = llama.logits(&ids(&io, "mha.input_ids")).unwrap().to_vec();
    let want = entry(&io, "mha.logits").to_vec::<f32>();
    let diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(diff > 1e-2, "theta changed nothing ({diff})");
}

#[test]
fn rotary_table_is_transformers() {
    let llama = tiny();
    let (cos, sin) = llama.model.rotary_emb.cos_sin(0, 7).unwrap();
    assert_eq!(cos.dims()[..], [1, 1, 7, 16]);
    let io = io();
    // HF's is [batch, len, head_dim]; the same values in the same order.
    for (name, got) in [("rope.cos", cos), ("rope.sin", sin)] {
        let want = entry(&io, name).to_vec::<f32>();
        let got = got.to_vec();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        println!("{name}: max |diff| {worst:e}");
        assert!(worst <= 1e-6, "{name}: {worst}");
    }
    assert!(llama.state_dict().keys().all(|k| !k.contains("inv_freq")));
}

#[test]
fn greedy_generation_reproduces_transformers_tokens() {
    let llama = tiny();
    let io = io();
    let prompt = entry(&io, "tiny.prompt").to_vec::<i64>();
    let want = entry(&io, "tiny.greedy").to_vec::<i64>();
    assert_eq!((prompt.len(), want.len()), (8, 24));
    let got = llama.generate(&prompt, want.len() - prompt.len()).unwrap();
    assert_eq!(got, want);
    assert!(matches!(
        llama.generate(&[], 1),
        Err(ModelError::Sampling(_))
    ));
}

/// The generated sequence run as a prompt of 8, then 5 positions at once,
/// then one at a time, against the cache: the logits of HF's one full run.
#[test]
fn cached_logits_equal_a_full_recomputation() {
    let llama = tiny();
    let io = io();
    let all = ids(&io, "tiny.greedy");
    let full = llama.logits(&all).unwrap().to_vec();
    let hf = entry(&io, "tiny.cached_logits").to_vec::<f32>();
    assert_normwise("full logits", &full, &hf, 1e-5);
    let mut cache = KvCache::new();
    let mut parts = Vec::new();
    let mut at = 0;
    for len in [8, 5].into_iter().chain(std::iter::repeat_n(1, 11)) {
        let step = all.narrow::<1>(at, len).contiguous();
        parts.push(llama.logits_cached(&step, &mut cache).unwrap());
        at += len;
        assert_eq!(cache.len(), at);
    }
    assert_eq!(at, 24);
    let stepped = forma::cat::<1, _, _>(&parts).to_vec();
    assert_normwise("cached vs full", &stepped, &full, 2e-6);
    assert_normwise("cached vs transformers", &stepped, &hf, 1e-5);
}

#[test]
fn cache_is_unchanged_by_a_failed_step() {
    let llama = tiny();
    let mut cache = KvCache::new();
    let two = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![1, 2, 3, 4], (Dyn(2), Dyn(2))).unwrap();
    llama.logits_cached(&two, &mut cache).unwrap();
    let bad = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![5, 256], (Dyn(2), Dyn(1))).unwrap();
    let err = llama.logits_cached(&bad, &mut cache).unwrap_err();
    let ModelError::Tensor(e) = &err else {
        panic!("{err}")
    };
    assert_eq!(e.module_path(), Some("model.embed_tokens"), "{e}");
    assert_eq!(cache.len(), 2);
    let one = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![5], (Dyn(1), Dyn(1))).unwrap();
    assert!(matches!(
        llama.logits_cached(&one, &mut cache),
        Err(ModelError::Input { .. })
    ));
    assert_eq!(cache.len(), 2);
}

#[test]
fn state_dict_is_the_saved_file() {
    let llama = tiny();
    let ours = llama.state_dict();
    assert_same_tensors("llama_tiny", &ours, &file("llama_tiny.safetensors"));
    assert_eq!(
        ours.get("model.layers.1.self_attn.v_proj.weight")
            .unwrap()
            .dims(),
        [32, 64]
    );
}

#[test]
fn a_wrong_shaped_file_is_refused_naming_the_key() {
    let mut sd = file("llama_tiny.safetensors");
    let key = "model.layers.1.self_attn.k_proj.weight";
    // A k_proj with 4 key/value heads (MHA) where the model has 2.
    sd.insert(
        key,
        TensorData::from_vec(&vec![0.0f32; 64 * 64], vec![64, 64]).unwrap(),
    );
    let err = with_file("llama_bad_shape", &sd, |p| {
        Tiny::from_safetensors(p, &tiny_config(), &Cpu)
    })
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ModelError::Load { .. }), "{text}");
    assert!(text.contains(key), "{text}");
    assert!(text.contains("llama_bad_shape"), "names the file: {text}");
    // The in-memory load leaves the model as it was.
    let mut llama = Tiny::new(&tiny_config(), &Cpu, &mut Rng::seed_from(1)).unwrap();
    let before = llama.state_dict();
    assert!(llama.load_hf_state_dict(sd).is_err());
    assert_eq!(llama.state_dict(), before);
}

#[test]
fn a_missing_head_is_refused_for_an_untied_config() {
    let mut sd = file("llama_tiny.safetensors");
    sd.remove("lm_head.weight");
    let mut llama = Tiny::new(&tiny_config(), &Cpu, &mut Rng::seed_from(1)).unwrap();
    let err = llama.load_hf_state_dict(sd).unwrap_err().to_string();
    assert!(err.contains("lm_head.weight"), "{err}");
}

#[test]
fn a_config_that_does_not_fit_the_type_is_refused() {
    for (config, field) in [
        (
            LlamaConfig {
                num_key_value_heads: 4,
                ..tiny_config()
            },
            "num_key_value_heads is 4",
        ),
        (
            LlamaConfig {
                hidden_size: 32,
                ..tiny_config()
            },
            "hidden_size is 32",
        ),
        (
            LlamaConfig {
                rope_theta: 0.0,
                ..tiny_config()
            },
            "rope_theta",
        ),
    ] {
        let err = Tiny::new(&config, &Cpu, &mut Rng::seed_from(0)).unwrap_err();
        assert!(matches!(err, ModelError::Config { .. }), "{err}");
        assert!(err.to_string().contains(field), "{err}");
        assert!(Tiny::state_dict_layout(&config, &Cpu).is_err());
    }
}

/// A tied model's file with an explicit `lm_head.weight` (equal: dropped;
/// different: refused), the `inv_freq` buffers older `transformers` saved
/// (dropped), and a bare `LlamaModel` layout (prefixed).
#[test]
fn hub_variants_load_with_a_report() {
    let hf = file("llama_mha.safetensors");
    let mut sd = hf.clone().rename_prefixes(&[("model.", "")]);
    sd.insert(
        "lm_head.weight",
        hf.get("model.embed_tokens.weight").unwrap().clone(),
    );
    sd.insert(
        "layers.0.self_attn.rotary_emb.inv_freq",
        TensorData::from_vec(&[1.0f32, 0.1, 0.01, 0.001], vec![4]).unwrap(),
    );
    let loaded = with_file("llama_hub", &sd, |p| {
        Mha::from_safetensors(p, &mha_config(), &Cpu)
    })
    .unwrap();
    let report = loaded.report;
    assert_eq!(report.prefix.as_deref(), Some("model."));
    assert_eq!(
        report.dropped,
        [
            "lm_head.weight",
            "model.layers.0.self_attn.rotary_emb.inv_freq"
        ]
    );
    assert_eq!(report.renamed.len(), sd.len() - 1);
    let io = io();
    let x = ids(&io, "mha.input_ids");
    assert_normwise(
        "hub layout logits",
        &loaded.model.logits(&x).unwrap().to_vec(),
        &entry(&io, "mha.logits").to_vec::<f32>(),
        1e-5,
    );

    let mut head = hf.get("model.embed_tokens.weight").unwrap().to_vec::<f32>();
    head[0] += 1.0;
    let mut untied = hf.clone();
    untied.insert(
        "lm_head.weight",
        TensorData::from_vec(&head, vec![128, 32]).unwrap(),
    );
    let mut llama = Mha::new(&mha_config(), &Cpu, &mut Rng::seed_from(2)).unwrap();
    let before = llama.state_dict();
    let err = llama.load_hf_state_dict(untied).unwrap_err();
    assert!(matches!(err, ModelError::UntiedHead), "{err}");
    assert!(err.to_string().contains("lm_head.weight differs"), "{err}");
    assert_eq!(llama.state_dict(), before);
}

#[test]
fn hidden_states_and_attentions_match_transformers() {
    let llama = tiny();
    let io = io();
    let x = ids(&io, "tiny.input_ids");
    let out = llama.run_with(&x, None, Outputs::ALL).unwrap();
    assert_normwise(
        "logits with attentions",
        &out.logits.to_vec(),
        &entry(&io, "tiny.logits").to_vec::<f32>(),
        1e-5,
    );
    let hidden = out.hidden_states.unwrap();
    assert_eq!(hidden.len(), 3, "each layer's input, then norm's output");
    for (i, h) in hidden.iter().enumerate() {
        assert_eq!(h.dims()[..], [2, 7, 64]);
        let key = format!("tiny.hidden_states.{i}");
        assert_normwise(&key, &h.to_vec(), &entry(&io, &key).to_vec::<f32>(), 1e-5);
    }
    let attn = out.attentions.unwrap();
    assert_eq!(attn.len(), 2);
    for (i, a) in attn.iter().enumerate() {
        assert_eq!(a.dims()[..], [2, 4, 7, 7]);
        let key = format!("tiny.attentions.{i}");
        assert_normwise(&key, &a.to_vec(), &entry(&io, &key).to_vec::<f32>(), 1e-5);
        for (r, row) in a.to_vec().chunks(7).enumerate() {
            let q = r % 7;
            let sum: f32 = row.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "row {r} sums to {sum}");
            assert!(
                row[q + 1..].iter().all(|&p| p == 0.0),
                "row {r} sees later keys"
            );
        }
    }
    // The last hidden state is the final norm's output: the head's input.
    let head = llama.lm_head.as_ref().unwrap();
    assert_eq!(
        head.forward(hidden[2].clone()).to_vec(),
        out.logits.to_vec()
    );
    // A layer run on its own reproduces the next hidden state.
    let rope = llama.model.rotary_emb.cos_sin(0, 7).unwrap();
    let (y, _) = llama.model.layers[0]
        .run(hidden[0].clone(), &rope, false)
        .unwrap();
    assert_normwise("layer 0", &y.to_vec(), &hidden[1].to_vec(), 1e-6);
}

/// A model of `llama_layouts.json`: its keys and shapes, its parameter
/// count, and its entry.
fn hf_layout(model: &str) -> (Vec<(String, Vec<usize>)>, usize, serde_json::Value) {
    let (keys, doc) = common::layout("llama_layouts.json", model);
    let params = doc["num_parameters"].as_u64().expect("a count") as usize;
    (keys, params, doc)
}

#[test]
fn tinyllama_has_llama_for_causal_lms_keys_and_shapes() {
    let config = LlamaConfig::tinyllama_1_1b();
    let ours = TinyLlama::state_dict_layout(&config, &Cpu).unwrap();
    let (hf, params, doc) = hf_layout("tinyllama_1_1b");
    let c = &doc["config"];
    assert_eq!(c["num_hidden_layers"], config.num_hidden_layers);
    assert_eq!(c["num_key_value_heads"], config.num_key_value_heads);
    assert_eq!(c["rms_norm_eps"], config.rms_norm_eps);
    assert_eq!(hf.len(), 201);
    assert_eq!(ours, hf);
    assert_eq!(elements(&ours), params);
    assert_eq!(params, 1_100_048_384); // TinyLlama-1.1B's parameter count
}

#[test]
fn llama_3_2_1b_shape_has_the_keys_less_the_tied_head() {
    type Llama32OneB = LlamaForCausalLM<128256, 2048, 32, 512, 8192>;
    let config = LlamaConfig {
        rms_norm_eps: 1e-5,
        rope_theta: 500000.0,
        max_position_embeddings: 131072,
        tie_word_embeddings: true,
        ..Llama32OneB::config(16)
    };
    let ours = Llama32OneB::state_dict_layout(&config, &Cpu).unwrap();
    let (mut hf, params, doc) = hf_layout("llama_3_2_1b");
    assert_eq!(doc["tied"]["lm_head.weight"], "model.embed_tokens.weight");
    // `state_dict()` lists the tied head last; Forma's model has it as
    // `model.embed_tokens.weight` only.
    assert_eq!(
        hf.pop(),
        Some(("lm_head.weight".to_string(), vec![128256, 2048]))
    );
    assert_eq!(ours, hf);
    assert_eq!(elements(&ours), params);
    assert_eq!(params, 1_235_814_400); // Llama 3.2 1B's parameter count
}

/// `to_dtype` keeps the keys and the numerics: in f64 the logits are
/// still HF's (whose own f32 error dominates); in bf16 they stay near, and
/// the rotary table is computed in f32 then rounded once, as HF does, so it
/// holds at long positions (a bf16 `position * inv_freq` would be off by
/// radians at position 1000).
#[test]
fn converted_models_keep_transformers_numerics() {
    let llama = tiny();
    let io = io();
    let x = ids(&io, "tiny.input_ids");
    let want = entry(&io, "tiny.logits").to_vec::<f32>();
    let wide = llama.to_dtype::<f64>();
    let got: Vec<f32> = wide.logits(&x).unwrap().to_dtype::<f32>().to_vec();
    assert_normwise("f64 logits", &got, &want, 1e-5);

    let half = llama.to_dtype::<bf16>();
    let keys = |sd: StateDict| sd.keys().map(String::from).collect::<Vec<_>>();
    assert_eq!(keys(half.state_dict()), keys(llama.state_dict()));
    let got: Vec<f32> = half.logits(&x).unwrap().to_dtype::<f32>().to_vec();
    assert_normwise("bf16 logits", &got, &want, 5e-2);

    let (cos32, sin32) = llama.model.rotary_emb.cos_sin(1000, 3).unwrap();
    let (cos16, sin16) = half.model.rotary_emb.cos_sin(1000, 3).unwrap();
    for (name, a, b) in [("cos", cos32, cos16), ("sin", sin32, sin16)] {
        let worst = a
            .to_vec()
            .iter()
            .zip(b.to_dtype::<f32>().to_vec())
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        println!("bf16 {name} at 1000: max |diff| {worst:e}");
        assert!(worst <= 4e-3, "bf16 {name} at position 1000: {worst}");
    }
}
