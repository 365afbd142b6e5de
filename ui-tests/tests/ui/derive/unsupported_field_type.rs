// A field whose type is neither a module, a tensor nor a plain value: it
// must be marked `#[module(skip)]` (or its type must derive `Module`).
use forma::prelude::*;
use std::collections::HashMap;

#[derive(Module)]
struct Net {
    fc: Tensor<(C<4>, C<4>)>,
    vocab: HashMap<String, f32>,
}

fn main() {}
