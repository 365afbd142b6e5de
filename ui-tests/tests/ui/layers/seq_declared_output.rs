// The model declares 11 outputs but its last layer gives 10.
use forma::nn::layers::Linear;
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 4], output = [B, 11])]
struct Head {
    fc: Linear<4, 10>,
}

fn main() {}
