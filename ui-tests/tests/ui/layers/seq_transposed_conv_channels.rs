// A ConvTranspose2d taking 16 channels after a Conv2d giving 32.
use forma::nn::layers::{Conv2d, ConvTranspose2d};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 3, 8, 8], output = [B, 3, 16, 16])]
struct Net {
    down: Conv2d<3, 32, 3, 1, 1>,
    up: ConvTranspose2d<16, 3, 2, 2>,
}

fn main() {}
