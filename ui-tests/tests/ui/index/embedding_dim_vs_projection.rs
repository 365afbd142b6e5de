// A [100, 32] embedding table (32 features) fed to a projection that expects
// 64 input features: the embedding's dim is part of its result's type, so the
// matmul inner dims (32 vs 64) are compared at compile time.
use forma::prelude::*;

fn main() {
    let table = Tensor::<(C<100>, C<32>)>::zeros();
    let tokens = Tensor::<(C<2>, C<5>), i64>::zeros();
    let proj = Tensor::<(C<64>, C<16>)>::zeros();
    let x = table.embedding(&tokens);
    let _y = x.matmul(&proj);
}
