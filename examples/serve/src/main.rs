//! `forma-serve`: serves the training example's LeNet over HTTP.
//!
//! ```sh
//! cargo run --release -p forma-serve -- --checkpoint runs/train/best.safetensors \
//!     --addr 127.0.0.1:8080 --max-batch 32 --max-wait-ms 2
//! cargo run --release -p forma-serve -- --dump-sample sample.json   # a real MNIST digit to send
//! ```
//!
//! See the library's docs (`forma_serve`) for the routes and a curl example.

use forma_serve::{
    parse_args, serve_model, shutdown_signal, Classifier, Command, Normalization, Sample,
};
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

/// Request logs to stderr, at the level `RUST_LOG` gives (`info` by
/// default), read as per-crate levels: `warn`, `forma_serve=debug,info`.
fn init_logs() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let default = Targets::new().with_default(LevelFilter::INFO);
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => v.parse().unwrap_or_else(|e| {
            eprintln!("warning: RUST_LOG={v:?} is not a level list ({e}); logging at info");
            default
        }),
        _ => default,
    };
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .with_filter(filter),
        )
        .init();
}

/// `--dump-sample`: writes the body and says what it shows.
fn dump_sample(path: &Path, data: &Path, index: usize) -> ExitCode {
    let sample = match Sample::from_mnist_test(data, index) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = sample.write(path) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    eprintln!(
        "wrote {}: MNIST test image {index} from {}",
        path.display(),
        data.display()
    );
    eprintln!("label: {}", sample.label);
    eprintln!(
        "send it: curl -s localhost:8080/predict -H 'content-type: application/json' -d @{}",
        path.display()
    );
    ExitCode::SUCCESS
}

#[tokio::main]
async fn main() -> ExitCode {
    let (mut config, addr, normalization) = match parse_args(std::env::args_os()) {
        Ok(Command::Serve {
            config,
            addr,
            normalization,
        }) => (config, addr, normalization),
        Ok(Command::DumpSample { path, data, index }) => return dump_sample(&path, &data, index),
        // Help and version to stdout with status 0, errors to stderr with 2.
        Err(e) => e.exit(),
    };
    init_logs();
    // Load before anything slow or visible: a bad checkpoint fails at once
    // and never opens the port.
    let mut model = match Classifier::load(&config.checkpoint, Normalization::IDENTITY) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    config.normalization = match normalization {
        Some(n) => n,
        None => {
            let n = Normalization::builtin_training_data();
            println!(
                "inputs normalised with the built-in training data's mean {:.4} std {:.4} \
                 (--mean/--std to change)",
                n.mean, n.std
            );
            n
        }
    };
    model.set_normalization(config.normalization);
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The bound address, so that `--addr 127.0.0.1:0` says which port it got.
    let addr = listener.local_addr().unwrap_or(addr);
    println!(
        "serving {} on http://{addr} (max batch {}, max wait {:?}); ctrl-c to stop",
        config.checkpoint.display(),
        config.max_batch,
        config.max_wait
    );
    match serve_model(listener, model, config, shutdown_signal()).await {
        Ok(()) => {
            println!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
