// A size-1 dim written as the literal `C<1>` is an ordinary size that must
// match exactly; only `One` (from `*_keepdim` or `unsqueeze`) stretches.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::ones();
    let col = Tensor::<(C<2>, C<1>)>::ones();
    let _y = &x - &col;
}
