// Max pooling one sequence [channels, length] without its batch dim:
// max_pool1d takes [batch, channels, length].
use forma::prelude::*;

fn main() {
    let sequence = Tensor::<(C<4>, C<16>)>::zeros();
    let _pooled = sequence.try_max_pool1d(2, 2, 0);
}
