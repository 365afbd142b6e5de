// Splitting 384 features into 12 heads of 16 leaves 192 elements per
// position, not 384 (reported by `cargo build`).
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<5>, C<384>)>::zeros();
    let _heads: Tensor<(C<2>, C<5>, C<12>, C<16>)> = x.reshape();
}
