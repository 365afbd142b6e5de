//! Compile-fail tests for Forma's compile-time shape checks.
//!
//! This crate has no code of its own: the suite lives in `tests/ui.rs`, with
//! one file per shape mistake under `tests/ui/<category>/` (and the expected
//! compiler output beside it as `.stderr`) and the correct counterparts under
//! `tests/pass/`. See `README.md` for what is covered and how to regenerate.
