// Softmax over axis 3 of a rank-3 tensor (axes 0, 1, 2): an off-by-one when
// meaning "the last axis" (which is 2).
use forma::prelude::*;

fn main() {
    let logits = Tensor::<(C<4>, C<8>, C<10>)>::zeros();
    let _p = logits.softmax::<3>();
}
