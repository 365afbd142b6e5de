// 64 embedding features cannot be split into 5 attention heads.
use forma::nn::layers::MultiheadAttention;
use forma::prelude::*;

fn main() {
    let _mha = MultiheadAttention::<64, 5>::new(&Cpu, &mut Rng::seed_from(0));
}
