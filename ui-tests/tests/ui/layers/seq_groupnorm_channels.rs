// GroupNorm over 16 channels after a convolution that gives 8.
use forma::nn::layers::{Conv2d, GroupNorm, LeakyRelu};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 3, 8, 8], output = [B, 8, 8, 8])]
struct Net {
    conv: Conv2d<3, 8, 3, 1, 1>,
    act: LeakyRelu,
    norm: GroupNorm<4, 16>,
}

fn main() {}
