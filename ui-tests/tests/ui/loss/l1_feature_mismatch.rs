// `l1_loss` over 3 predicted coordinates against 2 target coordinates.
use forma::nn::loss::{l1_loss, Sum};
use forma::prelude::*;

fn main() {
    let pred = Tensor::<(Dyn, C<3>)>::zeros_with((Dyn(8), C));
    let target = Tensor::<(Dyn, C<2>)>::zeros_with((Dyn(8), C));
    let _loss = l1_loss(&pred, &target, Sum);
}
