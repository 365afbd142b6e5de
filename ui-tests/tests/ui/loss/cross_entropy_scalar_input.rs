// Cross-entropy of a single score against a class index: the input needs a
// class axis, [classes] for one sample or [batch, classes] for a batch.
use forma::nn::loss::{cross_entropy, Mean};
use forma::prelude::*;

fn main() {
    let score = Tensor::<()>::zeros();
    let class = Tensor::<(), i64>::zeros();
    let _loss = cross_entropy(&score, &class, Mean);
}
