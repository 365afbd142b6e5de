// A Softmax layer over dim 2 of a rank-2 input.
use forma::nn::layers::Softmax;
use forma::prelude::*;

fn main() {
    let x = Tensor::<(Dyn, C<10>)>::zeros_with((Dyn(2), C));
    let _y: Tensor<(Dyn, C<10>)> = Softmax::<2>.forward(x);
}
