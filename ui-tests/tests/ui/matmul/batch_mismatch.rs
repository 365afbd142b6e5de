// Batched matrix product [8, 2, 3] @ [7, 3, 5]: the inner dims agree but the
// batch dims (8 vs 7) neither match nor broadcast.
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<8>, C<2>, C<3>)>::ones();
    let b = Tensor::<(C<7>, C<3>, C<5>)>::ones();
    let _c = a.matmul(&b);
}
