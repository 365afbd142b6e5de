// A softmax along the last axis of a rank-0 tensor, which has no axes.
use forma::prelude::*;

fn main() {
    let score = Tensor::<()>::ones();
    let _p = score.softmax::<-1>();
}
