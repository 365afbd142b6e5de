// Average pooling a batch of images [batch, channels, height, width] with
// the 1-d pooling, which takes [batch, channels, length].
use forma::prelude::*;

fn main() {
    let images = Tensor::<(C<2>, C<3>, C<8>, C<8>)>::zeros();
    let _pooled = images.try_avg_pool1d(2, 2, 0);
}
