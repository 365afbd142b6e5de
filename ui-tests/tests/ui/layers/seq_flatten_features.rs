// LeNet with a wrong first Linear: the flattened features are 16 * 5 * 5 = 400,
// not 256.
use forma::nn::layers::{Conv2d, Flatten, Linear, MaxPool2d, Relu};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 1, 28, 28], output = [B, 10])]
struct LeNet {
    conv1: Conv2d<1, 6, 5, 1, 2>,
    act1: Relu,
    pool1: MaxPool2d<2>,
    conv2: Conv2d<6, 16, 5>,
    act2: Relu,
    pool2: MaxPool2d<2>,
    flatten: Flatten,
    fc1: Linear<256, 10>,
}

fn main() {}
