// An empty key, and a dotted key with an empty segment between two dots.
use forma::prelude::*;

#[derive(Module)]
struct Net {
    #[module(rename = "")]
    fc1: Tensor<(C<4>, C<4>)>,
    #[module(rename = "encoder..fc")]
    fc2: Tensor<(C<4>, C<4>)>,
}

fn main() {}
