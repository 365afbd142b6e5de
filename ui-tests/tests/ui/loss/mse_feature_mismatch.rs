// `mse_loss` compares the input and the target element by element: 10
// features against 9 is rejected at compile time, naming both sizes.
use forma::nn::loss::{mse_loss, Mean};
use forma::prelude::*;

fn main() {
    let pred = Tensor::<(Dyn, C<10>)>::zeros_with((Dyn(4), C));
    let target = Tensor::<(Dyn, C<9>)>::zeros_with((Dyn(4), C));
    let _loss = mse_loss(&pred, &target, Mean);
}
