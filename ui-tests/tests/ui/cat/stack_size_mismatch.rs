// Stacking a [3] and a [4] vector into a batch: stacked tensors must have the
// same shape.
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<3>,)>::ones();
    let b = Tensor::<(C<4>,)>::ones();
    let _batch = stack::<0, _, _>(&[a, b]);
}
