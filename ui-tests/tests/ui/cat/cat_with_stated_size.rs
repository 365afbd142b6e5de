// Joining 3 and 4 channels gives 7, but the result is stated as 8
// (reported by `cargo build`: the sum is a const assertion).
use forma::prelude::*;

fn main() {
    let a = Tensor::<(Dyn, C<3>)>::zeros_with((Dyn(2), C));
    let b = Tensor::<(Dyn, C<4>)>::zeros_with((Dyn(2), C));
    let _y: Tensor<(Dyn, C<8>)> = a.cat_with::<1, _, _>(&b);
}
