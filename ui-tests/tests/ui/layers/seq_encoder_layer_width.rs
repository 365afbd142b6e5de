// A TransformerEncoderLayer<256, ..> fed 512 features.
use forma::nn::layers::{Linear, TransformerEncoderLayer};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, T, 512], output = [B, T, 256])]
struct Net {
    encoder: TransformerEncoderLayer<256, 8, 1024>,
    head: Linear<256, 256>,
}

fn main() {}
