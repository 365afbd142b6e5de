// Batched matrix product [8, 2, 3] @ [8, 4, 5]: batch dims agree but the
// inner dims (3 vs 4) do not.
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<8>, C<2>, C<3>)>::ones();
    let b = Tensor::<(C<8>, C<4>, C<5>)>::ones();
    let _c = a.matmul(&b);
}
