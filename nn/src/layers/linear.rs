//! `Linear`: `y = x W^T + b`, like `nn.Linear`.

use super::fan_in_uniform;
use crate::Forward;
use forma_core::device::Device;
use forma_core::{Dim, Float, Rng, Tensor, C};
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

macro_rules! linear_forward {
    ($($d:ident),*) => {
        impl<$($d: Dim,)* const I: usize, const O: usize, E: Float, D: Device<E>>
            Forward<Tensor<($($d,)* C<I>,), E, D>, Tensor<($($d,)* C<O>,), E, D>> for Linear<I, O, E, D>
        {
            fn forward(&self, x: Tensor<($($d,)* C<I>,), E, D>) -> Tensor<($($d,)* C<O>,), E, D> {
                let y = x.matmul(&self.weight.t());
                match &self.bias {
                    Some(b) => &y + b,
                    None => y,
                }
            }
        }
    };
}

linear_forward!(A);
linear_forward!(A, B);
linear_forward!(A, B, F);
