// The same attribute given twice on one field (here across two attributes).
use forma::prelude::*;

#[derive(Module)]
struct Net {
    #[module(rename = "proj")]
    #[module(rename = "projection")]
    fc: Tensor<(C<4>, C<4>)>,
}

fn main() {}
