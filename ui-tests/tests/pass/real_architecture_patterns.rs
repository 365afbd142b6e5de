// Patterns of real architectures that the static shapes must let through:
// a transformer head split and merge with `Dyn` batch and sequence, a U-Net
// skip joining pieces of 3 and 4 channels into a `Conv2d<7, ..>`, a
// residual MLP generic over its batch that adds two `B`-batched tensors,
// and a ResNet stage of blocks generic over their channels whose first
// block (a projection) differs in type from the rest.
use forma::nn::layers::{BatchNorm2d, Conv2d, Linear, Relu};
use forma::prelude::*;

/// `(B, S, 384)` to `(B, S, 12, 32)` and back, both sizes `Dyn`.
fn split_merge(x: Tensor<(Dyn, Dyn, C<384>)>) -> Tensor<(Dyn, Dyn, C<384>)> {
    let heads: Tensor<(Dyn, Dyn, C<12>, C<32>)> = x.reshape();
    let heads = heads.transpose::<1, 2>(); // (B, 12, S, 32)
    let back = heads.transpose::<1, 2>().contiguous();
    back.reshape()
}

/// A U-Net decoder step: upsampled features (3 channels) joined with the
/// encoder's skip (4 channels), then a convolution over all 7.
#[derive(Module)]
struct UpStep {
    conv: Conv2d<7, 8, 3, 1, 1>,
}

type Up = Tensor<(Dyn, C<3>, C<16>, C<16>)>;
type Skip = Tensor<(Dyn, C<4>, C<16>, C<16>)>;
type Joined = Tensor<(Dyn, C<8>, C<16>, C<16>)>;

impl Forward<(Up, Skip), Joined> for UpStep {
    fn try_forward(&self, (up, skip): (Up, Skip)) -> forma::Result<Joined> {
        let x = up.try_cat_with::<1, C<7>, _>(&skip)?;
        child!(self.conv, x)
    }
}

/// A residual MLP generic over the batch: `B: Dim` is all it needs.
#[derive(Module)]
struct ResidualMlp {
    fc1: Linear<16, 16>,
    act: Relu,
    fc2: Linear<16, 16>,
}

impl<B: Dim> Forward<Tensor![B, 16], Tensor![B, 16]> for ResidualMlp {
    fn try_forward(&self, x: Tensor![B, 16]) -> forma::Result<Tensor![B, 16]> {
        let h = child!(self.act, child!(self.fc1, x.clone())?)?;
        let h = child!(self.fc2, h)?;
        Ok(&h + &x)
    }
}

/// A residual block generic over its channels, with the identity shortcut:
/// its input is added to its output.
#[derive(Module)]
struct Block<const CH: usize> {
    conv1: Conv2d<CH, CH, 3, 1, 1>,
    bn1: BatchNorm2d<CH>,
    relu: Relu,
    conv2: Conv2d<CH, CH, 3, 1, 1>,
    bn2: BatchNorm2d<CH>,
}

impl<const CH: usize> Block<CH> {
    fn new(rng: &mut Rng) -> Self {
        Block {
            conv1: Conv2d::new(&Cpu, rng),
            bn1: BatchNorm2d::new(&Cpu),
            relu: Relu,
            conv2: Conv2d::new(&Cpu, rng),
            bn2: BatchNorm2d::new(&Cpu),
        }
    }
}

type Map<B, const CH: usize, H, W> = Tensor<(B, C<CH>, H, W)>;

impl<const CH: usize, B: Dim, H: Dim, W: Dim> Forward<Map<B, CH, H, W>, Map<B, CH, H, W>>
    for Block<CH>
{
    fn try_forward(&self, x: Map<B, CH, H, W>) -> forma::Result<Map<B, CH, H, W>> {
        let y: Map<B, CH, H, W> = child!(self.conv1, x.clone())?;
        let y = child!(self.relu, child!(self.bn1, y)?)?;
        let y: Map<B, CH, H, W> = child!(self.conv2, y)?;
        let y = child!(self.bn2, y)?;
        child!(self.relu, &y + &x)
    }
}

/// A ResNet stage: a first block that changes the channels (a 1x1
/// projection here), then blocks of one type.
#[derive(Module)]
struct Stage<const I: usize, const O: usize> {
    first: Conv2d<I, O, 1>,
    rest: Vec<Block<O>>,
}

impl<const I: usize, const O: usize, B: Dim, H: Dim, W: Dim>
    Forward<Map<B, I, H, W>, Map<B, O, H, W>> for Stage<I, O>
{
    fn try_forward(&self, x: Map<B, I, H, W>) -> forma::Result<Map<B, O, H, W>> {
        let mut x: Map<B, O, H, W> = child!(self.first, x)?;
        for (i, block) in self.rest.iter().enumerate() {
            x = block.try_forward_as(format!("rest.{i}"), x)?;
        }
        Ok(x)
    }
}

#[allow(dead_code)]
fn main() {
    let mut rng = Rng::seed_from(0);
    let x = Tensor::<(Dyn, Dyn, C<384>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
    let y = split_merge(x.clone());
    assert_eq!(y.dims()[..], [2, 5, 384]);
    assert_eq!(y.to_vec(), x.to_vec());

    let up = UpStep {
        conv: Conv2d::new(&Cpu, &mut rng),
    };
    let a = Tensor::<(Dyn, C<3>, C<16>, C<16>)>::randn((Dyn(2), C, C, C), &mut rng);
    let b = Tensor::<(Dyn, C<4>, C<16>, C<16>)>::randn((Dyn(2), C, C, C), &mut rng);
    let joined: Tensor<(Dyn, C<7>, C<16>, C<16>)> = a.cat_with::<1, _, _>(&b);
    assert_eq!(joined.dims()[..], [2, 7, 16, 16]);
    // The first three channels are `a`'s, the next four `b`'s.
    let first: Tensor<(Dyn, C<3>, C<16>, C<16>)> = joined.narrow::<1>(0, 3).try_into_shape().unwrap();
    assert_eq!(first.to_vec(), a.to_vec());
    let y = up.forward((a, b));
    assert_eq!(y.dims()[..], [2, 8, 16, 16]);

    let mlp = ResidualMlp {
        fc1: Linear::new(&Cpu, &mut rng),
        act: Relu,
        fc2: Linear::new(&Cpu, &mut rng),
    };
    let x = Tensor::<(C<3>, C<16>)>::randn((C, C), &mut rng);
    let y: Tensor<(C<3>, C<16>)> = mlp.forward(x);
    assert_eq!(y.dims()[..], [3, 16]);

    let stage = Stage::<4, 8> {
        first: Conv2d::new(&Cpu, &mut rng),
        rest: vec![Block::new(&mut rng), Block::new(&mut rng)],
    };
    let x = Tensor::<(Dyn, C<4>, C<6>, C<6>)>::randn((Dyn(2), C, C, C), &mut rng);
    let y: Tensor<(Dyn, C<8>, C<6>, C<6>)> = stage.forward(x);
    assert_eq!(y.dims()[..], [2, 8, 6, 6]);
    assert!(y.to_vec().iter().all(|v| *v >= 0.0), "each block ends in a ReLU");
    let keys: Vec<String> = stage.state_dict().keys().map(String::from).collect();
    assert!(keys.contains(&"rest.1.bn2.running_var".to_string()));
}
