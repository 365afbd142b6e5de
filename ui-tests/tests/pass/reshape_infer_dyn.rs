// Reshapes whose element counts agree compile; one `Dyn` dim in the target is
// inferred from the element count, like PyTorch's `-1`.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<6>)>::zeros();
    let y: Tensor<(C<3>, C<4>)> = x.reshape();
    assert_eq!(y.dims().to_vec(), vec![3, 4]);

    let z: Tensor<(Dyn, C<3>)> = x.reshape();
    assert_eq!(z.dims().to_vec(), vec![4, 3]);
}
