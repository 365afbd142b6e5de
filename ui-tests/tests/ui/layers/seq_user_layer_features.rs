// A user-defined layer states its step (16 features in, 32 out); the next
// layer takes 64: the derive names both layers and the sizes, at the field.
use forma::nn::layers::Linear;
use forma::nn::shape_step::{ShapeStep, Step};
use forma::prelude::*;

#[derive(Module)]
struct Project {
    fc: Linear<16, 32>,
}

impl ShapeStep for Project {
    const STEP: Step = Step::features("Project", 16, 32);
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
