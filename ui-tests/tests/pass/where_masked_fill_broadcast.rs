// `where_cond` with a [2, 3] and a [3] branch (they broadcast to [2, 3]) and a
// [2, 3] condition; `masked_fill` of a [2, 3] tensor with a [3] mask, which
// broadcasts over the rows.
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<2>, C<3>)>::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C)).unwrap();
    let b = Tensor::<(C<3>,)>::zeros();
    let three = Tensor::<(C<2>, C<3>)>::full(3.0);
    let cond = a.gt(&three);
    let y: Tensor<(C<2>, C<3>)> = where_cond(&cond, &a, &b);
    assert_eq!(y.to_vec(), vec![0., 0., 0., 4., 5., 6.]);

    let col = Tensor::<(C<3>,)>::from_vec(vec![0., 1., 0.], (C,)).unwrap();
    let mask = col.gt(&Tensor::<(C<3>,)>::zeros());
    let z = a.masked_fill(&mask, -1.0);
    assert_eq!(z.to_vec(), vec![1., -1., 3., 4., -1., 6.]);
}
