// Mixing dtypes takes an explicit cast: `to_dtype::<f32>()` turns the f64
// tensor into f32 before the addition.
use forma::prelude::*;

fn main() {
    let a = Tensor::<(C<2>, C<3>), f32>::ones();
    let b = Tensor::<(C<2>, C<3>), f64>::full(0.5);
    let c: Tensor<(C<2>, C<3>), f32> = &a + &b.to_dtype::<f32>();
    assert_eq!(c.to_vec(), vec![1.5f32; 6]);
}
