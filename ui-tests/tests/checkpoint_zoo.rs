//! Checkpoints move both ways between PyTorch and Forma, for a zoo of models
//! (`tools/gen_checkpoint_fixtures.py` builds the PyTorch side):
//!
//! - PyTorch -> Forma: each PyTorch checkpoint in `tools/fixtures/zoo/` loads
//!   strictly into its Forma twin, which then gives PyTorch's output.
//! - Forma -> PyTorch: each twin, with weights drawn by Forma, saves a file;
//!   the generator loaded those files with `load_state_dict(strict=True)` and
//!   recorded PyTorch's outputs, which Forma's own outputs must equal. The
//!   committed files must be exactly what this code saves (so they cannot go
//!   stale); `FORMA_WRITE_ZOO=1` rewrites them, after which the generator is
//!   rerun.

#![allow(dead_code)] // each included pass case brings its own `main`

mod lenet5 {
    include!("pass/model_lenet5.rs");
}

use forma::core::{Backend, Dtype, Shape};
use forma::nn::layers::transformer::TransformerOptions;
use forma::nn::layers::{
    BatchNorm2d, Conv2d, LayerNorm, Linear, Lstm, Relu, TransformerEncoderLayer,
};
use forma::nn::module::{downcast_mut, Cx, Role, VisitorMut};
use forma::nn::state::file::{load_file, to_bytes};
use forma::nn::{Checkpoint, StateDict};
use forma::prelude::*;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tools/fixtures")
}

fn io() -> Checkpoint {
    load_file(fixtures().join("zoo_io.safetensors")).expect("zoo_io fixture")
}

fn input<S: Shape>(name: &str, shape: S) -> Tensor<S> {
    let d = io()
        .tensors
        .get(&format!("{name}.input"))
        .expect("input")
        .clone();
    Tensor::from_vec(d.to_vec(), shape).expect("input shape")
}

fn expected(file: &str, name: &str) -> Vec<f32> {
    let ck = load_file(fixtures().join(file)).expect("fixture");
    ck.tensors
        .get(&format!("{name}.output"))
        .expect("output")
        .to_vec()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
            "{what}: element {i}: {g} vs {w}"
        );
    }
}

/// Draws every float parameter and buffer from `seed` (running variances
/// positive), so that Forma's saved files are far from any default init.
fn randomise<M: Module>(m: &mut M, seed: u64) {
    struct Draw(Rng);
    impl VisitorMut for Draw {
        fn tensor<S: Shape, E: Dtype, D: Backend>(
            &mut self,
            cx: &Cx,
            t: &mut forma::core::Tensor<S, E, D>,
        ) {
            let Some(t) = downcast_mut::<_, _, _, f32, Cpu>(t) else {
                return;
            };
            let fan = t.dims().last().copied().unwrap_or(1).max(1) as f64;
            let v = if cx.path().ends_with("running_var") {
                Tensor::<(Dyn,)>::uniform_on((Dyn(t.numel()),), 0.5, 1.5, &mut self.0, &Cpu)
            } else {
                Tensor::<(Dyn,)>::normal_on(
                    (Dyn(t.numel()),),
                    0.0,
                    0.5 / fan.sqrt(),
                    &mut self.0,
                    &Cpu,
                )
            };
            let _ = cx.role() == Role::Parameter;
            t.flatten_all().assign(&v);
        }
    }
    m.visit_mut(&mut Cx::new(), &mut Draw(Rng::seed_from(seed)));
}

/// Both directions for one model; `forward` maps the fixture input to the output values.
fn round_trip<M: Module>(
    name: &str,
    mut fresh: impl FnMut() -> M,
    forward: impl Fn(&M) -> Vec<f32>,
) {
    // PyTorch -> Forma.
    let mut m = fresh();
    m.load_safetensors(fixtures().join(format!("zoo/{name}.safetensors")))
        .unwrap_or_else(|e| panic!("{e}"));
    m.eval();
    assert_close(
        &forward(&m),
        &expected("zoo_io.safetensors", name),
        &format!("{name}: PyTorch weights"),
    );

    // Forma -> PyTorch.
    let mut ours = fresh();
    randomise(&mut ours, 42);
    ours.eval();
    let bytes = to_bytes(&ours.state_dict(), &Default::default()).expect("serialise");
    let path = fixtures().join(format!("zoo_forma/{name}.safetensors"));
    if std::env::var_os("FORMA_WRITE_ZOO").is_some() {
        std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        ours.save_safetensors(&path).expect("save");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        committed == bytes,
        "{name}: the committed Forma file is stale; rerun with FORMA_WRITE_ZOO=1 and the generator"
    );
    assert_close(
        &forward(&ours),
        &expected("zoo_from_forma.safetensors", name),
        &format!("{name}: Forma weights in PyTorch"),
    );
}

// ---------------------------------------------------------------- the twins

#[derive(Module)]
struct Mlp {
    fc1: Linear<784, 64>,
    fc2: Linear<64, 64>,
    fc3: Linear<64, 10>,
    act: Relu,
}

#[derive(Module)]
struct BlockDown {
    conv1: Conv2d<16, 32, 3, 2, 1>,
    bn1: BatchNorm2d<32>,
    relu: Relu,
    conv2: Conv2d<32, 32, 3, 1, 1>,
    bn2: BatchNorm2d<32>,
    downsample: Option<(Conv2d<16, 32, 1, 2>, BatchNorm2d<32>)>,
}

#[derive(Module)]
struct Block {
    conv1: Conv2d<32, 32, 3, 1, 1>,
    bn1: BatchNorm2d<32>,
    relu: Relu,
    conv2: Conv2d<32, 32, 3, 1, 1>,
    bn2: BatchNorm2d<32>,
}

type Map8 = Tensor![Dyn, 32, 4, 4];

fn resnet_forward(m: &(BlockDown, Block), x: Tensor![Dyn, 16, 8, 8]) -> Map8 {
    let (a, b) = m;
    let out: Map8 = a.conv1.forward(x.clone());
    let out: Map8 = a.conv2.forward(a.relu.forward(a.bn1.forward(out)));
    let (dc, dbn) = a.downsample.as_ref().expect("projection");
    let short: Map8 = dbn.forward(dc.forward(x));
    let x = a.relu.forward(&a.bn2.forward(out) + &short);
    let out: Map8 = b.conv1.forward(x.clone());
    let out: Map8 = b.conv2.forward(b.relu.forward(b.bn1.forward(out)));
    b.relu.forward(&b.bn2.forward(out) + &x)
}

/// Hugging Face GPT-2's `Conv1D`: `x @ weight + bias`, weight stored `[in, out]`.
#[derive(Module)]
#[module(extra_repr = "Self::extra")]
struct Conv1D<const IN: usize, const OUT: usize> {
    weight: Tensor<(C<IN>, C<OUT>)>,
    bias: Tensor<(C<OUT>,)>,
}

impl<const IN: usize, const OUT: usize> Conv1D<IN, OUT> {
    fn new() -> Self {
        Conv1D {
            weight: Tensor::zeros(),
            bias: Tensor::zeros(),
        }
    }
    fn extra(&self) -> String {
        format!("nf={OUT}, nx={IN}")
    }
    fn forward(&self, x: &Tensor![Dyn, Dyn, { IN }]) -> Tensor![Dyn, Dyn, { OUT }] {
        &x.matmul(&self.weight) + &self.bias
    }
}

#[derive(Module)]
struct Gpt2Attention {
    c_attn: Conv1D<64, 192>,
    c_proj: Conv1D<64, 64>,
}

#[derive(Module)]
struct Gpt2Mlp {
    c_fc: Conv1D<64, 256>,
    c_proj: Conv1D<256, 64>,
}

#[derive(Module)]
struct Gpt2Block {
    ln_1: LayerNorm<64>,
    attn: Gpt2Attention,
    ln_2: LayerNorm<64>,
    mlp: Gpt2Mlp,
}

impl Gpt2Block {
    fn new() -> Self {
        Gpt2Block {
            ln_1: LayerNorm::new(&Cpu),
            attn: Gpt2Attention {
                c_attn: Conv1D::new(),
                c_proj: Conv1D::new(),
            },
            ln_2: LayerNorm::new(&Cpu),
            mlp: Gpt2Mlp {
                c_fc: Conv1D::new(),
                c_proj: Conv1D::new(),
            },
        }
    }

    fn forward(&self, x: Tensor![Dyn, Dyn, 64]) -> Tensor![Dyn, Dyn, 64] {
        let (b, t) = (x.size(0), x.size(1));
        let qkv = self.attn.c_attn.forward(&self.ln_1.forward(x.clone()));
        let heads = |part: usize| {
            qkv.narrow_static::<2, 64>(part * 64)
                .try_reshape_to((Dyn(b), Dyn(t), Dyn(4), Dyn(16)))
                .expect("heads")
                .transpose::<1, 2>()
        };
        let (q, k, v) = (heads(0), heads(1), heads(2));
        let scores = q.matmul(&k.transpose::<2, 3>()).mul_scalar(0.25);
        let hide: Vec<bool> = (0..t).flat_map(|i| (0..t).map(move |j| j > i)).collect();
        let hide = Tensor::<(Dyn, Dyn), bool>::from_vec(hide, (Dyn(t), Dyn(t))).expect("mask");
        let y = scores
            .masked_fill(&hide, f64::NEG_INFINITY)
            .softmax::<3>()
            .matmul(&v);
        let y = y
            .transpose::<1, 2>()
            .contiguous()
            .try_reshape_to((Dyn(b), Dyn(t), C::<64>))
            .expect("merge");
        let x = &x + &self.attn.c_proj.forward(&y);
        let h = self
            .mlp
            .c_fc
            .forward(&self.ln_2.forward(x.clone()))
            .gelu_tanh();
        &x + &self.mlp.c_proj.forward(&h)
    }
}

// ---------------------------------------------------------------- the tests

fn no_bias<const I: usize, const O: usize, const K: usize, const S: usize, const P: usize>(
    rng: &mut Rng,
) -> Conv2d<I, O, K, S, P> {
    Conv2d::with_options(1, false, &Cpu, rng)
}

#[test]
fn mlp() {
    round_trip(
        "mlp",
        || Mlp {
            fc1: Linear::new(&Cpu, &mut Rng::seed_from(0)),
            fc2: Linear::new(&Cpu, &mut Rng::seed_from(1)),
            fc3: Linear::new(&Cpu, &mut Rng::seed_from(2)),
            act: Relu,
        },
        |m| {
            let x = input("mlp", (Dyn(4), C::<784>));
            let h = m.act.forward(m.fc1.forward(x));
            let h = m.act.forward(m.fc2.forward(h));
            m.fc3.forward(h).to_vec()
        },
    );
}

#[test]
fn lenet5() {
    round_trip(
        "lenet5",
        || lenet5::LeNet5::<f32, Cpu>::new(&Cpu, &mut Rng::seed_from(0)),
        |m| {
            let y: Tensor<(Dyn, C<10>)> = m.forward(input("lenet5", (Dyn(2), C, C, C)));
            y.to_vec()
        },
    );
}

#[test]
fn resnet_stack() {
    round_trip(
        "resnet_stack",
        || {
            let mut rng = Rng::seed_from(0);
            (
                BlockDown {
                    conv1: no_bias(&mut rng),
                    bn1: BatchNorm2d::new(&Cpu),
                    relu: Relu,
                    conv2: no_bias(&mut rng),
                    bn2: BatchNorm2d::new(&Cpu),
                    downsample: Some((no_bias(&mut rng), BatchNorm2d::new(&Cpu))),
                },
                Block {
                    conv1: no_bias(&mut rng),
                    bn1: BatchNorm2d::new(&Cpu),
                    relu: Relu,
                    conv2: no_bias(&mut rng),
                    bn2: BatchNorm2d::new(&Cpu),
                },
            )
        },
        |m| resnet_forward(m, input("resnet_stack", (Dyn(2), C, C, C))).to_vec(),
    );
}

#[test]
fn gpt2_block_in_hugging_face_layout() {
    round_trip("gpt2_block", Gpt2Block::new, |m| {
        m.forward(input("gpt2_block", (Dyn(2), Dyn(6), C))).to_vec()
    });
}

#[test]
fn transformer_encoder_layer() {
    round_trip(
        "encoder_layer",
        || {
            let options = TransformerOptions {
                dropout: 0.0,
                ..TransformerOptions::default()
            };
            TransformerEncoderLayer::<64, 4, 128>::with_options(
                options,
                &Cpu,
                &mut Rng::seed_from(0),
            )
        },
        |m| {
            m.forward(input("encoder_layer", (Dyn(2), Dyn(5), C::<64>)))
                .to_vec()
        },
    );
}

/// PyTorch's zoo wraps `nn.LSTM` in a module attribute `lstm`.
#[derive(Module)]
struct LstmNet {
    lstm: Lstm<8, 16>,
}

#[test]
fn lstm() {
    round_trip(
        "lstm",
        || LstmNet {
            lstm: Lstm::new(2, &Cpu, &mut Rng::seed_from(0)),
        },
        |m| {
            let (y, _): (Tensor<(Dyn, Dyn, C<16>)>, _) = m
                .lstm
                .forward_with(input("lstm", (Dyn(2), Dyn(5), C::<8>)), None);
            y.to_vec()
        },
    );
}

#[test]
fn a_state_dict_survives_save_and_load() {
    let mut a = Gpt2Block::new();
    randomise(&mut a, 5);
    let dir = std::env::temp_dir().join(format!("forma-zoo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gpt2.safetensors");
    a.save_safetensors(&path).unwrap();
    let mut b = Gpt2Block::new();
    b.load_safetensors(&path).unwrap();
    let sa: StateDict = a.state_dict();
    assert_eq!(sa, b.state_dict());
    std::fs::remove_dir_all(dir).unwrap();
}
