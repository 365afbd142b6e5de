//! The pass-case models (`tests/pass/model_*.rs`) give exactly the state_dict
//! keys, shapes and dtypes, parameter and buffer names, parameter counts and
//! (where the layouts match) the repr that PyTorch gives for the same
//! architecture, read from `tools/fixtures/state_dicts.json` (written by
//! `tools/gen_state_dict_fixtures.py` with real PyTorch).

#![allow(dead_code)] // each included pass case brings its own `main`

mod mlp {
    include!("pass/model_mlp.rs");
}
mod lenet5 {
    include!("pass/model_lenet5.rs");
}
mod basic_block {
    include!("pass/model_basic_block.rs");
}
mod encoder_block {
    include!("pass/model_encoder_block.rs");
}

use forma::nn::layers::{BatchNorm2d, LayerNorm, MultiheadAttention};
use forma::prelude::*;
use serde_json::Value;

fn fixture(model: &str) -> Value {
    let text = include_str!("../../tools/fixtures/state_dicts.json");
    let all: Value = serde_json::from_str(text).expect("the fixture is JSON");
    all["models"][model].clone()
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("a list")
        .iter()
        .map(|k| k.as_str().expect("a name").to_string())
        .collect()
}

/// Compares everything but the repr; returns the fixture for more checks.
fn check<M: Module>(name: &str, model: &M) -> Value {
    let f = fixture(name);
    let expected: Vec<(String, Vec<usize>, String)> = f["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|e| {
            let dims = e[1]
                .as_array()
                .expect("shape")
                .iter()
                .map(|d| d.as_u64().expect("size") as usize)
                .collect();
            (
                e[0].as_str().expect("key").to_string(),
                dims,
                e[2].as_str().expect("dtype").to_string(),
            )
        })
        .collect();
    let sd = model.state_dict();
    let got: Vec<(String, Vec<usize>, String)> = sd
        .iter()
        .map(|(k, d)| (k.to_string(), d.dims().to_vec(), d.dtype().to_string()))
        .collect();
    assert_eq!(got, expected, "{name}: state_dict keys, shapes and dtypes");
    let params: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        params,
        names(&f["named_parameters"]),
        "{name}: named_parameters"
    );
    let buffers: Vec<String> = model.named_buffers().into_iter().map(|(k, _)| k).collect();
    assert_eq!(buffers, names(&f["named_buffers"]), "{name}: named_buffers");
    assert_eq!(
        model.num_parameters() as u64,
        f["num_parameters"].as_u64().expect("count"),
        "{name}: parameter count"
    );
    f
}

#[test]
fn mlp_matches_pytorch() {
    let m = mlp::Mlp::new(&mut Rng::seed_from(0));
    let f = check("mlp", &m);
    assert_eq!(m.repr(), f["repr"].as_str().expect("repr"));
}

#[test]
fn lenet5_matches_pytorch() {
    let m = lenet5::LeNet5::<f32, Cpu>::new(&Cpu, &mut Rng::seed_from(0));
    check("lenet5", &m);
}

#[test]
fn basic_block_matches_pytorch() {
    let m = basic_block::BasicBlock::new(&mut Rng::seed_from(0));
    let f = check("basic_block", &m);
    assert_eq!(m.repr(), f["repr"].as_str().expect("repr"));
}

#[test]
fn encoder_block_matches_pytorch() {
    let m = encoder_block::EncoderBlock::new(&mut Rng::seed_from(0));
    check("encoder_block", &m);
}

#[test]
fn single_layers_match_pytorch() {
    let mha = MultiheadAttention::<64, 4>::new(&Cpu, &mut Rng::seed_from(0));
    check("mha", &mha);
    let ln = LayerNorm::<64>::new(&Cpu);
    let f = check("layer_norm", &ln);
    assert_eq!(ln.repr(), f["repr"].as_str().expect("repr"));
    let bn = BatchNorm2d::<8>::new(&Cpu);
    let f = check("batch_norm", &bn);
    assert_eq!(bn.repr(), f["repr"].as_str().expect("repr"));
}

#[test]
fn state_dicts_round_trip_between_models() {
    let a = lenet5::LeNet5::<f32, Cpu>::new(&Cpu, &mut Rng::seed_from(1));
    let mut b = lenet5::LeNet5::<f64, Cpu>::new(&Cpu, &mut Rng::seed_from(2));
    b.copy_from(&a).expect("same architecture");
    let wa = a.fc3.weight.to_vec();
    let wb = b.fc3.weight.to_vec();
    assert!(wa
        .iter()
        .zip(&wb)
        .all(|(x, y)| (*x as f64 - y).abs() < 1e-7));
}

#[test]
fn models_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    let m = lenet5::LeNet5::<f32, Cpu>::new(&Cpu, &mut Rng::seed_from(0));
    send_sync(&m);
    send_sync(&encoder_block::EncoderBlock::new(&mut Rng::seed_from(0)));
    // Concurrent inference through a shared reference gives the same answer.
    let x = Tensor::<(Dyn, C<1>, C<28>, C<28>)>::randn((Dyn(1), C, C, C), &mut Rng::seed_from(1));
    let want = m.forward(x.clone()).to_vec();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| assert_eq!(m.forward(x.clone()).to_vec(), want));
        }
    });
}
