// `masked_fill` of a [2, 3] tensor with a [2, 4] mask: the mask must broadcast
// to the tensor's shape (4 cannot become 3).
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::ones();
    let m = Tensor::<(C<2>, C<4>)>::ones();
    let mask = m.gt(&m);
    let _y = x.masked_fill(&mask, 0.0);
}
