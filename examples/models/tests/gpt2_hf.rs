//! Forma's GPT-2 against Hugging Face's `GPT2LMHeadModel` (fixtures from
//! `tools/gen_model_fixtures.py`): the `save_pretrained` file (tied head left
//! out) loads with one call and gives the same logits within 1e-4 (f32);
//! greedy generation gives HF's tokens exactly; the KV cache gives the logits
//! of a full recomputation within 1e-5; the hub's bare `GPT2Model` layout with
//! its causal-mask buffers loads; an untied head is refused.

mod common;

use common::*;
use forma::nn::{Module, StateDict};
use forma::prelude::*;
use forma::TensorData;
use forma_models::gpt2::{Gpt2Config, KvCache, Sampling};
use forma_models::ModelError;

fn hf_model() -> TinyGpt2 {
    TinyGpt2::from_safetensors(fixture("gpt2_tiny.safetensors"), &Cpu).expect("load gpt2_tiny")
}

fn hf_file() -> StateDict {
    forma::nn::state::load_file(fixture("gpt2_tiny.safetensors"))
        .unwrap()
        .tensors
}

#[test]
fn logits_match_transformers() {
    let gpt = hf_model();
    assert!(!gpt.is_training());
    assert_eq!(gpt.transformer.h.len(), 2);
    let io = io();
    let logits = gpt.logits(&ids(&io, "gpt2.input_ids")).unwrap();
    assert_eq!(logits.dims()[..], [2, 6, 99]);
    assert_close(
        "logits",
        &logits.to_vec(),
        &entry(&io, "gpt2.logits").to_vec::<f32>(),
        1e-4,
    );
}

#[test]
fn greedy_generation_reproduces_transformers_tokens() {
    let gpt = hf_model();
    let io = io();
    let prompt = entry(&io, "gpt2.prompt").to_vec::<i64>();
    let want = entry(&io, "gpt2.greedy").to_vec::<i64>();
    let got = gpt
        .generate(
            &prompt,
            want.len() - prompt.len(),
            Sampling::Greedy,
            &mut Rng::seed_from(0),
        )
        .unwrap();
    assert_eq!(got, want);
}

#[test]
fn cached_logits_equal_a_full_recomputation() {
    let gpt = hf_model();
    let io = io();
    let all = ids(&io, "gpt2.input_ids");
    let full = gpt.logits(&all).unwrap();
    let mut cache = KvCache::new();
    // Three positions at once, then one at a time.
    let mut parts = vec![gpt
        .logits_cached(&all.narrow::<1>(0, 3).contiguous(), &mut cache)
        .unwrap()];
    assert_eq!(cache.len(), 3);
    for t in 3..6 {
        parts.push(
            gpt.logits_cached(&all.narrow::<1>(t, 1).contiguous(), &mut cache)
                .unwrap(),
        );
    }
    assert_eq!(cache.len(), 6);
    let stepped = forma::cat::<1, _, _, _>(&parts);
    assert_close("cached logits", &stepped.to_vec(), &full.to_vec(), 1e-5);
}

#[test]
fn cache_is_unchanged_by_a_failed_step() {
    let gpt = hf_model();
    let mut cache = KvCache::new();
    let two = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![1, 2, 3, 4], (Dyn(2), Dyn(2))).unwrap();
    gpt.logits_cached(&two, &mut cache).unwrap();
    let bad = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![5, 99], (Dyn(2), Dyn(1))).unwrap();
    assert!(matches!(
        gpt.logits_cached(&bad, &mut cache),
        Err(ModelError::Tensor(_))
    ));
    assert_eq!(cache.len(), 2);
    let one = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![5], (Dyn(1), Dyn(1))).unwrap();
    assert!(matches!(
        gpt.logits_cached(&one, &mut cache),
        Err(ModelError::Input { .. })
    ));
    let long = Tensor::<(Dyn, Dyn), i64>::zeros_with((Dyn(2), Dyn(63)));
    assert!(matches!(
        gpt.logits_cached(&long, &mut cache),
        Err(ModelError::SequenceTooLong {
            len: 65,
            max: 64,
            ..
        })
    ));
}

#[test]
fn top_k_sampling_is_seeded_and_stays_in_the_top_k() {
    let gpt = hf_model();
    let prompt = [5, 17, 42];
    let s = Sampling::TopK {
        k: 3,
        temperature: 0.9,
    };
    let a = gpt
        .generate(&prompt, 10, s, &mut Rng::seed_from(7))
        .unwrap();
    let b = gpt
        .generate(&prompt, 10, s, &mut Rng::seed_from(7))
        .unwrap();
    assert_eq!(a, b, "the same seed gives the same tokens");
    // Each sampled token is among the 3 largest logits of its prefix.
    for t in prompt.len()..a.len() {
        let ids = Tensor::<(Dyn, Dyn), i64>::from_vec(a[..t].to_vec(), (Dyn(1), Dyn(t))).unwrap();
        let logits = gpt.logits(&ids).unwrap().to_vec();
        let last = &logits[(t - 1) * 99..t * 99];
        let mine = last[a[t] as usize];
        let above = last.iter().filter(|&&x| x > mine).count();
        assert!(above < 3, "token {t} ranks {}", above + 1);
    }
    let none = Sampling::TopK {
        k: 0,
        temperature: 1.0,
    };
    assert!(matches!(
        gpt.generate(&prompt, 1, none, &mut Rng::seed_from(0)),
        Err(ModelError::Sampling(_))
    ));
    let cold = Sampling::TopK {
        k: 2,
        temperature: 0.0,
    };
    assert!(matches!(
        gpt.generate(&prompt, 1, cold, &mut Rng::seed_from(0)),
        Err(ModelError::Sampling(_))
    ));
    assert!(matches!(
        gpt.generate(&[], 1, Sampling::Greedy, &mut Rng::seed_from(0)),
        Err(ModelError::Sampling(_))
    ));
}

#[test]
fn state_dict_is_the_saved_file_without_the_tied_head() {
    let gpt = hf_model();
    let hf = hf_file();
    let ours = gpt.state_dict();
    assert!(!ours.contains_key("lm_head.weight"));
    let mut a: Vec<&str> = ours.keys().collect();
    let mut b: Vec<&str> = hf.keys().collect();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
    for (k, d) in hf.iter() {
        assert_eq!(ours.get(k), Some(d), "{k}");
    }
    // c_attn keeps GPT-2's Conv1D layout, [in, out].
    assert_eq!(
        ours.get("transformer.h.0.attn.c_attn.weight")
            .unwrap()
            .dims()[..],
        [32, 96]
    );
}

/// The hub's `gpt2/model.safetensors` layout: a bare `GPT2Model` (no
/// `transformer.` prefix) carrying the causal-mask buffers older
/// `transformers` saved, here with an explicit tied head as well.
#[test]
fn hub_layout_with_mask_buffers_and_tied_head_loads() {
    let hf = hf_file();
    let mut sd = hf.clone().rename_prefixes(&[("transformer.", "")]);
    for i in 0..2 {
        let tri: Vec<f32> = (0..64 * 64)
            .map(|n| f32::from(u8::from(n % 64 <= n / 64)))
            .collect();
        sd.insert(
            format!("h.{i}.attn.bias"),
            TensorData::from_vec(&tri, vec![1, 1, 64, 64]).unwrap(),
        );
        sd.insert(
            format!("h.{i}.attn.masked_bias"),
            TensorData::from_vec(&[-1e4f32], vec![]).unwrap(),
        );
    }
    sd.insert(
        "lm_head.weight",
        hf.get("transformer.wte.weight").unwrap().clone(),
    );
    let mut gpt = TinyGpt2::new(&Gpt2Config::with_layers(2), &Cpu, &mut Rng::seed_from(3));
    let report = gpt.load_hf_state_dict(sd.clone()).unwrap();
    assert_eq!(report.prefix.as_deref(), Some("transformer."));
    let mut dropped = report.dropped.clone();
    dropped.sort();
    assert_eq!(
        dropped,
        [
            "lm_head.weight",
            "transformer.h.0.attn.bias",
            "transformer.h.0.attn.masked_bias",
            "transformer.h.1.attn.bias",
            "transformer.h.1.attn.masked_bias"
        ]
    );
    let loaded = with_file("hub_gpt2", &sd, |p| TinyGpt2::from_safetensors(p, &Cpu)).unwrap();
    let io = io();
    let x = ids(&io, "gpt2.input_ids");
    assert_eq!(
        loaded.logits(&x).unwrap().to_vec(),
        hf_model().logits(&x).unwrap().to_vec()
    );
}

#[test]
fn an_untied_head_is_refused() {
    let mut sd = hf_file();
    let mut head = sd.get("transformer.wte.weight").unwrap().to_vec::<f32>();
    head[0] += 1.0;
    sd.insert(
        "lm_head.weight",
        TensorData::from_vec(&head, vec![99, 32]).unwrap(),
    );
    let mut gpt = TinyGpt2::new(&Gpt2Config::with_layers(2), &Cpu, &mut Rng::seed_from(3));
    let before = gpt.state_dict();
    assert!(matches!(
        gpt.load_hf_state_dict(sd),
        Err(ModelError::UntiedHead)
    ));
    assert_eq!(gpt.state_dict(), before);
}

#[test]
fn the_tied_embedding_receives_the_head_gradient() {
    let gpt = TinyGpt2::new(
        &Gpt2Config::with_layers(1).without_dropout(),
        &Cpu,
        &mut Rng::seed_from(4),
    );
    let ids = Tensor::<(Dyn, Dyn), i64>::from_vec(vec![1, 2, 3], (Dyn(1), Dyn(3))).unwrap();
    gpt.logits(&ids).unwrap().sum_all().backward();
    let g = gpt
        .transformer
        .wte
        .weight
        .grad()
        .expect("wte has a gradient")
        .to_vec();
    // Row 50 is never looked up: only the head's use of wte reaches it.
    assert!(g[50 * 32..51 * 32].iter().any(|&x| x != 0.0));
}
