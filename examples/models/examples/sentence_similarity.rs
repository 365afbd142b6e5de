//! Sentence similarity from strings: a sentence-transformers model folder
//! is loaded in one call (`config.json`, `model.safetensors`,
//! `tokenizer.json`), a few sentences are embedded, and their cosine
//! matrix is printed.
//!
//! ```sh
//! # The tiny random test model (tools/fixtures/models/bert_text): the numbers mean nothing.
//! cargo run -p forma-models --example sentence_similarity
//! # A real all-MiniLM-L6-v2 folder, e.g. from
//! # `huggingface-cli download sentence-transformers/all-MiniLM-L6-v2 --local-dir all-MiniLM-L6-v2`.
//! cargo run --release -p forma-models --example sentence_similarity -- all-MiniLM-L6-v2
//! ```
//!
//! The Rust type fixes the model's sizes, so a folder given on the command
//! line must hold all-MiniLM-L6-v2's shape ([`MiniLmL6`]); another is
//! refused with the `config.json` field that differs.

use forma::prelude::*;
use forma_models::bert::{Bert, MiniLmL6};
use forma_models::text::{cos_sim, SentenceEncoder};
use forma_models::{Loaded, ModelError};
use std::process::ExitCode;

/// `tools/gen_text_fixtures.py`'s tiny BERT (vocabulary 143, hidden 32).
type FixtureBert = Bert<143, 32, 4, 37, 40, 2>;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tools/fixtures/models/bert_text"
);

const SENTENCES: [&str; 4] = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast brown fox leaps over a sleepy dog.",
    "It is raining heavily and the streets are flooded.",
    "Forma is a deep learning framework written in Rust.",
];

fn main() -> ExitCode {
    let loaded = match std::env::args().nth(1) {
        Some(dir) => SentenceEncoder::<MiniLmL6>::from_pretrained_dir(&dir, &Cpu)
            .and_then(|loaded| show(&dir, loaded)),
        None => SentenceEncoder::<FixtureBert>::from_pretrained_dir(FIXTURE, &Cpu)
            .and_then(|loaded| show(FIXTURE, loaded)),
    };
    match loaded {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints what was loaded from `dir` and the cosine matrix of
/// [`SENTENCES`].
fn show<
    const V: usize,
    const H: usize,
    const HEADS: usize,
    const FFN: usize,
    const P: usize,
    const TV: usize,
>(
    dir: &str,
    loaded: Loaded<SentenceEncoder<Bert<V, H, HEADS, FFN, P, TV>>>,
) -> Result<(), ModelError> {
    let encoder = loaded.model;
    println!(
        "{dir}: {} layers, hidden {H}, vocabulary {V}, max_len {}; dropped from the file: {:?}",
        encoder.model.encoder.layer.len(),
        encoder.max_len,
        loaded.report.dropped
    );
    let embeddings = encoder.embed(&SENTENCES)?;
    let cosine = cos_sim(&embeddings, &embeddings)?.to_vec();
    for (i, s) in SENTENCES.iter().enumerate() {
        println!("[{i}] {s}");
    }
    print!("\n    ");
    for j in 0..SENTENCES.len() {
        print!("{:>7}", format!("[{j}]"));
    }
    println!();
    for (i, row) in cosine.chunks(SENTENCES.len()).enumerate() {
        print!("{:<4}", format!("[{i}]"));
        for c in row {
            print!("{c:>7.3}");
        }
        println!();
    }
    Ok(())
}
