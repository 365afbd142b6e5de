// MaxPool2d with ceil_mode turns 7x7 into 4x4 (not 3x3), so the flattened
// size is 8 * 4 * 4 = 128, not 72.
use forma::nn::layers::{Conv2d, Flatten, Linear, MaxPool2d};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 1, 9, 9], output = [B, 10])]
struct Net {
    conv: Conv2d<1, 8, 3>,
    pool: MaxPool2d<2, 2, 0, 1, true>,
    flatten: Flatten,
    fc: Linear<72, 10>,
}

fn main() {}
