// Concatenating two [2, 3] tensors along axis 2, which a rank-2 tensor lacks.
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<2>, C<3>)>::ones();
    let b = Tensor::<(C<2>, C<3>)>::ones();
    let _c = cat::<2, _, _>(&[a, b]);
}
