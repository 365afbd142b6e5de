// A 1-d pooling whose window size is a `u32` variable: sizes are `usize`.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<4>, C<16>)>::zeros();
    let kernel: u32 = 2;
    let _pooled = x.try_max_pool1d(kernel, 2, 0);
}
