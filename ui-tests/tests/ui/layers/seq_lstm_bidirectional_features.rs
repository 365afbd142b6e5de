// A bidirectional LSTM with hidden size 16 gives 32 features per step (both
// directions); the head takes 16.
use forma::nn::layers::{Linear, Lstm};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, T, 8], output = [B, T, 4])]
struct Tagger {
    lstm: Lstm<8, 16, true>,
    head: Linear<16, 4>,
}

fn main() {}
