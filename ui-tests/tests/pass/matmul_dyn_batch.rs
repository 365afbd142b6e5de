// A linear layer on a runtime batch: [batch, 3] @ [3, 4] gives [batch, 4]; the
// inner dims are static and equal.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(Dyn, C<3>)>::ones_with((Dyn(5), C));
    let w = Tensor::<(C<3>, C<4>)>::ones();
    let y: Tensor<(Dyn, C<4>)> = x.matmul(&w);
    assert_eq!(y.dims().to_vec(), vec![5, 4]);
    assert_eq!(y.to_vec(), vec![3.0; 20]);

    // Batched, with a runtime batch on both sides.
    let a = Tensor::<(Dyn, C<2>, C<3>)>::ones_with((Dyn(2), C, C));
    let b = Tensor::<(Dyn, C<3>, C<4>)>::ones_with((Dyn(2), C, C));
    let c: Tensor<(Dyn, C<2>, C<4>)> = a.matmul(&b);
    assert_eq!(c.dims().to_vec(), vec![2, 2, 4]);
}
