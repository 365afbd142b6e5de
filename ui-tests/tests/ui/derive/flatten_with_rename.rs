// A flattened child has no key of its own, so it cannot be renamed.
use forma::prelude::*;

#[derive(Module)]
struct Block {
    fc: Tensor<(C<4>, C<4>)>,
}

#[derive(Module)]
struct Net {
    #[module(flatten, rename = "block")]
    block: Block,
}

fn main() {}
