// Softmax over dim 2 of a [batch, classes] output: the axis does not exist.
use forma::nn::layers::{Linear, Softmax};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 8], output = [B, 3])]
struct Net {
    fc: Linear<8, 3>,
    softmax: Softmax<2>,
}

fn main() {}
