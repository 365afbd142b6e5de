// `persistent` given an integer instead of `true` or `false`.
use forma::prelude::*;

#[derive(Module)]
struct BatchNorm {
    #[module(buffer(persistent = 1))]
    running_mean: Tensor<(C<4>,)>,
}

fn main() {}
