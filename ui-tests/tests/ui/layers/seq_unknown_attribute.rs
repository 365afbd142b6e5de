// A misspelt `#[sequential(...)]` key.
use forma::nn::layers::Linear;
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(inptu = [B, 4], output = [B, 2])]
struct Head {
    fc: Linear<4, 2>,
}

fn main() {}
