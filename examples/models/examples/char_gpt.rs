//! A character-level GPT trained on the project's own docs (README.md,
//! CONTRIBUTING.md, core/src/ops/README.md and ui-tests/README.md, about
//! 20 KB, compiled in), then sampled with the KV cache.
//!
//! ```sh
//! cargo run --release -p forma-models --example char_gpt            # ~1 minute
//! cargo run --release -p forma-models --example char_gpt -- 20      # a 20-second budget
//! cargo run --release -p forma-models --example char_gpt -- 60 0.001 16   # seconds, lr, batch
//! ```
//!
//! The model is [`Gpt2LMHeadModel`] with GPT-2's layout at a small size:
//! one token per byte (vocabulary 128, ASCII; other bytes become `?`),
//! context 64, hidden 64, 4 heads, 2 blocks, no dropout. It trains with
//! AdamW (lr 0.003 by default) on batches of 8 random 64-byte windows for the
//! time budget (seconds, default 60), printing the mean loss per range of
//! steps, then prints a top-k sample. Small batches give more updates in the
//! budget, which is what a one-minute run on two cores is short of.

use forma::nn::loss::{cross_entropy, Mean};
use forma::nn::optim::{AdamW, AdamWOptions};
use forma::nn::Module;
use forma::prelude::*;
use forma_models::gpt2::{Gpt2Config, Gpt2LMHeadModel, Sampling};
use std::time::{Duration, Instant};

/// Vocabulary 128 (ASCII), context 64, hidden 64 (QKV 192), 4 heads, MLP 256.
type CharGpt = Gpt2LMHeadModel<128, 64, 64, 192, 4, 256>;

const TEXT: &str = concat!(
    include_str!("../../../README.md"),
    "\n",
    include_str!("../../../CONTRIBUTING.md"),
    "\n",
    include_str!("../../../core/src/ops/README.md"),
    "\n",
    include_str!("../../../ui-tests/README.md"),
);
const CONTEXT: usize = 64;
const REPORT_EVERY: usize = 25;

fn encode(text: &str) -> Vec<i64> {
    text.bytes()
        .map(|b| {
            if b < 128 {
                i64::from(b)
            } else {
                i64::from(b'?')
            }
        })
        .collect()
}

fn decode(ids: &[i64]) -> String {
    ids.iter().map(|&i| char::from(i as u8)).collect()
}

/// `size` random windows: inputs and the same windows shifted by one.
fn batch(
    data: &[i64],
    size: usize,
    rng: &mut Rng,
) -> (Tensor<(Dyn, Dyn), i64>, Tensor<(Dyn,), i64>) {
    let mut x = Vec::with_capacity(size * CONTEXT);
    let mut y = Vec::with_capacity(size * CONTEXT);
    for _ in 0..size {
        let start = rng.below((data.len() - CONTEXT - 1) as u64) as usize;
        x.extend_from_slice(&data[start..start + CONTEXT]);
        y.extend_from_slice(&data[start + 1..start + CONTEXT + 1]);
    }
    let x = Tensor::from_vec(x, (Dyn(size), Dyn(CONTEXT))).expect("size x CONTEXT ids");
    let y = Tensor::from_vec(y, (Dyn(size * CONTEXT),)).expect("size x CONTEXT targets");
    (x, y)
}

fn main() {
    let arg = |i: usize, what: &str, default: f64| {
        std::env::args()
            .nth(i)
            .map(|s| {
                s.parse::<f64>()
                    .unwrap_or_else(|_| panic!("{what}: not a number: {s}"))
            })
            .unwrap_or(default)
    };
    let budget = arg(1, "seconds", 60.0);
    let lr = arg(2, "learning rate", 0.003);
    let size = arg(3, "batch size", 8.0) as usize;
    let data = encode(TEXT);
    let mut rng = Rng::seed_from(1234);
    let config = Gpt2Config::with_layers(2).without_dropout();
    let mut model = CharGpt::new(&config, &Cpu, &mut rng);
    println!(
        "char GPT: {} parameters, {} bytes of text, batches of {size} x {CONTEXT}, lr {lr}, {budget} s",
        model.num_parameters(),
        data.len()
    );
    let mut opt: AdamW = AdamW::new(AdamWOptions::default().lr(lr));

    let start = Instant::now();
    let (mut step, mut sum, mut first, mut last) = (0usize, 0.0f64, None, 0.0f64);
    while start.elapsed() < Duration::from_secs_f64(budget) {
        let (x, y) = batch(&data, size, &mut rng);
        let logits = model.forward(x);
        let logits = logits
            .try_reshape_to((Dyn(size * CONTEXT), C::<128>))
            .expect("the logits are size x CONTEXT rows");
        let loss = cross_entropy(&logits, &y, Mean);
        sum += f64::from(loss.item());
        opt.zero_grad(&model);
        loss.backward();
        opt.step(&model);
        step += 1;
        if step % REPORT_EVERY == 0 {
            let mean = sum / REPORT_EVERY as f64;
            first.get_or_insert(mean);
            last = mean;
            println!(
                "steps {:>4}-{:>4}: loss {mean:.3} ({:.0} s)",
                step - REPORT_EVERY + 1,
                step,
                start.elapsed().as_secs_f64()
            );
            sum = 0.0;
        }
    }
    if let Some(first) = first {
        println!("loss {first:.3} -> {last:.3} in {step} steps");
    }

    model.eval();
    let prompt = encode("Forma ");
    let out = model
        .generate(
            &prompt,
            CONTEXT - prompt.len(),
            Sampling::TopK {
                k: 5,
                temperature: 0.8,
            },
            &mut rng,
        )
        .expect("the prompt and sample fit the context");
    println!(
        "sample (KV cache, top-5, temperature 0.8):\n{}",
        decode(&out)
    );
}
