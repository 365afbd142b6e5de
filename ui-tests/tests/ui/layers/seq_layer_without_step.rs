// A user-defined layer that does not say what it does to a shape (no
// `ShapeStep` impl): the derive cannot follow the model through it, and
// says how to fix that, at the field.
use forma::nn::layers::Linear;
use forma::prelude::*;

#[derive(Module)]
struct Project {
    fc: Linear<16, 32>,
}

impl Forward<Tensor<(Dyn, C<16>)>, Tensor<(Dyn, C<32>)>> for Project {
    fn try_forward(&self, x: Tensor<(Dyn, C<16>)>) -> forma::Result<Tensor<(Dyn, C<32>)>> {
        child!(self.fc, x)
    }
}

#[derive(Module, Sequential)]
#[sequential(input = [Dyn, 16], output = [Dyn, 10])]
struct Net {
    project: Project,
    head: Linear<64, 10>,
}

fn main() {}
