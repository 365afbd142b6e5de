// `conv2d` takes [batch, channels, height, width]: a single [1, 28, 28] image
// gets its batch dim from `unsqueeze::<0>()`, and a [6, 1, 5, 5] weight gives
// [1, 6, 24, 24].
use forma::prelude::*;

fn main() {
    let image = Tensor::<(C<1>, C<28>, C<28>)>::ones();
    let weight = Tensor::<(C<6>, C<1>, C<5>, C<5>)>::ones();
    let y: Tensor<(One, C<6>, Dyn, Dyn)> = image
        .unsqueeze::<0>()
        .conv2d(&weight, Conv2dParams::default());
    assert_eq!(y.dims().to_vec(), vec![1, 6, 24, 24]);
    assert!(y.to_vec().iter().all(|&v| v == 25.0));
}
