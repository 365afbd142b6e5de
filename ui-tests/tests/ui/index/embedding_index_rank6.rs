// Looking up embeddings for a rank-6 index: the result appends the table's
// dim, and shapes stop at rank 6.
use forma::prelude::*;

fn main() {
    let table = Tensor::<(C<10>, C<4>)>::zeros();
    let idx = Tensor::<(C<1>, C<1>, C<1>, C<1>, C<2>, C<3>), i64>::zeros();
    let _rows = table.embedding(&idx);
}
