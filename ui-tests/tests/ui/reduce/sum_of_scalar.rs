// Summing a rank-0 tensor (a scalar, such as a loss) along axis 0: it has
// no axes.
use forma::prelude::*;

fn main() {
    let loss = Tensor::<()>::ones();
    let _s = loss.sum::<0>();
}
