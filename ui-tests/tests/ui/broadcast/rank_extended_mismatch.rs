// A rank-1 operand is aligned with the *last* dim of the rank-2 one (like a
// bias), so `(2, 3) + (4,)` compares 3 with 4 and fails.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::ones();
    let bias = Tensor::<(C<4>,)>::ones();
    let _y = x.add(&bias);
}
