//! `forma::compile`: a compiled model gives the eager outputs and gradients
//! bit for bit, at batch sizes and sequence lengths other than the one it
//! was captured at; it captures once per signature and counts hits; a
//! forward that capture cannot follow runs eagerly and is explained; an
//! optimizer step on the model is seen by the next compiled call.

use forma::nn::compile::{compile_with, CompileOptions};
use forma::nn::layers::{
    Conv2d, Embedding, Flatten, Linear, MaxPool2d, Relu, TransformerEncoderLayer,
};
use forma::nn::optim::{Optimizer, Sgd, SgdOptions};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 1, 12, 12], output = [B, 10])]
struct Cnn {
    conv: Conv2d<1, 4, 3>,
    act: Relu,
    pool: MaxPool2d<2>,
    flatten: Flatten,
    fc: Linear<100, 10>,
}

fn cnn(seed: u64) -> Cnn {
    let mut rng = Rng::seed_from(seed);
    Cnn {
        conv: Conv2d::new(&Cpu, &mut rng),
        act: Relu,
        pool: MaxPool2d,
        flatten: Flatten,
        fc: Linear::new(&Cpu, &mut rng),
    }
}

fn image(b: usize, seed: u64) -> Tensor<(Dyn, C<1>, C<12>, C<12>)> {
    Tensor::randn((Dyn(b), C, C, C), &mut Rng::seed_from(seed))
}

#[test]
fn a_compiled_cnn_gives_the_eager_outputs_at_every_batch_size() {
    let model = forma::compile(cnn(0));
    for (i, b) in [2, 3, 7, 1].into_iter().enumerate() {
        let x = image(b, i as u64);
        let eager = model.eager().forward(x.clone());
        let y = model.forward(x);
        assert_eq!(y.shape().dims(), eager.shape().dims());
        assert_eq!(y.to_vec(), eager.to_vec(), "batch {b}");
    }
    let s = model.stats();
    assert_eq!((s.compiles, s.cache_hits, s.fallbacks), (1, 3, 0));
    assert!(model.explain().is_empty());
}

#[test]
fn a_compiled_encoder_layer_gives_the_eager_outputs_at_other_lengths() {
    let mut rng = Rng::seed_from(1);
    let mut layer = TransformerEncoderLayer::<16, 4, 32>::new(&Cpu, &mut rng);
    layer.eval();
    let model = forma::compile(layer);
    for (b, s) in [(2, 5), (3, 9), (1, 1)] {
        let x = Tensor::<(Dyn, Dyn, C<16>)>::randn((Dyn(b), Dyn(s), C), &mut rng);
        let eager = model.eager().forward(x.clone()).to_vec();
        assert_eq!(model.forward(x).to_vec(), eager, "batch {b}, length {s}");
    }
    assert_eq!(model.stats().compiles, 1);
    assert_eq!(model.stats().fallbacks, 0, "{:?}", model.explain());
}

/// Token ids in, through an embedding (an index input), a softmax along a
/// runtime axis, a transpose and a broadcast mean.
#[derive(Module)]
struct Bag {
    emb: Embedding<10, 4>,
    fc: Linear<4, 3>,
}

impl Forward<Tensor<(Dyn, Dyn), i64>, Tensor<(Dyn, Dyn, C<3>)>> for Bag {
    fn try_forward(&self, ids: Tensor<(Dyn, Dyn), i64>) -> forma::Result<Tensor<(Dyn, Dyn, C<3>)>> {
        let h: Tensor<(Dyn, Dyn, C<4>)> = child!(self.emb, ids)?;
        let h = h.gelu().softmax::<1>();
        let y: Tensor<(Dyn, Dyn, C<3>)> = child!(self.fc, h)?;
        let t = y.transpose::<0, 1>().contiguous().transpose::<0, 1>();
        t.try_add(&y.mean_keepdim::<1>())
    }
}

#[test]
fn token_ids_replay_through_an_embedding_and_runtime_axes() {
    let mut rng = Rng::seed_from(3);
    let model = forma::compile(Bag {
        emb: Embedding::new(&Cpu, &mut rng),
        fc: Linear::new(&Cpu, &mut rng),
    });
    for (b, s) in [(2, 3), (4, 6)] {
        let ids: Vec<i64> = (0..b * s).map(|i| (i * 7 % 10) as i64).collect();
        let ids = Tensor::<(Dyn, Dyn), i64>::from_vec(ids, (Dyn(b), Dyn(s))).unwrap();
        let eager = model.eager().forward(ids.clone()).to_vec();
        assert_eq!(model.forward(ids).to_vec(), eager);
    }
    let s = model.stats();
    assert_eq!(
        (s.compiles, s.cache_hits, s.fallbacks),
        (1, 1, 0),
        "{:?}",
        model.explain()
    );
}

#[test]
fn training_through_a_compiled_model_gives_the_eager_gradients_and_sees_each_step() {
    let (compiled, eager) = (forma::compile(cnn(5)), cnn(5));
    let mut opts = (
        Sgd::new(SgdOptions::default().lr(0.1).momentum(0.9)),
        Sgd::new(SgdOptions::default().lr(0.1).momentum(0.9)),
    );
    for step in 0..3 {
        let x = image(4 + step, 10 + step as u64);
        let a = compiled.forward(x.clone()).square().mean_all();
        let b = eager.forward(x).square().mean_all();
        assert_eq!(a.to_vec(), b.to_vec(), "loss at step {step}");
        a.backward();
        b.backward();
        let ga = compiled.eager().fc.weight.grad().unwrap().to_vec();
        let gb = eager.fc.weight.grad().unwrap().to_vec();
        assert_eq!(ga, gb, "fc.weight's gradient at step {step}");
        let ga = compiled.eager().conv.weight.grad().unwrap().to_vec();
        let gb = eager.conv.weight.grad().unwrap().to_vec();
        assert_eq!(ga, gb, "conv.weight's gradient at step {step}");
        opts.0.step(&compiled);
        opts.1.step(&eager);
        opts.0.zero_grad(&compiled);
        opts.1.zero_grad(&eager);
    }
    let keys = |m: &[(String, forma::nn::TensorInfo)]| -> Vec<String> {
        m.iter().map(|(k, _)| k.clone()).collect()
    };
    assert_eq!(
        keys(&compiled.named_parameters()),
        keys(&eager.named_parameters())
    );
    let s = compiled.stats();
    assert_eq!((s.compiles, s.cache_hits), (1, 2));
}

/// A forward that reads its own activations on the host.
#[derive(Module)]
struct Peeks {
    fc: Linear<4, 4>,
}

impl Forward<Tensor<(Dyn, C<4>)>, Tensor<(Dyn, C<4>)>> for Peeks {
    fn try_forward(&self, x: Tensor<(Dyn, C<4>)>) -> forma::Result<Tensor<(Dyn, C<4>)>> {
        let h: Tensor<(Dyn, C<4>)> = child!(self.fc, x)?;
        if h.to_vec()[0] > 0.0 {
            Ok(h.relu())
        } else {
            Ok(h)
        }
    }
}

#[test]
fn a_forward_capture_cannot_follow_runs_eagerly_and_is_explained() {
    let mut rng = Rng::seed_from(2);
    let model = forma::compile(Peeks {
        fc: Linear::new(&Cpu, &mut rng),
    });
    for _ in 0..2 {
        let x = Tensor::<(Dyn, C<4>)>::randn((Dyn(3), C), &mut rng);
        let eager = model.eager().forward(x.clone()).to_vec();
        assert_eq!(model.forward(x).to_vec(), eager);
    }
    let s = model.stats();
    assert_eq!((s.compiles, s.cache_hits, s.fallbacks), (1, 0, 2));
    let breaks = model.explain();
    assert_eq!(breaks.len(), 1);
    assert!(
        breaks[0].reason.contains("`to_vec`"),
        "{}",
        breaks[0].reason
    );
    assert!(
        breaks[0].signature.contains("f32[_, _]"),
        "{}",
        breaks[0].signature
    );
}

#[test]
fn train_and_eval_are_two_signatures_and_the_cache_keeps_the_newest() {
    let mut rng = Rng::seed_from(7);
    let net = ConvBn {
        conv: Conv2d::new(&Cpu, &mut rng),
        bn: forma::nn::layers::BatchNorm2d::new(&Cpu),
    };
    let mut model = compile_with(net, CompileOptions { cache_size: 1 });
    let x = image(2, 0);
    for training in [true, false, true] {
        model.eager_mut().set_training(training);
        let eager = model.eager().forward(x.clone()).to_vec();
        assert_eq!(model.forward(x.clone()).to_vec(), eager);
    }
    // Cache of one: each switch evicts the other signature.
    assert_eq!(model.stats().compiles, 3);
    model.reset();
    assert_eq!(model.stats(), Default::default());
    let _ = model.forward(x);
    assert_eq!(model.stats().compiles, 1);
}

#[derive(Module, Sequential)]
#[sequential(input = [B, 1, 12, 12], output = [B, 2, 10, 10])]
struct ConvBn {
    conv: Conv2d<1, 2, 3>,
    bn: forma::nn::layers::BatchNorm2d<2>,
}

#[test]
fn batch_norm_in_training_updates_its_statistics_once_per_compiled_call() {
    let build = || {
        let mut rng = Rng::seed_from(9);
        ConvBn {
            conv: Conv2d::new(&Cpu, &mut rng),
            bn: forma::nn::layers::BatchNorm2d::new(&Cpu),
        }
    };
    let (compiled, eager) = (forma::compile(build()), build());
    for i in 0..2 {
        let x = image(3, 20 + i);
        assert_eq!(
            compiled.forward(x.clone()).to_vec(),
            eager.forward(x).to_vec()
        );
        let stats = |m: &ConvBn| m.bn.running_mean.as_ref().unwrap().to_vec();
        assert_eq!(stats(compiled.eager()), stats(&eager), "call {i}");
    }
    // The running-statistics update is an in-place write capture refuses:
    // the forward runs eagerly, and the statistics the capture's runs
    // changed were put back (else they would have moved three times).
    let breaks = compiled.explain();
    assert_eq!(breaks.len(), 1);
    assert!(breaks[0].reason.contains("`bn`"), "{}", breaks[0].reason);
    assert_eq!(compiled.stats().fallbacks, 2);
}

#[test]
fn inference_packs_each_weight_once_and_repacks_after_an_update() {
    let mut rng = Rng::seed_from(11);
    let mut layer = TransformerEncoderLayer::<16, 4, 32>::new(&Cpu, &mut rng);
    layer.eval();
    let model = forma::compile(layer);
    let guard = forma::core::tape::no_grad();
    let x = Tensor::<(Dyn, Dyn, C<16>)>::randn((Dyn(4), Dyn(9), C), &mut rng);
    for _ in 0..2 {
        let eager = model.eager().forward(x.clone()).to_vec();
        assert_eq!(model.forward(x.clone()).to_vec(), eager);
    }
    let packed = model.stats().packed_weights;
    assert!(packed > 0, "{:?}", model.stats());
    // A write into a weight (what an optimizer step does) is seen: the
    // packed copy is made again from the new values.
    let w = &model.eager().linear1.weight;
    let doubled = w.mul_scalar(2.0).try_to_data().unwrap();
    w.try_assign_data(&doubled).unwrap();
    let eager = model.eager().forward(x.clone()).to_vec();
    assert_eq!(model.forward(x.clone()).to_vec(), eager);
    assert_eq!(model.stats().packed_weights, packed);
    // With a gradient wanted, the plain op runs (and the tape records it).
    drop(guard);
    let y = model.forward(x);
    assert!(y.needs_grad());
}

/// A residual unit: `relu(bn(conv(x)) + x)`, the tail of a ResNet block.
#[derive(Module)]
struct Residual {
    conv: Conv2d<2, 2, 3, 1, 1>,
    bn: forma::nn::layers::BatchNorm2d<2>,
}

impl Forward<Tensor<(Dyn, C<2>, C<6>, C<6>)>, Tensor<(Dyn, C<2>, C<6>, C<6>)>> for Residual {
    fn try_forward(
        &self,
        x: Tensor<(Dyn, C<2>, C<6>, C<6>)>,
    ) -> forma::Result<Tensor<(Dyn, C<2>, C<6>, C<6>)>> {
        let c: Tensor<(Dyn, C<2>, C<6>, C<6>)> = self.conv.try_forward(x.clone())?;
        let y: Tensor<(Dyn, C<2>, C<6>, C<6>)> = self.bn.try_forward(c)?;
        Ok((&y + &x).relu())
    }
}

fn residual() -> Residual {
    let mut rng = Rng::seed_from(21);
    let mut m = Residual {
        conv: Conv2d::new(&Cpu, &mut rng),
        bn: forma::nn::layers::BatchNorm2d::new(&Cpu),
    };
    // Statistics and an affine part that are not the identity.
    let set = |t: &Tensor<(C<2>,)>, v: [f32; 2]| {
        t.try_assign_data(
            &Tensor::<(C<2>,)>::from_vec(v.to_vec(), (C,))
                .unwrap()
                .try_to_data()
                .unwrap(),
        )
        .unwrap()
    };
    set(m.bn.running_mean.as_ref().unwrap(), [0.3, -0.2]);
    set(m.bn.running_var.as_ref().unwrap(), [1.7, 0.4]);
    set(m.bn.weight.as_ref().unwrap(), [0.9, -1.3]);
    set(m.bn.bias.as_ref().unwrap(), [0.1, 0.25]);
    m.eval();
    m
}

#[test]
fn the_fusion_pass_merges_batch_norm_residual_and_relu_into_one_node() {
    let m = residual();
    let x = Tensor::<(Dyn, C<2>, C<6>, C<6>)>::randn((Dyn(2), C, C, C), &mut Rng::seed_from(3));
    let mut g = forma::nn::capture::capture(&m, x).unwrap();
    let before = g.nodes.len();
    let made = forma::core::graph::fuse_elementwise(&mut g);
    // The per-channel scale, rsqrt(var + eps) * weight, is one small chain
    // of its own size (not recomputed at every position); the conv's bias,
    // the batch norm, the residual add and the ReLU are the other.
    assert_eq!(made, 2, "{g}");
    assert_eq!(before - g.nodes.len(), 7, "{g}");
    let rows = |n: &forma::core::graph::Node| -> Vec<&'static str> {
        let forma::core::graph::Op::Fused { nodes } = &n.op else {
            return vec![];
        };
        nodes
            .iter()
            .filter_map(|e| match e {
                forma::core::graph::Elem::Unary { name, .. }
                | forma::core::graph::Elem::Binary { name, .. } => Some(*name),
                forma::core::graph::Elem::Arg(_) => None,
            })
            .collect()
    };
    let last = g.nodes.last().unwrap();
    assert_eq!(rows(last), ["add", "sub", "mul", "add", "add", "relu"]);
    assert_eq!(last.inputs.len(), 6);
    let scale = g
        .nodes
        .iter()
        .find(|n| rows(n) == ["add_scalar", "rsqrt", "mul"]);
    assert!(scale.is_some(), "{g}");
}

#[test]
fn fused_chains_give_the_eager_values_bit_for_bit_with_and_without_a_tape() {
    let model = forma::compile(residual());
    let eager = residual();
    for b in [1, 3, 5] {
        let x = Tensor::<(Dyn, C<2>, C<6>, C<6>)>::randn(
            (Dyn(b), C, C, C),
            &mut Rng::seed_from(b as u64),
        );
        {
            let _g = forma::core::tape::no_grad();
            assert_eq!(
                model.forward(x.clone()).to_vec(),
                eager.forward(x.clone()).to_vec()
            );
        }
        // With a gradient wanted the ops run one by one on the tape.
        let xs = x.clone().requires_grad();
        let y = model.forward(xs.clone());
        y.sum_all().backward();
        let xe = x.requires_grad();
        let ye = eager.forward(xe.clone());
        ye.sum_all().backward();
        assert_eq!(y.to_vec(), ye.to_vec());
        assert_eq!(xs.grad().unwrap().to_vec(), xe.grad().unwrap().to_vec());
    }
    assert!(model.stats().fused_nodes >= 1, "{:?}", model.stats());
}

/// Every parameter's gradient of `m`, by `state_dict` key, in f32.
fn grads_of<M: Module>(m: &M) -> Vec<(String, Option<Vec<f32>>)> {
    struct G(Vec<(String, Option<Vec<f32>>)>);
    impl forma::nn::module::Visitor for G {
        fn tensor<S: forma::core::Shape, E: forma::core::Dtype, D: forma::core::Backend>(
            &mut self,
            cx: &forma::nn::module::Cx,
            t: &Tensor<S, E, D>,
        ) {
            let g = t.grad().map(|g| g.try_to_dtype::<f32>().unwrap().to_vec());
            self.0.push((cx.path().to_string(), g));
        }
    }
    let mut g = G(Vec::new());
    m.visit(&mut forma::nn::module::Cx::new(), &mut g);
    g.0
}

/// A recurrent stack replays as one node (the input projections of all
/// steps in one product, then the time loop), giving the eager outputs
/// and gradients bit for bit in training and eval mode, at every batch
/// size and length, a batch of one included.
#[test]
fn compiled_lstm_and_gru_stacks_give_the_eager_outputs_and_gradients() {
    use forma::nn::layers::{Gru, Lstm};
    fn check<M>(name: &str, make: impl Fn() -> M)
    where
        M: Module + Forward<Tensor<(Dyn, Dyn, C<6>)>, Tensor<(Dyn, Dyn, Dyn)>>,
    {
        for training in [true, false] {
            let (mut eager, mut compiled) = (make(), make());
            eager.set_training(training);
            compiled.set_training(training);
            let compiled = forma::compile(compiled);
            for (i, (b, t)) in [(1, 5), (3, 2), (2, 7)].into_iter().enumerate() {
                let x = Tensor::<(Dyn, Dyn, C<6>)>::randn(
                    (Dyn(b), Dyn(t), C),
                    &mut Rng::seed_from(40 + i as u64),
                );
                let want = eager.forward(x.clone());
                let got = compiled.forward(x);
                assert_eq!(got.to_vec(), want.to_vec(), "{name}, [{b}, {t}]");
                want.square().mean_all().backward();
                got.square().mean_all().backward();
                let (gw, gg) = (grads_of(&eager), grads_of(compiled.eager()));
                assert!(gw.iter().all(|(_, g)| g.is_some()), "{name}: all learn");
                assert_eq!(gg, gw, "{name} gradients, [{b}, {t}]");
                eager.zero_grad();
                compiled.eager().zero_grad();
            }
            let s = compiled.stats();
            assert_eq!(
                (s.compiles, s.cache_hits, s.fallbacks),
                (1, 2, 0),
                "{name}: {:?}",
                compiled.explain()
            );
        }
    }
    check("lstm", || {
        Lstm::<6, 5>::new(2, &Cpu, &mut Rng::seed_from(30))
    });
    check("bidirectional gru", || {
        Gru::<6, 4, true>::new(2, &Cpu, &mut Rng::seed_from(31))
    });
}
