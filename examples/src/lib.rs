//! The numbered examples live in `examples/`; run one with
//! `cargo run --release -p forma-examples --example 01-tensor`.
//!
//! This library holds what the larger examples share and what their tests
//! exercise:
//!
//! - [`digits`]: a deterministic renderer of handwriting-like 28x28 digits,
//!   the built-in dataset of the training example;
//! - [`train`]: the training example's pipeline (`--example train`): data,
//!   a LeNet, the loop, evaluation, checkpoints, resume, metrics and a plot.

pub mod digits;
pub mod train;
