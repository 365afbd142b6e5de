// Looking up embeddings with f32 token ids: index tensors must be i64.
use forma::prelude::*;

fn main() {
    let table = Tensor::<(C<100>, C<32>)>::zeros();
    let tokens = Tensor::<(C<2>, C<5>), f32>::zeros();
    let _x = table.embedding(&tokens);
}
