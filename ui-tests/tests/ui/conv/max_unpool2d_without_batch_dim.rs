// Unpooling one pooled image [channels, height, width] without its batch
// dim: max_unpool2d takes [batch, channels, height, width].
use forma::prelude::*;

fn main() {
    let pooled = Tensor::<(C<3>, C<2>, C<2>)>::zeros();
    let indices = Tensor::<(C<3>, C<2>, C<2>), i64>::zeros();
    let _image = pooled.try_max_unpool2d(&indices, [4, 4]);
}
