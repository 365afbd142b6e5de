// Concatenating a [2, 3] and a [2, 4] tensor along axis 0: the sizes off the
// cat axis (3 vs 4) must agree.
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<2>, C<3>)>::ones();
    let b = Tensor::<(C<2>, C<4>)>::ones();
    let _c = cat::<0, _, _>(&[a, b]);
}
