// Padding axis 3 of a [1, 28, 28] image (`F.pad` on the last two dims of an
// unbatched image is axes 1 and 2): the image has axes 0 to 2.
use forma::prelude::*;
use forma::PadMode;

fn main() {
    let image = Tensor::<(C<1>, C<28>, C<28>)>::zeros();
    let _padded = image.pad::<3>(2, 2, PadMode::Constant(0.0));
}
