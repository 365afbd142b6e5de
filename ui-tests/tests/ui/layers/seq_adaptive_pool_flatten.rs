// AdaptiveAvgPool2d<1> leaves [B, 512, 1, 1]: the flattened 512 features do
// not fit a Linear that takes 2048 (a ResNet-50 head on a ResNet-18 body).
use forma::nn::layers::{AdaptiveAvgPool2d, Conv2d, Flatten, Linear};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 3, 32, 32], output = [B, 1000])]
struct Net {
    body: Conv2d<3, 512, 3, 2, 1>,
    pool: AdaptiveAvgPool2d<1>,
    flatten: Flatten,
    fc: Linear<2048, 1000>,
}

fn main() {}
