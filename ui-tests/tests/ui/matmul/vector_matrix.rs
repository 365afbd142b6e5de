// Vector-matrix product [3] @ [4, 5]: the vector is treated as a 1x3 row,
// whose 3 columns do not match the matrix's 4 rows.
use forma::prelude::*;

fn main() {
    let v = Tensor::<(C<3>,)>::ones();
    let m = Tensor::<(C<4>, C<5>)>::ones();
    let _y = v.matmul(&m);
}
