// `extra_repr` names a function by its path; this string is a call.
use forma::prelude::*;

#[derive(Module)]
#[module(extra_repr = "Self::extra_repr()")]
struct Net {
    fc: Tensor<(C<4>, C<4>)>,
}

fn main() {}
