// Stacking two [3] vectors along axis 2: a new axis of a rank-1 tensor goes
// at position 0 or 1 (or -2 and -1).
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<3>,)>::ones();
    let b = Tensor::<(C<3>,)>::zeros();
    let _batch = stack::<2, _, _>(&[a, b]);
}
