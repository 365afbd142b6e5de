// Squeezing axis 0 of a [2, 3] tensor: only a size-1 dim can be removed.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::zeros();
    let _y = x.squeeze::<0>();
}
