//! `forma-serve`: serves the training example's LeNet over HTTP.
//!
//! ```sh
//! cargo run --release -p forma-serve -- --checkpoint runs/train/best.safetensors \
//!     --addr 127.0.0.1:8080 --max-batch 32 --max-wait-ms 2
//! ```
//!
//! See the library's docs (`forma_serve`) for the routes and a curl example.

use forma_serve::{
    parse_args, serve_model, shutdown_signal, Classifier, Command, Normalization, USAGE,
};
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let (mut config, addr, normalization) = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Serve {
            config,
            addr,
            normalization,
        }) => (config, addr, normalization),
        Ok(Command::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
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
