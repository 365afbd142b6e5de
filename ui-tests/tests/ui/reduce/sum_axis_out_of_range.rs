// Summing over axis 2 of a rank-2 tensor: its axes are 0 and 1.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::ones();
    let _s = x.sum::<2>();
}
