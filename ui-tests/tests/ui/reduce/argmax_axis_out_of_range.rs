// argmax over axis 2 of a rank-2 batch of logits [batch, classes].
use forma::prelude::*;

fn main() {
    let logits = Tensor::<(Dyn, C<10>)>::zeros_with((Dyn(4), C));
    let _pred = logits.argmax::<2>();
}
