//! The main job: trains a CNN digit classifier end to end and reports its
//! held-out accuracy.
//!
//! ```sh
//! cargo run --release -p forma-examples --example train            # built-in digits, ~1 minute on 2 cores
//! cargo run --release -p forma-examples --example train -- --resume --epochs 6
//! cargo run --release -p forma-examples --example train -- --data ~/data/mnist
//! cargo run --release -p forma-examples --example train -- --download  # MNIST, fetched once, MD5-checked
//! cargo run --release -p forma-examples --example train -- --model linear   # the baseline
//! cargo run --release -p forma-examples --example train -- --help
//! ```
//!
//! With no arguments it trains on digits drawn by the project's own renderer
//! (`forma_examples::digits`: jittered strokes, noise, blur), so it runs
//! offline on a fresh machine; `--data DIR` reads MNIST-format IDX files,
//! and `--download` fetches MNIST into a cache (`--cache DIR`, from
//! `--mirror URL`) and reads it from there (`forma_examples::download`).
//! Each epoch it evaluates on the held-out split in eval mode without a
//! graph, keeps the best model as `runs/train/best.safetensors` (PyTorch's
//! keys: `torch.nn` loads it), saves the training state for `--resume`, and
//! rewrites `metrics.csv` and `metrics.png`.
//!
//! Data-parallel, under MPI (each process trains on its share of every
//! epoch; rank 0 writes the files):
//!
//! ```sh
//! cargo build --release -p forma-examples --features distributed --example train
//! mpirun -np 2 target/release/examples/train --distributed
//! ```
//!
//! The model, the loop and the files are in `examples/src/train/`
//! (`forma_examples::train`), where the tests can run them too.

use forma_examples::train::{line_prefix, parse_args, run, Command, USAGE};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Train(args)) => args,
        Ok(Command::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(summary) => {
            if let Some(acc) = summary.final_test_acc() {
                println!(
                    "{}held-out accuracy: {:.2}% (best {:.2}%); model and metrics in {}",
                    line_prefix(),
                    100.0 * acc,
                    100.0 * summary.best_test_acc,
                    summary.out.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
