// Flattening conv features [batch, 16, 5, 5] (16*5*5 = 400 per sample) into
// 401 features: the classic off-by-something in a LeNet head. Reported by
// `cargo build` (a const assertion), not by `cargo check`.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(Dyn, C<16>, C<5>, C<5>)>::zeros_with((Dyn(2), C, C, C));
    let _y = x.flatten::<C<401>>();
}
