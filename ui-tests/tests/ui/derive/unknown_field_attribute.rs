// A misspelled field attribute (`rnme` for `rename`).
use forma::prelude::*;

#[derive(Module)]
struct Net {
    #[module(rnme = "encoder.fc")]
    fc: Tensor<(C<4>, C<4>)>,
}

fn main() {}
