// A field attribute (`skip`) written on the struct, where only `crate`,
// `name` and `extra_repr` are accepted.
use forma::prelude::*;

#[derive(Module)]
#[module(skip)]
struct Net {
    fc: Tensor<(C<4>, C<4>)>,
}

fn main() {}
