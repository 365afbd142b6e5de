// Class indices need one entry per sample: 4 rows of logits against 5
// targets is rejected at compile time when both batch sizes are static.
use forma::nn::loss::{cross_entropy, Mean};
use forma::prelude::*;

fn main() {
    let logits = Tensor::<(C<4>, C<10>)>::zeros();
    let target = Tensor::<(C<5>,), i64>::zeros();
    let _loss = cross_entropy(&logits, &target, Mean);
}
