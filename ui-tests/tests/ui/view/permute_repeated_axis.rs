// Permuting a rank-3 tensor with axis 0 listed twice and axis 2 missing.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>, C<4>)>::zeros();
    let _y = x.permute::<(Ax<0>, Ax<1>, Ax<0>)>();
}
