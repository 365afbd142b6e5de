// Gathering one class score per row of [4, 10] logits along axis 1 with a
// [4] index: `gather`'s index has the input's rank, here [4, 1] (PyTorch's
// `x.gather(1, idx.unsqueeze(1))`).
use forma::prelude::*;

fn main() {
    let logits = Tensor::<(C<4>, C<10>)>::zeros();
    let labels = Tensor::<(C<4>,), i64>::zeros();
    let _picked = logits.gather::<1, _>(&labels);
}
