// LeNet-5 as a sequential model: `#[derive(Sequential)]` chains the fields
// from the declared input to the declared output. The macro works out each
// convolution's and pooling's output size (28 -> 28 -> 14 -> 10 -> 5) from
// the literal sizes, and the types check every step.
use forma::nn::layers::{Conv2d, Flatten, Linear, MaxPool2d, Relu};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 1, 28, 28], output = [B, 10])]
pub struct LeNet5<E: Float = f32, D: Device<E> = Cpu> {
    pub conv1: Conv2d<1, 6, 5, 1, 2, 1, E, D>,
    pub act1: Relu,
    pub pool1: MaxPool2d<2>,
    pub conv2: Conv2d<6, 16, 5, 1, 0, 1, E, D>,
    pub act2: Relu,
    pub pool2: MaxPool2d<2>,
    pub flatten: Flatten,
    pub fc1: Linear<400, 120, E, D>,
    pub act3: Relu,
    pub fc2: Linear<120, 84, E, D>,
    pub act4: Relu,
    pub fc3: Linear<84, 10, E, D>,
}

impl<E: Float, D: Device<E>> LeNet5<E, D> {
    pub fn new(device: &D, rng: &mut Rng) -> Self {
        LeNet5 {
            conv1: Conv2d::new(device, rng),
            act1: Relu,
            pool1: MaxPool2d,
            conv2: Conv2d::new(device, rng),
            act2: Relu,
            pool2: MaxPool2d,
            flatten: Flatten,
            fc1: Linear::new(device, rng),
            act3: Relu,
            fc2: Linear::new(device, rng),
            act4: Relu,
            fc3: Linear::new(device, rng),
        }
    }
}

#[allow(dead_code)]
fn main() {
    let mut rng = Rng::seed_from(0);
    let model = LeNet5::<f32, Cpu>::new(&Cpu, &mut rng);
    let x = Tensor::<(Dyn, C<1>, C<28>, C<28>)>::randn((Dyn(2), C, C, C), &mut rng);
    let y: Tensor<(Dyn, C<10>)> = model.forward(x);
    assert_eq!(y.dims()[..], [2, 10]);
}
