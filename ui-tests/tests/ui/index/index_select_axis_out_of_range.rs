// `index_select` along axis 2 of a [4, 3] tensor, which has only axes 0 and 1.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<4>, C<3>)>::ones();
    let idx = Tensor::<(C<2>,), i64>::from_vec(vec![0, 3], (C,)).unwrap();
    let _y = x.index_select::<2, _>(&idx);
}
