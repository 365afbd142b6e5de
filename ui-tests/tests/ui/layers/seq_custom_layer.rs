// A user-defined layer (unknown to the derive) feeds 32 features into a
// Linear that takes 64: the types catch it, at the field.
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
