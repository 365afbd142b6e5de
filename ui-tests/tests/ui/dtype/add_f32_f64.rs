// Adding an f64 tensor to an f32 tensor: elementwise ops need one dtype; cast
// one side with `to_dtype` first.
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<2>, C<3>), f32>::ones();
    let b = Tensor::<(C<2>, C<3>), f64>::ones();
    let _c = &a + &b;
}
