//! 07: a small transformer — token and position embeddings, encoder layers
//! with multi-head self-attention, trained to sort digit sequences.
//!
//! Run with `cargo run --release -p forma-examples --example 07-transformer`.
//!
//! The task is generated: the input is 8 random digits, the target the same
//! digits sorted. Each output position must find the digit of its rank,
//! which takes comparing every digit with the others (attention on content)
//! and knowing which rank it stands for (the position embedding). Guessing
//! gets 10% of the digits right.

use forma::core::tape::no_grad;
use forma::nn::layers::{Embedding, Linear, TransformerEncoderLayer, TransformerOptions};
use forma::nn::loss::{cross_entropy, Mean};
use forma::nn::optim::{Adam, AdamOptions};
use forma::prelude::*;
use std::time::Instant;

/// Sequence length.
const T: usize = 8;
/// Model width; 4 heads of 8.
const D_MODEL: usize = 32;
/// Optimizer steps, each on 64 fresh sequences.
const STEPS: usize = 480;

type Tokens = Tensor<(Dyn, C<T>), i64>;

#[derive(Module)]
struct Sorter {
    /// `nn.Embedding(10, 32)`: one vector per digit.
    tok: Embedding<10, D_MODEL>,
    /// A learned position embedding (GPT-2's `wpe`).
    pos: Embedding<T, D_MODEL>,
    /// `[0, 1, ..., T-1]`, the positions looked up in `pos`: a buffer, not
    /// saved (`persistent=False`), like Hugging Face's `position_ids`.
    #[module(buffer(persistent = false))]
    positions: Tensor<(C<T>,), i64>,
    /// `nn.TransformerEncoderLayer(32, 4, 64, dropout=0, batch_first=True)`, twice.
    /// `<30, 4, 64>` fails `cargo build`: "MultiheadAttention: an embedding
    /// size of 30 cannot be split into 4 heads of equal size".
    layers: Vec<TransformerEncoderLayer<D_MODEL, 4, 64>>,
    /// Scores for the 10 digits at every position.
    head: Linear<D_MODEL, 10>,
}

impl Sorter {
    fn new(rng: &mut Rng) -> Self {
        // No dropout: the task has unlimited fresh data.
        let options = TransformerOptions {
            dropout: 0.0,
            ..TransformerOptions::default()
        };
        Sorter {
            tok: Embedding::new(&Cpu, rng),
            pos: Embedding::new(&Cpu, rng),
            positions: Tensor::from_vec((0..T as i64).collect(), (C,)).expect("T positions"),
            layers: (0..2)
                .map(|_| TransformerEncoderLayer::with_options(options, &Cpu, rng))
                .collect(),
            head: Linear::new(&Cpu, rng),
        }
    }

    fn forward(&self, tokens: Tokens) -> Tensor<(Dyn, C<T>, C<10>)> {
        let x: Tensor<(Dyn, C<T>, C<D_MODEL>)> = self.tok.forward(tokens);
        let p: Tensor<(C<T>, C<D_MODEL>)> = self.pos.forward(self.positions.clone());
        // [B, T, 32] + [T, 32]: the positions broadcast over the batch.
        let mut h = &x + &p;
        for layer in &self.layers {
            h = layer.forward(h);
        }
        self.head.forward(h)
    }
}

/// `n` random sequences and the same sorted.
fn batch(n: usize, rng: &mut Rng) -> (Tokens, Tokens) {
    let seqs: Vec<Vec<i64>> = (0..n)
        .map(|_| (0..T).map(|_| rng.below(10) as i64).collect())
        .collect();
    let sorted: Vec<i64> = seqs
        .iter()
        .flat_map(|s| {
            let mut s = s.clone();
            s.sort_unstable();
            s
        })
        .collect();
    let inputs: Vec<i64> = seqs.into_iter().flatten().collect();
    (
        Tensor::from_vec(inputs, (Dyn(n), C)).expect("n x T"),
        Tensor::from_vec(sorted, (Dyn(n), C)).expect("n x T"),
    )
}

/// Digit accuracy and whole-sequence accuracy, without a graph.
fn evaluate(model: &Sorter, x: &Tokens, y: &Tokens) -> (f64, f64) {
    let _no_grad = no_grad();
    let pred = model.forward(x.clone()).argmax::<2>().to_vec();
    let truth = y.to_vec();
    let digits = pred.iter().zip(&truth).filter(|(p, t)| p == t).count();
    let seqs = pred
        .chunks(T)
        .zip(truth.chunks(T))
        .filter(|(p, t)| p == t)
        .count();
    (
        digits as f64 / truth.len() as f64,
        seqs as f64 / (truth.len() / T) as f64,
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let mut rng = Rng::seed_from(0);
    let model = Sorter::new(&mut rng);
    println!("{}\n{} parameters\n", model.repr(), model.num_parameters());

    let mut data_rng = Rng::seed_from(1);
    let (test_x, test_y) = batch(1000, &mut data_rng);
    let (acc, _) = evaluate(&model, &test_x, &test_y);
    println!(
        "before training: {:.1}% of digits right (chance: 10%)",
        100.0 * acc
    );

    let mut opt: Adam = Adam::try_new(AdamOptions::default().lr(2e-3))?;
    for step in 1..=STEPS {
        let (x, y) = batch(64, &mut data_rng);
        opt.zero_grad(&model);
        // [B, T, 10] scores and [B, T] targets, flattened to [B*T, 10] and
        // [B*T] for cross-entropy (PyTorch's `logits.view(-1, 10)`).
        let logits = model.forward(x).reshape::<(Dyn, C<10>)>();
        let loss = cross_entropy(&logits, &y.reshape::<(Dyn,)>(), Mean);
        loss.backward();
        opt.try_step(&model)?;
        if step % (STEPS / 6) == 0 {
            let (digits, seqs) = evaluate(&model, &test_x, &test_y);
            println!(
                "step {step:>3}  loss {:.4}  held-out: {:5.1}% of digits, {:5.1}% of whole sequences",
                loss.item(),
                100.0 * digits,
                100.0 * seqs
            );
        }
    }

    let (x, _) = batch(1, &mut data_rng);
    let pred = {
        let _no_grad = no_grad();
        model.forward(x.clone()).argmax::<2>().to_vec()
    };
    println!("\ninput  {:?}\nsorted {pred:?}", x.to_vec());
    println!("done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}
