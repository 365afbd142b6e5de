// `smooth_l1_loss` of a [batch, 4] box regression against [batch, 4, 1]
// targets: the target has an extra axis.
use forma::nn::loss::{smooth_l1_loss, Mean};
use forma::prelude::*;

fn main() {
    let pred = Tensor::<(C<8>, C<4>)>::zeros();
    let target = Tensor::<(C<8>, C<4>, C<1>)>::zeros();
    let _loss = smooth_l1_loss(&pred, &target, 1.0, Mean);
}
