// Flattening [batch, 16, 5, 5] into the 400 = 16*5*5 features it holds.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(Dyn, C<16>, C<5>, C<5>)>::zeros_with((Dyn(2), C, C, C));
    let y: Tensor<(Dyn, C<400>)> = x.flatten();
    assert_eq!(y.dims().to_vec(), vec![2, 400]);
}
