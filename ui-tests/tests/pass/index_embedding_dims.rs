// Index ops keep static sizes: `index_select` along axis 1 replaces that dim
// by the index's length, and `embedding` appends the table's feature dim, so
// a [10, 4] table looked up by [2, 3] ids gives [2, 3, 4], which a [4, 2]
// projection accepts.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C)).unwrap();
    let idx = Tensor::<(C<2>,), i64>::from_vec(vec![2, 0], (C,)).unwrap();
    let picked: Tensor<(C<2>, C<2>)> = x.index_select::<1, _>(&idx);
    assert_eq!(picked.to_vec(), vec![3., 1., 6., 4.]);

    let table = Tensor::<(C<10>, C<4>)>::ones();
    let tokens = Tensor::<(C<2>, C<3>), i64>::from_vec(vec![0, 1, 2, 7, 8, 9], (C, C)).unwrap();
    let emb: Tensor<(C<2>, C<3>, C<4>)> = table.embedding(&tokens);
    let proj = Tensor::<(C<4>, C<2>)>::ones();
    let y: Tensor<(C<2>, C<3>, C<2>)> = emb.matmul(&proj);
    assert_eq!(y.to_vec(), vec![4.0; 12]);
}
