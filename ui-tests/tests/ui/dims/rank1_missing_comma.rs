// A rank-1 shape written without the trailing comma: `(C<3>)` is just `C<3>`
// in parentheses, not a tuple, so it is not a shape. Write `(C<3>,)`.
use forma::prelude::*;

fn main() {
    let _v = Tensor::<(C<3>)>::zeros();
}
