// A linear map of [4, 3] rows by a weight of [2, 5] (out, in): the weight
// takes 5 input features, the rows have 3.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<4>, C<3>)>::ones();
    let w = Tensor::<(C<2>, C<5>)>::ones();
    let b = Tensor::<(C<2>,)>::ones();
    let _y = x.linear(&w, Some(&b));
}
