// A convolution placed after Flatten receives a [batch, features] input.
use forma::nn::layers::{Conv2d, Flatten};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 1, 8, 8], output = [B, 4, 6, 6])]
struct Net {
    flatten: Flatten,
    conv: Conv2d<1, 4, 3>,
}

fn main() {}
