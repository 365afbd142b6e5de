// A skipped field is not stored, so renaming it means nothing.
use forma::prelude::*;

#[derive(Module)]
struct Net {
    fc: Tensor<(C<4>, C<4>)>,
    #[module(skip, rename = "cache")]
    scratch: Vec<f32>,
}

fn main() {}
