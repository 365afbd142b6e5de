// A matmul of f32 activations with f64 weights: convert one of them first
// (`to_dtype::<f32>()`), as PyTorch would refuse the mixed matmul too.
use forma::prelude::*;

fn main() {
    let x = Tensor::<(C<2>, C<3>)>::zeros();
    let w = Tensor::<(C<3>, C<4>), f64>::zeros();
    let _y = x.matmul(&w);
}
