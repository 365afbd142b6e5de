// `cat` and `stack` take tensors of one shape type: two [2, 3] tensors join
// along axis 0 into a [Dyn, 3] (4 rows). Pieces of different lengths along the
// cat axis are typed `Dyn` there, and the other dims stay static.
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<2>, C<3>)>::ones();
    let b = Tensor::<(C<2>, C<3>)>::zeros();
    let c: Tensor<(Dyn, C<3>)> = cat::<0, _, _>(&[a.clone(), b]);
    assert_eq!(c.dims().to_vec(), vec![4, 3]);

    let one_row: Tensor<(Dyn, C<3>)> = Tensor::<(C<1>, C<3>)>::ones().try_into_shape().unwrap();
    let two_rows: Tensor<(Dyn, C<3>)> = a.try_into_shape().unwrap();
    let d = cat::<0, _, _>(&[one_row, two_rows]);
    assert_eq!(d.dims().to_vec(), vec![3, 3]);

    let u = Tensor::<(C<3>,)>::from_vec(vec![1., 2., 3.], (C,)).unwrap();
    let v = Tensor::<(C<3>,)>::from_vec(vec![4., 5., 6.], (C,)).unwrap();
    let batch: Tensor<(Dyn, C<3>)> = stack::<0, _, _>(&[u, v]);
    assert_eq!(batch.to_vec(), vec![1., 2., 3., 4., 5., 6.]);
}
