// BatchNorm1d<16> after a Linear that gives 32 features.
use forma::nn::layers::{BatchNorm1d, Linear};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 8], output = [B, 32])]
struct Net {
    fc: Linear<8, 32>,
    bn: BatchNorm1d<16>,
}

fn main() {}
