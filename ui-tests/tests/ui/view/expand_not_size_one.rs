// Expanding a [2, 3] tensor to [2, 5]: a size-3 dim cannot stretch to 5; only
// a `One` (size-1) dim can.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::zeros();
    let _y = x.expand((C::<2>, C::<5>));
}
