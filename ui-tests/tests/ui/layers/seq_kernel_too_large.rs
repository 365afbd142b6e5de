// After two poolings a 12x12 input is 3x3: a 5x5 convolution cannot fit.
use forma::nn::layers::{Conv2d, MaxPool2d};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 3, 12, 12], output = [B, 8, 1, 1])]
struct Tiny {
    pool1: MaxPool2d<2>,
    pool2: MaxPool2d<2>,
    conv: Conv2d<3, 8, 5>,
}

fn main() {}
