// A GRU that takes 32 features after an embedding projection to 64.
use forma::nn::layers::{Gru, Linear};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, T, 10], output = [B, T, 16])]
struct Net {
    proj: Linear<10, 64>,
    gru: Gru<32, 16>,
}

fn main() {}
