// One-hot encoding appends a dim, but a rank-6 tensor is already at the
// maximum rank, so there is no rank-7 result type.
use forma::prelude::*;

fn main() {
    let idx = Tensor::<(C<1>, C<1>, C<1>, C<1>, C<2>, C<3>), i64>::zeros();
    let _hot = idx.one_hot::<10, f32>();
}
