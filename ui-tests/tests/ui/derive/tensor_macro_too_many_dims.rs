// `Tensor![..]` with seven dims; shapes go up to rank 6.
use forma::prelude::*;

fn main() {
    let _t: Option<Tensor![1, 2, 3, 4, 5, 6, 7]> = None;
}
