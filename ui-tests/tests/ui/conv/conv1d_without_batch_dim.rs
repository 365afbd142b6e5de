// `conv1d` on a [16, 100] sequence without its batch dim: conv1d takes
// [batch, channels, length]; add the batch dim with `unsqueeze::<0>()`.
use forma::prelude::*;

fn main() {
    let signal = Tensor::<(C<16>, C<100>)>::zeros();
    let weight = Tensor::<(C<32>, C<16>, C<3>)>::zeros();
    let _y = signal.conv1d(&weight, 1, 1, 1, 1);
}
