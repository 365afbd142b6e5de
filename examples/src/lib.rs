//! The numbered examples live in `examples/`; run one with
//! `cargo run --release -p forma-examples --example 01-tensor`. Each builds
//! on the one before:
//!
//! | example | what it shows |
//! |---|---|
//! | `01-tensor` | shapes in the type, broadcasting, views, `Dyn` sizes, dtypes |
//! | `02-autograd` | the tape: fitting a line with `backward()` |
//! | `03-module` | a model as an annotated struct, PyTorch's names, a training loop |
//! | `04-dsl-state-dict` | nested modules, `Vec`s of blocks, `rename`/`buffer`/`skip`, state_dict keys, load errors |
//! | `05-checkpoints-pytorch` | a PyTorch checkpoint loaded in one call and checked against PyTorch's output; saved back |
//! | `06-cnn` | a small CNN on the built-in digits: typed conv shapes, train/eval, `no_grad` |
//! | `07-transformer` | embeddings and transformer encoder layers trained to reverse sequences |
//! | `train` | the whole job: data, LeNet, loop, evaluation, checkpoints, resume, metrics, plot |
//!
//! This library holds what the larger examples share and what their tests
//! exercise:
//!
//! - [`digits`]: a deterministic renderer of handwriting-like 28x28 digits,
//!   the built-in dataset of the training example;
//! - [`download`]: `--download`: MNIST fetched from a mirror into a cache,
//!   checked against its published digests, decompressed to IDX files;
//! - [`train`]: the training example's pipeline (`--example train`): data,
//!   a LeNet, the loop, evaluation, checkpoints, resume, metrics and a plot,
//!   generic over the device (`--device`).

pub mod digits;
pub mod download;
pub mod train;
