// An LSTM whose proj_size (8) is not smaller than its hidden size (4), which
// PyTorch refuses.
use forma::nn::layers::Lstm;
use forma::prelude::*;

fn main() {
    let _lstm = Lstm::<3, 4, false, f32, Cpu, 8>::new(1, &Cpu, &mut Rng::seed_from(0));
}
