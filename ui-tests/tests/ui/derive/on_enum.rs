// `#[derive(Module)]` on an enum: only structs are modules.
use forma::prelude::*;

#[derive(Module)]
enum Activation {
    Relu,
    Gelu,
}

fn main() {}
