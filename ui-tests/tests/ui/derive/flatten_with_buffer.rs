// `flatten` is for a child module; `buffer` is for a tensor field.
use forma::prelude::*;

#[derive(Module)]
struct Block {
    fc: Tensor<(C<4>, C<4>)>,
}

#[derive(Module)]
struct Net {
    #[module(flatten, buffer)]
    block: Block,
}

fn main() {}
