// A generic model converted with `to_dtype` copies each field that names
// neither `E` nor `D` as it is, so such a field must be `Clone`; a `Mutex`
// is not.
use forma::nn::layers::Linear;
use forma::prelude::*;

#[derive(Module)]
struct Net<E: Float = f32, D: Device<E> = Cpu> {
    fc: Linear<4, 2, E, D>,
    #[module(skip)]
    cache: std::sync::Mutex<Vec<f32>>,
}

fn main() {
    let mut rng = Rng::seed_from(0);
    let net: Net = Net {
        fc: Linear::new(&Cpu, &mut rng),
        cache: Default::default(),
    };
    let _half = net.to_dtype::<bf16>();
}
