// A negative size in `Tensor![..]`.
use forma::prelude::*;

fn main() {
    let _t: Option<Tensor![2, -3]> = None;
}
