// Reshaping 2x3 = 6 elements into 2x4 = 8 elements. The element counts need
// arithmetic, so this is a const assertion: `cargo build` reports it,
// `cargo check` does not.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::zeros();
    let _y: Tensor<(C<2>, C<4>)> = x.reshape();
}
