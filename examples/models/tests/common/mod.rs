//! What the model suites share: the fixture files the generators
//! (`tools/gen_model_fixtures.py`, `gen_llama_fixtures.py`,
//! `gen_resnet_fixtures.py`) write to `tools/fixtures/models/` and the
//! layouts they record there, the tiny models' types (the generator's
//! `TINY_BERT` / `TINY_GPT2`), and the checks the suites make of them.
#![allow(dead_code)] // each test binary uses a different subset

use forma::nn::StateDict;
use forma::prelude::*;
use forma::TensorData;
use forma_models::bert::Bert;
use forma_models::gpt2::Gpt2LMHeadModel;
use std::path::PathBuf;

/// vocab 99, hidden 32, 4 heads, intermediate 37, 40 positions, 2 types; 2 layers.
pub type TinyBert = Bert<99, 32, 4, 37, 40, 2>;
/// vocab 99, context 64, hidden 32 (QKV 96), 4 heads, MLP 128; 2 blocks.
pub type TinyGpt2 = Gpt2LMHeadModel<99, 64, 32, 96, 4, 128>;

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/fixtures/models")
        .join(name)
}

/// The tensors of the fixture file `name`.
pub fn fixture_file(name: &str) -> StateDict {
    forma::nn::state::load_file(fixture(name))
        .unwrap_or_else(|e| {
            panic!("tools/fixtures/models/{name} (run its tools/gen_*_fixtures.py): {e}")
        })
        .tensors
}

/// The inputs and outputs of `io.safetensors`.
pub fn io() -> StateDict {
    fixture_file("io.safetensors")
}

/// A model's entry in a layouts file (`layouts.json`,
/// `llama_layouts.json`, `resnet_layouts.json`), and the keys and shapes of
/// its `state_dict`, in order.
pub fn layout(file: &str, model: &str) -> (Vec<(String, Vec<usize>)>, serde_json::Value) {
    let text = std::fs::read_to_string(fixture(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let keys = doc[model]["state_dict"]
        .as_array()
        .unwrap_or_else(|| panic!("{file} has no {model}"))
        .iter()
        .map(|e| {
            let key = e[0].as_str().expect("a key").to_string();
            let dims = e[1]
                .as_array()
                .expect("dims")
                .iter()
                .map(|d| d.as_u64().expect("a size") as usize)
                .collect();
            (key, dims)
        })
        .collect();
    (keys, doc[model].clone())
}

/// The number of elements of a layout's tensors.
pub fn elements<'a>(layout: impl IntoIterator<Item = &'a (String, Vec<usize>)>) -> usize {
    layout
        .into_iter()
        .map(|(_, d)| d.iter().product::<usize>())
        .sum()
}

/// Fails unless `ours` holds exactly `file`'s keys (in any order: a
/// safetensors file stores them sorted) and its values bit for bit.
pub fn assert_same_tensors(what: &str, ours: &StateDict, file: &StateDict) {
    let mut a: Vec<&str> = ours.keys().collect();
    let mut b: Vec<&str> = file.keys().collect();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b, "{what}: the same keys");
    for (k, d) in file.iter() {
        assert_eq!(ours.get(k), Some(d), "{what}: {k} holds the file's values");
    }
}

pub fn entry<'a>(sd: &'a StateDict, key: &str) -> &'a TensorData {
    sd.get(key)
        .unwrap_or_else(|| panic!("the fixture has no {key}"))
}

/// An int64 `[batch, len]` fixture tensor.
pub fn ids(sd: &StateDict, key: &str) -> Tensor<(Dyn, Dyn), i64> {
    Tensor::try_from_data(entry(sd, key), &Cpu).unwrap_or_else(|e| panic!("{key}: {e}"))
}

/// Fails with the first index where `got` and `want` differ by more than `tol`.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let mut worst = (0.0f32, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        assert!(!d.is_nan(), "{what}[{i}]: {g} vs {w}");
        if d > worst.0 {
            worst = (d, i);
        }
    }
    let (d, i) = worst;
    println!("{what}: max |diff| {d:e} (tolerance {tol:e})");
    assert!(
        d <= tol,
        "{what}[{i}]: {} vs {} (|diff| {d} > {tol})",
        got[i],
        want[i]
    );
}

/// A path in the temp dir unique to this process and `name`.
pub fn temp_file(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "forma-models-{}-{name}.safetensors",
        std::process::id()
    ))
}

/// Writes `sd` to a temporary file, runs `f` on the path, removes the file.
pub fn with_file<T>(name: &str, sd: &StateDict, f: impl FnOnce(&std::path::Path) -> T) -> T {
    let path = temp_file(name);
    forma::nn::state::save_file(sd, &path, &Default::default())
        .expect("write a temporary checkpoint");
    let out = f(&path);
    let _ = std::fs::remove_file(&path);
    out
}
