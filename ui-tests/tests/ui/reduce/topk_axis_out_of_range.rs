// `topk` along axis 2 of a [4, 10] matrix of scores: the matrix has axes 0
// and 1 only (or -2 and -1).
use forma::prelude::*;

fn main() {
    let scores = Tensor::<(C<4>, C<10>)>::zeros();
    let (_values, _indices) = scores.topk::<2>(3, true);
}
