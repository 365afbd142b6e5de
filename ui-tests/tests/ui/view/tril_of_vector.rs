// `tril` of a [3] vector: the lower triangle needs a matrix (rank 2 or
// more), and a rank-1 tensor has no axis -2.
use forma::prelude::*;

fn main() {
    let v = Tensor::<(C<3>,)>::ones();
    let _lower = v.tril(0);
}
