//! The numbered examples live in `examples/`; run one with
//! `cargo run --release -p forma-examples --example 01-tensor`.
