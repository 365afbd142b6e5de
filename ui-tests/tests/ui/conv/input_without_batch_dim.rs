// `conv2d` on a [1, 28, 28] image without its batch dim: conv2d takes
// [batch, channels, height, width]; add the batch dim with `unsqueeze::<0>()`.
use forma::prelude::*;

fn main() {
    let image = Tensor::<(C<1>, C<28>, C<28>)>::zeros();
    let weight = Tensor::<(C<6>, C<1>, C<5>, C<5>)>::zeros();
    let _y = image.conv2d(&weight, Conv2dParams::default());
}
