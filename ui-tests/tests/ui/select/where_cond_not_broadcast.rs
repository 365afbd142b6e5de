// `where_cond(cond, a, b)` with a [2, 4] condition for [2, 3] branches: the
// condition must broadcast to the branches' shape (4 cannot become 3).
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<2>, C<3>)>::ones();
    let b = Tensor::<(C<2>, C<3>)>::zeros();
    let c = Tensor::<(C<2>, C<4>)>::ones();
    let cond = c.gt(&c);
    let _y = where_cond(&cond, &a, &b);
}
