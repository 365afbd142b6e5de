// A bidirectional LSTM with hidden size 4 gives 8 output features, not 4.
use forma::nn::layers::Lstm;
use forma::prelude::*;

fn main() {
    let lstm = Lstm::<3, 4, true>::new(1, &Cpu, &mut Rng::seed_from(0));
    let x = Tensor::<(Dyn, Dyn, C<3>)>::zeros_with((Dyn(2), Dyn(5), C));
    let (_y, _state): (Tensor<(Dyn, Dyn, C<4>)>, _) = lstm.forward_with(x, None);
}
