//! Forma's CUDA backend.
