// A loss between an f32 prediction and an f64 target.
use forma::nn::loss::{mse_loss, Mean};
use forma::prelude::*;

fn main() {
    let pred = Tensor::<(Dyn, C<3>)>::zeros_with((Dyn(4), C));
    let target = Tensor::<(Dyn, C<3>), f64>::zeros_with((Dyn(4), C));
    let _loss = mse_loss(&pred, &target, Mean);
}
