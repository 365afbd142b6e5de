//! `forma::compile` on the model zoo's transformers: BERT and GPT-2 (small
//! sizes, random weights) give the eager outputs and every parameter's
//! gradient bit for bit through a compiled model, in eval mode and in
//! training mode without dropout, at two sequence lengths from one graph.
//! With dropout in training mode the forward runs eagerly (explained), and
//! still gives the eager values.

use forma::core::{Backend, Dtype, Shape};
use forma::nn::compile::Compiled;
use forma::nn::module::{Cx, Role, Visitor};
use forma::nn::Module;
use forma::prelude::*;
use forma::TensorData;
use forma_models::bert::{Bert, BertConfig, BertOutputs};
use forma_models::gpt2::{Gpt2Config, Gpt2LMHeadModel};

type TinyBert = Bert<143, 32, 4, 37, 40, 2>;
type TinyGpt2 = Gpt2LMHeadModel<320, 64, 32, 96, 4, 128>;

/// Every parameter's gradient, by `state_dict` key.
fn grads<M: Module>(model: &M) -> Vec<(String, Option<TensorData>)> {
    struct Grads(Vec<(String, Option<TensorData>)>);
    impl Visitor for Grads {
        fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, D>) {
            if cx.role() != Role::Parameter {
                return;
            }
            let g = t
                .grad()
                .map(|g| g.try_to_data().expect("a gradient on the host"));
            self.0.push((cx.path().to_string(), g));
        }
    }
    let mut g = Grads(Vec::new());
    model.visit(&mut Cx::new(), &mut g);
    g.0
}

/// Asserts that every parameter of `compiled` got the gradient it got in
/// `eager`, bit for bit, then clears both.
fn same_gradients<M: Module>(eager: &M, compiled: &M, what: &str) {
    let (gw, gg) = (grads(eager), grads(compiled));
    assert!(gw.iter().all(|(_, g)| g.is_some()), "every weight learns");
    assert_eq!(gg, gw, "gradients, {what}");
    eager.zero_grad();
    compiled.zero_grad();
}

/// Asserts that two calls of one signature captured once and replayed.
fn captured_once<M>(compiled: &Compiled<M>, what: &str) {
    let s = compiled.stats();
    assert_eq!(
        (s.compiles, s.cache_hits, s.fallbacks),
        (1, 1, 0),
        "{what}: {:?}",
        compiled.explain()
    );
}

fn ids(batch: usize, len: usize, vocab: i64) -> Tensor<(Dyn, Dyn), i64> {
    let v: Vec<i64> = (0..batch * len)
        .map(|i| (i as i64 * 37 + 5) % vocab)
        .collect();
    Tensor::from_vec(v, (Dyn(batch), Dyn(len))).unwrap()
}

/// A loss that reads every output position (and the pooler's).
fn bert_loss(out: &BertOutputs<32>) -> Tensor<()> {
    &out.last_hidden_state.square().mean_all() + &out.pooler_output.sum_all()
}

fn bert(training: bool, dropout: f64) -> TinyBert {
    let mut config = BertConfig::with_layers(2);
    config.hidden_dropout_prob = dropout;
    config.attention_probs_dropout_prob = dropout;
    let mut m = TinyBert::new(&config, &Cpu, &mut Rng::seed_from(11));
    m.set_training(training);
    m
}

#[test]
fn a_compiled_bert_gives_the_eager_outputs_and_gradients() {
    for training in [false, true] {
        let (eager, compiled) = (bert(training, 0.0), forma::compile(bert(training, 0.0)));
        for (b, len) in [(2, 7), (3, 12)] {
            let x = ids(b, len, 143);
            let want = eager.forward(x.clone());
            let got = compiled.forward(x);
            assert_eq!(
                got.last_hidden_state.to_vec(),
                want.last_hidden_state.to_vec(),
                "last_hidden_state, training {training}, [{b}, {len}]"
            );
            assert_eq!(
                got.pooler_output.to_vec(),
                want.pooler_output.to_vec(),
                "pooler_output, training {training}, [{b}, {len}]"
            );
            bert_loss(&want).backward();
            bert_loss(&got).backward();
            same_gradients(
                &eager,
                compiled.eager(),
                &format!("training {training}, [{b}, {len}]"),
            );
        }
        captured_once(&compiled, &format!("training {training}"));
    }
}

#[test]
fn a_compiled_bert_with_dropout_in_training_runs_eagerly_and_says_why() {
    let compiled = forma::compile(bert(true, 0.1));
    let _ = compiled.forward(ids(2, 5, 143));
    let why = compiled.explain();
    assert_eq!(why.len(), 1);
    assert!(why[0].reason.contains("dropout"), "{why:?}");
    assert!(why[0].signature.ends_with("train"), "{why:?}");
    assert_eq!(compiled.stats().fallbacks, 1);
    // In eval mode the same model compiles.
    let mut compiled = compiled;
    compiled.eager_mut().eval();
    let eager = compiled.eager().forward(ids(2, 5, 143));
    let got = compiled.forward(ids(2, 5, 143));
    assert_eq!(
        got.last_hidden_state.to_vec(),
        eager.last_hidden_state.to_vec()
    );
    assert_eq!(compiled.stats().fallbacks, 1);
}

fn gpt2(training: bool) -> TinyGpt2 {
    let config = Gpt2Config::with_layers(2).without_dropout();
    let mut m = TinyGpt2::new(&config, &Cpu, &mut Rng::seed_from(12));
    m.set_training(training);
    m
}

#[test]
fn a_compiled_gpt2_gives_the_eager_logits_and_gradients() {
    for training in [false, true] {
        let (eager, compiled) = (gpt2(training), forma::compile(gpt2(training)));
        for (b, len) in [(1, 9), (2, 16)] {
            let x = ids(b, len, 320);
            let want: Tensor<(Dyn, Dyn, C<320>)> = eager.forward(x.clone());
            let got: Tensor<(Dyn, Dyn, C<320>)> = compiled.forward(x);
            assert_eq!(
                got.to_vec(),
                want.to_vec(),
                "logits, training {training}, [{b}, {len}]"
            );
            want.log_softmax::<-1>().mean_all().backward();
            got.log_softmax::<-1>().mean_all().backward();
            same_gradients(
                &eager,
                compiled.eager(),
                &format!("training {training}, [{b}, {len}]"),
            );
        }
        captured_once(&compiled, &format!("training {training}"));
    }
}
