//! `Linear` (`y = x W^T + b`) and `Bilinear` (`y = x1^T W x2 + b`), like
//! `nn.Linear` and `nn.Bilinear`.

use super::fan_in_uniform;
use crate::Forward;
use forma_core::device::Device;
use forma_core::shape::Ax;
use forma_core::{Dim, Dyn, Float, Result, Rng, Tensor, C};
use forma_cpu::Cpu;
use forma_macros::Module;

/// A fully connected layer from `I` to `O` features, like `nn.Linear(I, O)`:
/// `weight` is `[O, I]` and `bias` `[O]`, both initialised from
/// `U(-1/sqrt(I), 1/sqrt(I))` as in PyTorch.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::Linear, Forward, Module};
/// let mut rng = Rng::seed_from(0);
/// let fc = Linear::<3, 2>::new(&Cpu, &mut rng);
/// let y: Tensor<(Dyn, C<2>)> = fc.forward(Tensor::zeros_with((Dyn(4), C)));
/// assert_eq!(y.dims()[..], [4, 2]);
/// assert_eq!(fc.num_parameters(), 8);
/// ```
#[derive(Module, Clone, Debug)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct Linear<const I: usize, const O: usize, E: Float = f32, D: Device<E> = Cpu> {
    /// `[out_features, in_features]`.
    pub weight: Tensor<(C<O>, C<I>), E, D>,
    /// `[out_features]`, absent for `bias=False`.
    pub bias: Option<Tensor<(C<O>,), E, D>>,
}

impl<const I: usize, const O: usize, E: Float, D: Device<E>> Linear<I, O, E, D> {
    /// A layer with a bias, initialised like PyTorch's.
    pub fn new(device: &D, rng: &mut Rng) -> Self {
        Self::with_bias(true, device, rng)
    }

    /// A layer with or without a bias (`bias=False`).
    pub fn with_bias(bias: bool, device: &D, rng: &mut Rng) -> Self {
        let weight = fan_in_uniform((C, C), I, device, rng);
        let bias = bias.then(|| fan_in_uniform((C,), I, device, rng));
        Linear { weight, bias }
    }

    fn extra_repr(&self) -> String {
        let bias = if self.bias.is_some() { "True" } else { "False" };
        format!("in_features={I}, out_features={O}, bias={bias}")
    }
}

/// The input features of a `Linear<I, ..>` against the input's last dim,
/// carried as numbers so a mismatch reads in decimal.
#[diagnostic::on_unimplemented(
    message = "Linear: the layer takes {I} input features, but the input has {N}",
    label = "an input of {N} features, for a layer of {I}",
    note = "a `Linear<I, O>` takes `[.., I]` and gives `[.., O]`: the last dim of its input must be `I`"
)]
pub trait LinearFeatures<const I: usize, const N: usize> {}
impl<const N: usize> LinearFeatures<N, N> for () {}

// The impls take any static last dim `N` and require `N == I` through
// `LinearFeatures`, so a wrong width is one error naming both numbers; an
// impl for `C<I>` alone made rustc list every `Forward` impl of every rank.
macro_rules! linear_forward {
    ($($d:ident),*) => {
        impl<$($d: Dim,)* const I: usize, const N: usize, const O: usize, E: Float, D: Device<E>>
            Forward<Tensor<($($d,)* C<N>,), E, D>, Tensor<($($d,)* C<O>,), E, D>> for Linear<I, O, E, D>
        where
            (): LinearFeatures<I, N>,
        {
            fn try_forward(&self, x: Tensor<($($d,)* C<N>,), E, D>) -> Result<Tensor<($($d,)* C<O>,), E, D>> {
                // `N == I` (the bound above): a change of type only.
                x.try_into_shape::<($($d,)* C<I>,)>()?
                    .try_linear(&self.weight, self.bias.as_ref())
            }
        }
    };
}

linear_forward!(A);
linear_forward!(A, B);
linear_forward!(A, B, F);

/// A bilinear layer, like `nn.Bilinear(I1, I2, O)`:
/// `y_o = x1^T W_o x2 + b_o`. `weight` is `[O, I1, I2]` and `bias` `[O]`,
/// both initialised from `U(-1/sqrt(I1), 1/sqrt(I1))` as in PyTorch. Its
/// input is the pair `(x1, x2)`, `[.., I1]` and `[.., I2]` with the same
/// leading dims.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::Bilinear, Forward, Module};
/// let mut rng = Rng::seed_from(0);
/// let bl = Bilinear::<2, 3, 4>::new(&Cpu, &mut rng);
/// let x1 = Tensor::<(Dyn, C<2>)>::ones_with((Dyn(5), C));
/// let x2 = Tensor::<(Dyn, C<3>)>::ones_with((Dyn(5), C));
/// let y: Tensor<(Dyn, C<4>)> = bl.forward((x1, x2));
/// assert_eq!(y.dims()[..], [5, 4]);
/// assert_eq!(bl.repr(), "Bilinear(in1_features=2, in2_features=3, out_features=4, bias=True)");
/// ```
#[derive(Module, Clone, Debug)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct Bilinear<
    const I1: usize,
    const I2: usize,
    const O: usize,
    E: Float = f32,
    D: Device<E> = Cpu,
> {
    /// `[out_features, in1_features, in2_features]`.
    pub weight: Tensor<(C<O>, C<I1>, C<I2>), E, D>,
    /// `[out_features]`, absent for `bias=False`.
    pub bias: Option<Tensor<(C<O>,), E, D>>,
}

impl<const I1: usize, const I2: usize, const O: usize, E: Float, D: Device<E>>
    Bilinear<I1, I2, O, E, D>
{
    /// A layer with a bias, initialised like PyTorch's.
    pub fn new(device: &D, rng: &mut Rng) -> Self {
        Self::with_bias(true, device, rng)
    }

    /// A layer with or without a bias (`bias=False`).
    pub fn with_bias(bias: bool, device: &D, rng: &mut Rng) -> Self {
        let weight = fan_in_uniform((C, C, C), I1, device, rng);
        let bias = bias.then(|| fan_in_uniform((C,), I1, device, rng));
        Bilinear { weight, bias }
    }

    fn extra_repr(&self) -> String {
        let bias = if self.bias.is_some() { "True" } else { "False" };
        format!("in1_features={I1}, in2_features={I2}, out_features={O}, bias={bias}")
    }

    /// `[n, I1]` and `[n, I2]` to `[n, O]`.
    fn rows(
        &self,
        x1: Tensor<(Dyn, Dyn), E, D>,
        x2: Tensor<(Dyn, Dyn), E, D>,
    ) -> Result<Tensor<(Dyn, Dyn), E, D>> {
        let n = x1.dims()[0];
        // x1 @ [I1, O * I2] gives every `x1^T W_o` at once; a batched product
        // with x2 then finishes each output.
        let w = self.weight.into_dyn().permute::<(Ax<1>, Ax<0>, Ax<2>)>();
        let w = w.try_reshape_to((Dyn(I1), Dyn(O * I2)))?;
        let t = x1
            .try_matmul(&w)?
            .try_reshape_to((Dyn(n), Dyn(O), Dyn(I2)))?;
        let y = t
            .try_matmul(&x2.unsqueeze::<2>())?
            .try_reshape_to((Dyn(n), Dyn(O)))?;
        Ok(match &self.bias {
            Some(b) => &y + &b.into_dyn(),
            None => y,
        })
    }
}

macro_rules! bilinear_forward {
    ($($d:ident),*) => {
        impl<$($d: Dim,)* const I1: usize, const I2: usize, const O: usize, E: Float, D: Device<E>>
            Forward<
                (Tensor<($($d,)* C<I1>,), E, D>, Tensor<($($d,)* C<I2>,), E, D>),
                Tensor<($($d,)* C<O>,), E, D>,
            > for Bilinear<I1, I2, O, E, D>
        {
            /// # Errors
            /// If the two inputs' leading (`Dyn`) sizes differ.
            fn try_forward(
                &self,
                (x1, x2): (Tensor<($($d,)* C<I1>,), E, D>, Tensor<($($d,)* C<I2>,), E, D>),
            ) -> Result<Tensor<($($d,)* C<O>,), E, D>> {
                let (d1, d2) = (x1.dims(), x2.dims());
                let lead = &d1[..d1.len() - 1];
                if lead != &d2[..d2.len() - 1] {
                    return Err(forma_core::Error::shape(
                        "Bilinear",
                        format!("a second input with the leading sizes of the first, {}", forma_core::error::fmt_dims(&d1)),
                        &d2,
                    ));
                }
                let n: usize = lead.iter().product();
                let a = x1.try_reshape_to((Dyn(n), Dyn(I1)))?;
                let b = x2.try_reshape_to((Dyn(n), Dyn(I2)))?;
                let mut out = lead.to_vec();
                out.push(O);
                match forma_core::Shape::from_dims(&out) {
                    Some(shape) => self.rows(a, b)?.try_reshape_to(shape),
                    None => unreachable!("the output keeps the inputs' leading sizes"),
                }
            }
        }
    };
}

bilinear_forward!(A);
bilinear_forward!(A, B);
bilinear_forward!(A, B, F);

impl<const I: usize, const O: usize, E: Float, D: Device<E>> crate::shape_step::ShapeStep
    for Linear<I, O, E, D>
{
    const STEP: crate::shape_step::Step = crate::shape_step::Step::features("Linear", I, O);
}
