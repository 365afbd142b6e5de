// A hand-written forward states a convolution's output as 25x25; a 5x5 kernel
// over 28x28 gives 24x24.
use forma::nn::layers::Conv2d;
use forma::prelude::*;

fn main() {
    let conv = Conv2d::<1, 6, 5>::new(&Cpu, &mut Rng::seed_from(0));
    let x = Tensor::<(Dyn, C<1>, C<28>, C<28>)>::zeros_with((Dyn(1), C, C, C));
    let y: Tensor<(Dyn, C<6>, C<25>, C<25>)> = conv.forward(x);
    let _ = y;
}
