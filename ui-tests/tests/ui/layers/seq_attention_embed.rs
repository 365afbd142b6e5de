// A MultiheadAttention over 64 features after a projection to 32.
use forma::nn::layers::{Linear, MultiheadAttention};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, T, 16], output = [B, T, 64])]
struct Net {
    proj: Linear<16, 32>,
    attn: MultiheadAttention<64, 4>,
}

fn main() {}
