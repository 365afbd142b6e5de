// A Conv1d with kernel 7 over a length of 5 leaves no output.
use forma::nn::layers::Conv1d;
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 2, 5], output = [B, 4, 1])]
struct Net {
    conv: Conv1d<2, 4, 7>,
}

fn main() {}
