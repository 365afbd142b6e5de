// Inserting an axis at position 3 of a rank-2 tensor: new axes go at 0, 1 or 2.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::zeros();
    let _y = x.unsqueeze::<3>();
}
