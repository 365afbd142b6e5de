// A fused `gelu(x * w + b)` with `w` and `b` broadcast over the batch: the
// result has the broadcast shape, checked by the annotation.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(Dyn, C<3>)>::ones_with((Dyn(2), C));
    let w = Tensor::<(C<3>,)>::ones();
    let b = Tensor::<(C<3>,)>::zeros();
    let y: Tensor<(Dyn, C<3>)> = forma::fused((&x, &w, &b), |(x, w, b)| (x * w + b).gelu());
    assert_eq!(y.dims().to_vec(), [2, 3]);
}
