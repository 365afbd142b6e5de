// An MLP with a hand-written forward: the `Forward` impl's input and output
// types are the model's declared shapes (a batch of any size, 784 features
// in, 10 logits out), and the compiler checks every step between them.
use forma::nn::layers::{Linear, Relu};
use forma::prelude::*;

#[derive(Module)]
pub struct Mlp {
    pub fc1: Linear<784, 512>,
    pub fc2: Linear<512, 512>,
    pub fc3: Linear<512, 10>,
    pub act: Relu,
}

impl Mlp {
    pub fn new(rng: &mut Rng) -> Self {
        Mlp {
            fc1: Linear::new(&Cpu, rng),
            fc2: Linear::new(&Cpu, rng),
            fc3: Linear::new(&Cpu, rng),
            act: Relu,
        }
    }
}

impl<B: Dim> Forward<Tensor![B, 784], Tensor![B, 10]> for Mlp {
    fn try_forward(&self, x: Tensor![B, 784]) -> forma::Result<Tensor![B, 10]> {
        let x = child!(self.act, child!(self.fc1, x)?)?;
        let x = child!(self.act, child!(self.fc2, x)?)?;
        child!(self.fc3, x)
    }
}

#[allow(dead_code)]
fn main() {
    let mut rng = Rng::seed_from(0);
    let model = Mlp::new(&mut rng);
    let y = model.forward(Tensor::<(Dyn, C<784>)>::zeros_with((Dyn(3), C)));
    assert_eq!(y.dims()[..], [3, 10]);
    assert_eq!(model.num_parameters(), 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10);
}
