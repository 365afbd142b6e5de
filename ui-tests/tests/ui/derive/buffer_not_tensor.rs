// `#[module(buffer)]` on a field that is not a tensor (a plain f64).
use forma::prelude::*;

#[derive(Module)]
struct BatchNorm {
    weight: Tensor<(C<4>,)>,
    #[module(buffer)]
    momentum: f64,
}

fn main() {}
