// `binary_cross_entropy` compares probabilities with targets element by
// element: one output per sample against two targets per sample.
use forma::nn::loss::{binary_cross_entropy, Mean};
use forma::prelude::*;

fn main() {
    let probs = Tensor::<(Dyn, C<1>)>::zeros_with((Dyn(4), C));
    let target = Tensor::<(Dyn, C<2>)>::zeros_with((Dyn(4), C));
    let _loss = binary_cross_entropy(&probs, &target, Mean);
}
