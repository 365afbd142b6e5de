// A model with fixed types (f32 on the CPU) has no conversion: only a
// model generic over its element type `E` and device `D` can become a
// bf16 or CUDA model.
use forma::nn::layers::Linear;
use forma::prelude::*;

#[derive(Module)]
struct Net {
    fc: Linear<4, 2>,
}

fn main() {
    let mut rng = Rng::seed_from(0);
    let net = Net { fc: Linear::new(&Cpu, &mut rng) };
    let _half = net.to_dtype::<bf16>();
}
