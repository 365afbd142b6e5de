// Max pooling 2x2 halves 28 to 14, not 13.
use forma::nn::layers::MaxPool2d;
use forma::prelude::*;

fn main() {
    let x = Tensor::<(Dyn, C<6>, C<28>, C<28>)>::zeros_with((Dyn(1), C, C, C));
    let y: Tensor<(Dyn, C<6>, C<13>, C<14>)> = MaxPool2d::<2>.forward(x);
    let _ = y;
}
