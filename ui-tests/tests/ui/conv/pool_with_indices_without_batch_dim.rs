// Max pooling with indices on one image [channels, height, width] without
// its batch dim: max_pool2d_with_indices takes [batch, channels, height, width].
use forma::core::ops::pool::Pool2dParams;
use forma::prelude::*;

fn main() {
    let image = Tensor::<(C<3>, C<8>, C<8>)>::zeros();
    let _pooled = image.try_max_pool2d_with_indices(Pool2dParams::new([2, 2]));
}
