// `sum_keepdim` keeps the reduced axis as `One`, which stretches: centring the
// rows of a [2, 3] matrix by their mean compiles, with the result [2, 3].
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C)).unwrap();
    let total: Tensor<(C<2>, One)> = x.sum_keepdim::<1>();
    let mean = total / 3.0;
    let centred: Tensor<(C<2>, C<3>)> = &x - &mean;
    assert_eq!(centred.to_vec(), vec![-1., 0., 1., -1., 0., 1.]);

    // `unsqueeze` also produces `One`: a [3] vector as a [1, 3] row.
    let row = Tensor::<(C<3>,)>::from_vec(vec![10., 20., 30.], (C,)).unwrap();
    let y: Tensor<(C<2>, C<3>)> = &x + &row.unsqueeze::<0>();
    assert_eq!(y.to_vec(), vec![11., 22., 33., 14., 25., 36.]);
}
