// The model declares a [B, 10] output but forgets the Flatten: its last
// layer gives [B, 16, 10].
use forma::nn::layers::Linear;
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 16, 8], output = [B, 10])]
struct Net {
    fc: Linear<8, 10>,
}

fn main() {}
