// Transposing axes 0 and 2 of a rank-2 tensor: axis 2 does not exist.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::zeros();
    let _t = x.transpose::<0, 2>();
}
