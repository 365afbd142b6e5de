// A ResNet basic block with BatchNorm and a projection shortcut, as
// torchvision writes it. The downsample path is an optional tuple, whose
// state_dict keys are PyTorch's `downsample.0.weight`, `downsample.1.running_mean`...
use forma::nn::layers::{BatchNorm2d, Conv2d, Relu};
use forma::prelude::*;

#[derive(Module)]
pub struct BasicBlock {
    pub conv1: Conv2d<64, 128, 3, 2, 1>,
    pub bn1: BatchNorm2d<128>,
    pub relu: Relu,
    pub conv2: Conv2d<128, 128, 3, 1, 1>,
    pub bn2: BatchNorm2d<128>,
    pub downsample: Option<(Conv2d<64, 128, 1, 2>, BatchNorm2d<128>)>,
}

impl BasicBlock {
    pub fn new(rng: &mut Rng) -> Self {
        BasicBlock {
            conv1: Conv2d::with_options(1, false, &Cpu, rng),
            bn1: BatchNorm2d::new(&Cpu),
            relu: Relu,
            conv2: Conv2d::with_options(1, false, &Cpu, rng),
            bn2: BatchNorm2d::new(&Cpu),
            downsample: Some((Conv2d::with_options(1, false, &Cpu, rng), BatchNorm2d::new(&Cpu))),
        }
    }
}

type In = Tensor![Dyn, 64, 32, 32];
type Out = Tensor![Dyn, 128, 16, 16];

impl Forward<In, Out> for BasicBlock {
    fn try_forward(&self, x: In) -> forma::Result<Out> {
        let out: Out = child!(self.conv1, x.clone())?;
        let out = child!(self.relu, child!(self.bn1, out)?)?;
        let out: Out = child!(self.conv2, out)?;
        let out = child!(self.bn2, out)?;
        let identity: Out = match &self.downsample {
            // A tuple field's elements are named `downsample.0` and `downsample.1`.
            Some((conv, bn)) => forma::nn::scope::run("downsample", || {
                let y: Out = conv.try_forward_as(0, x)?;
                bn.try_forward_as(1, y)
            })?,
            None => unreachable!("the shapes differ, so the block needs its projection"),
        };
        child!(self.relu, &out + &identity)
    }
}

#[allow(dead_code)]
fn main() {
    let mut rng = Rng::seed_from(0);
    let mut block = BasicBlock::new(&mut rng);
    block.eval();
    let y = block.forward(Tensor::randn((Dyn(2), C, C, C), &mut rng));
    assert_eq!(y.dims()[..], [2, 128, 16, 16]);
    assert!(y.to_vec().iter().all(|v| *v >= 0.0));
}
