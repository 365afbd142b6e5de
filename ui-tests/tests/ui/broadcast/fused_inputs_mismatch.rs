// A fused expression's inputs follow the binary ops' broadcasting rule: a
// `[2, 3]` input and a `[4]` input do not broadcast, whatever the expression.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::ones();
    let b = Tensor::<(C<4>,)>::ones();
    let _y = forma::fused((&x, &b), |(x, b)| (x + b).gelu());
}
