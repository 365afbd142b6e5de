// `rename` given an identifier instead of a string literal.
use forma::prelude::*;

#[derive(Module)]
struct Net {
    #[module(rename = proj)]
    fc: Tensor<(C<4>, C<4>)>,
}

fn main() {}
