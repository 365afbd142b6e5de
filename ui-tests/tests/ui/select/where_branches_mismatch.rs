// `where_cond(cond, a, b)` with a [2, 3] and a [2, 4] branch: the two branches
// must broadcast together (3 vs 4 do not).
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<2>, C<3>)>::ones();
    let b = Tensor::<(C<2>, C<4>)>::zeros();
    let cond = a.gt(&a);
    let _y = where_cond(&cond, &a, &b);
}
