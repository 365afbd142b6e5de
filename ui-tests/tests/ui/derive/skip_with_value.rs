// A flag attribute given a value: write `#[module(skip)]`.
use forma::prelude::*;

#[derive(Module)]
struct Net {
    fc: Tensor<(C<4>, C<4>)>,
    #[module(skip = true)]
    scratch: Vec<f32>,
}

fn main() {}
