// Patterns of real architectures that the static shapes must let through:
// a transformer head split and merge with `Dyn` batch and sequence, a U-Net
// skip joining pieces of 3 and 4 channels into a `Conv2d<7, ..>`, and a
// residual MLP generic over its batch that adds two `B`-batched tensors.
use forma::nn::layers::{Conv2d, Linear, Relu};
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
}
