// Max pooling one image [channels, height, width] without its batch dim:
// max_pool2d takes [batch, channels, height, width].
use forma::core::ops::pool::Pool2dParams;
use forma::prelude::*;

fn main() {
    let image = Tensor::<(C<3>, C<8>, C<8>)>::zeros();
    let _pooled = image.max_pool2d(Pool2dParams::new([2, 2]));
}
