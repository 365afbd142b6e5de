// Matrix product of a 2x3 by a 4x5 matrix: the inner dims (3 vs 4) differ.
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<2>, C<3>)>::ones();
    let b = Tensor::<(C<4>, C<5>)>::ones();
    let _c = a.matmul(&b);
}
