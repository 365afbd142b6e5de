// Pieces joined along axis 1 must agree on axis 0: 2 rows and 3 rows.
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<2>, C<3>)>::zeros();
    let b = Tensor::<(C<3>, C<4>)>::zeros();
    let _y: Tensor<(C<2>, C<7>)> = a.cat_with::<1, _, _>(&b);
}
