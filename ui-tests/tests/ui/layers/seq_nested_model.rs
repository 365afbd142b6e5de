// A sequential model used as a layer of another gives 16 features; the
// next layer takes 32.
use forma::nn::layers::{Linear, Relu};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 4], output = [B, 16])]
struct Stem {
    fc: Linear<4, 16>,
    relu: Relu,
}

#[derive(Module, Sequential)]
#[sequential(input = [B, 4], output = [B, 2])]
struct Net {
    stem: Stem,
    head: Linear<32, 2>,
}

fn main() {}
