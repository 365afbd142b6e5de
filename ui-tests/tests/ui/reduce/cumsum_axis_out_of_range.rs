// A running sum over axis 2 of a rank-2 tensor (axes 0 and 1): the
// sequence axis of a `[batch, seq]` tensor is 1.
use forma::prelude::*;

fn main() {
    let tokens = Tensor::<(Dyn, C<16>)>::zeros_with((Dyn(4), C));
    let _positions = tokens.cumsum::<2>();
}
