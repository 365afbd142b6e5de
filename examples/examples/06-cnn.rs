//! 06: a small CNN trained on digits — typed convolution shapes, a data
//! loader, Adam, train and eval modes, evaluation without a graph.
//!
//! Run with `cargo run --release -p forma-examples --example 06-cnn`
//! (about 10 s on 2 cores once built).
//!
//! The digits are drawn by `forma_examples::digits` (no download). This is
//! the main job in miniature: `cargo run --release -p forma-examples
//! --example train` trains a LeNet on more images with a progress bar,
//! learning-rate decay, checkpoints, resume, metrics and a plot, and reads
//! real MNIST with `--download` or `--data DIR`.

use forma::core::tape::no_grad;
use forma::nn::data::{DataLoader, Dataset};
use forma::nn::layers::{Conv2d, Dropout, Flatten, Linear, MaxPool2d, Relu};
use forma::nn::loss::{cross_entropy, Mean};
use forma::nn::optim::{Adam, AdamOptions};
use forma::prelude::*;
use forma_examples::digits::DigitSet;
use std::sync::Arc;
use std::time::Instant;

type Images = Tensor<(Dyn, C<1>, C<28>, C<28>)>;
type Labels = Tensor<(Dyn,), i64>;

/// Each line's comment is the shape the derive works out; a wrong size
/// anywhere (say `Linear<785, 10>`) fails the build naming the field.
#[derive(Module, Sequential)]
#[sequential(input = [B, 1, 28, 28], output = [B, 10])]
struct Net {
    conv1: Conv2d<1, 8, 3, 1, 1>, // [B, 8, 28, 28]: 3x3, padding 1 keeps the size
    act1: Relu,                   //
    pool1: MaxPool2d<2>,          // [B, 8, 14, 14]
    conv2: Conv2d<8, 16, 3, 1, 1>, // [B, 16, 14, 14]
    act2: Relu,                   //
    pool2: MaxPool2d<2>,          // [B, 16, 7, 7]
    flatten: Flatten,             // [B, 784]
    dropout: Dropout,             // zeroes a quarter of the features in training only
    fc: Linear<784, 10>,          // [B, 10]: class scores
}

impl Net {
    fn new(rng: &mut Rng) -> Self {
        Net {
            conv1: Conv2d::new(&Cpu, rng),
            act1: Relu,
            pool1: MaxPool2d,
            conv2: Conv2d::new(&Cpu, rng),
            act2: Relu,
            pool2: MaxPool2d,
            flatten: Flatten,
            dropout: Dropout::new(0.25, rng),
            fc: Linear::new(&Cpu, rng),
        }
    }
}

/// Accuracy on `data` in eval mode, without recording a graph.
fn accuracy(net: &mut Net, data: &Arc<DigitSet>) -> Result<f64, Box<dyn std::error::Error>> {
    net.eval(); // dropout off, as `model.eval()`
    let _no_grad = no_grad(); // as `with torch.no_grad():`
    let (mut hits, mut seen) = (0, 0);
    for batch in DataLoader::new(Arc::clone(data), 500)?.iter() {
        let (x, y): (Images, Labels) = batch?;
        let pred = net.forward(x).argmax::<1>().to_vec();
        hits += pred
            .iter()
            .zip(y.to_vec())
            .filter(|(p, t)| **p == *t)
            .count();
        seen += pred.len();
    }
    net.train();
    Ok(hits as f64 / seen as f64)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let train = DigitSet::generate(6000, 1);
    let (mean, std) = train.pixel_stats();
    let train = train.normalize(mean, std);
    let test = Arc::new(DigitSet::generate(2000, 2).normalize(mean, std));
    println!(
        "{} training and {} held-out digits, normalised with mean {mean:.3} std {std:.3}",
        train.len(),
        test.len()
    );

    let mut rng = Rng::seed_from(0);
    let mut net = Net::new(&mut rng);
    println!("{}\n{} parameters\n", net.repr(), net.num_parameters());

    // The typed shapes, stage by stage: each `let` is checked when built.
    let x: Images = Tensor::zeros_with((Dyn(2), C, C, C));
    let h: Tensor<(Dyn, C<8>, C<28>, C<28>)> = net.conv1.forward(x);
    let h: Tensor<(Dyn, C<8>, C<14>, C<14>)> = net.pool1.forward(h);
    let h: Tensor<(Dyn, C<16>, C<14>, C<14>)> = net.conv2.forward(h);
    let h: Tensor<(Dyn, C<16>, C<7>, C<7>)> = net.pool2.forward(h);
    let h: Tensor<(Dyn, C<784>)> = net.flatten.forward(h);
    println!("a batch of 2: after the convolutions {:?}", h.dims());
    // Claiming `C<8>, C<8>` after `pool2` does not build:
    //   "MaxPool2d: an input height of 14 with kernel 2, stride 2, padding 0
    //    gives an output height of 7, not 8"

    let mut opt: Adam = Adam::try_new(AdamOptions::default().lr(3e-3))?;
    let mut loader = DataLoader::new(train, 64)?.shuffle(0);
    println!(
        "chance is 10.0%; before training: {:.1}%\n",
        100.0 * accuracy(&mut net, &test)?
    );
    net.train();
    for epoch in 1..=2 {
        let t0 = Instant::now();
        let (mut loss_sum, mut n) = (0.0, 0);
        for batch in loader.iter() {
            let (x, y): (Images, Labels) = batch?;
            // The loop PyTorch users know: zero, forward, loss, backward, step.
            opt.zero_grad(&net);
            let loss = cross_entropy(&net.forward(x), &y, Mean);
            loss.backward();
            opt.try_step(&net)?;
            loss_sum += loss.item() as f64;
            n += 1;
        }
        println!(
            "epoch {epoch}: mean training loss {:.4}, held-out accuracy {:.1}% ({:.1}s)",
            loss_sum / n as f64,
            100.0 * accuracy(&mut net, &test)?,
            t0.elapsed().as_secs_f64()
        );
    }
    println!(
        "\ndone in {:.1}s; the full pipeline: cargo run --release -p forma-examples --example train",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
