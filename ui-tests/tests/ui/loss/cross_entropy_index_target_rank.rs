// Class-index targets drop the class axis: `[B]` for `[B, 10]` logits. A
// `[B, 10]` index tensor does not fit (probabilities go to
// `cross_entropy_probs`).
use forma::nn::loss::{cross_entropy, Mean};
use forma::prelude::*;

fn main() {
    let logits = Tensor::<(Dyn, C<10>)>::zeros_with((Dyn(4), C));
    let target = Tensor::<(Dyn, C<10>), i64>::zeros_with((Dyn(4), C));
    let _loss = cross_entropy(&logits, &target, Mean);
}
