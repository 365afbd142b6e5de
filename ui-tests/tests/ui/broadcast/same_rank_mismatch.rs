// Adding two rank-2 tensors whose last dims differ (3 vs 4): no broadcast rule
// relates them, so `+` is rejected at compile time.
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<2>, C<3>)>::ones();
    let b = Tensor::<(C<2>, C<4>)>::ones();
    let _c = &a + &b;
}
