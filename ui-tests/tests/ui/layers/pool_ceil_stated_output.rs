// With ceil_mode, max pooling 2x2 keeps the last partial window: 7 gives 4, not 3.
use forma::nn::layers::MaxPool2d;
use forma::prelude::*;

fn main() {
    let x = Tensor::<(Dyn, C<1>, C<7>, C<8>)>::zeros_with((Dyn(1), C, C, C));
    let y: Tensor<(Dyn, C<1>, C<3>, C<4>)> = MaxPool2d::<2, 2, 0, 1, true>.forward(x);
    let _ = y;
}
