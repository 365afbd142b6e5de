// Two fields stored under one key: `fc1` is renamed to `fc`, the name of a
// later field, so their state_dict entries would overwrite each other.
use forma::prelude::*;

#[derive(Module)]
struct Net {
    #[module(rename = "fc")]
    fc1: Tensor<(C<4>, C<4>)>,
    fc: Tensor<(C<4>, C<4>)>,
    #[module(rename = "fc")]
    fc2: Tensor<(C<4>, C<4>)>,
}

fn main() {}
