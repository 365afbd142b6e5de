// A runtime batch size (`Dyn`) with static features: adding a [3] bias to a
// [batch, 3] activation, and two [batch, 3] tensors, compiles; the `Dyn`
// sizes are checked when the op runs.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(Dyn, C<3>)>::ones_with((Dyn(4), C));
    let bias = Tensor::<(C<3>,)>::from_vec(vec![1., 2., 3.], (C,)).unwrap();
    let y: Tensor<(Dyn, C<3>)> = &x + &bias;
    assert_eq!(y.dims().to_vec(), vec![4, 3]);
    assert_eq!(y.to_vec()[..3], [2., 3., 4.]);

    let z: Tensor<(Dyn, C<3>)> = y.mul(&x);
    assert_eq!(z.dims().to_vec(), vec![4, 3]);
}
