// The second convolution expects 8 input channels, but the first gives 6.
use forma::nn::layers::{Conv2d, Relu};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 1, 28, 28], output = [B, 16, 20, 20])]
struct Convs {
    conv1: Conv2d<1, 6, 5>,
    act: Relu,
    conv2: Conv2d<8, 16, 5>,
}

fn main() {}
