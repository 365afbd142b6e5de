// Summing over axis -3 of a rank-2 tensor: counting from the end, its axes
// are -1 and -2.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::ones();
    let _s = x.sum::<-3>();
}
