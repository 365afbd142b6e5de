// BatchNorm2d after Flatten receives a [batch, features] input.
use forma::nn::layers::{BatchNorm2d, Flatten};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 8, 4, 4], output = [B, 128])]
struct Net {
    flatten: Flatten,
    bn: BatchNorm2d<8>,
}

fn main() {}
