// A Linear layer taking 784 features is given 100.
use forma::nn::layers::Linear;
use forma::prelude::*;

fn main() {
    let fc = Linear::<784, 10>::new(&Cpu, &mut Rng::seed_from(0));
    let x = Tensor::<(Dyn, C<100>)>::zeros_with((Dyn(2), C));
    let _ = fc.forward(x);
}
