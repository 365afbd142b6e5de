// A sequential model whose second Linear expects 512 features while the first
// produces 256: the derive names both layers and the sizes.
use forma::nn::layers::{Linear, Relu};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 784], output = [B, 10])]
struct Mlp {
    fc1: Linear<784, 256>,
    act: Relu,
    fc2: Linear<512, 10>,
}

fn main() {}
