//! Activation layers: parameterless modules wrapping the elementwise ops, so a
//! model can hold them as fields like `nn.ReLU()`.

use crate::Forward;
use forma_core::device::Device;
use forma_core::{Float, Shape, Tensor};
use forma_macros::Module;

macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident => $torch:literal, |$x:ident| $body:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Module, Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[module(crate = "crate", name = $torch)]
        pub struct $name;

        impl<S: Shape, E: Float, D: Device<E>> Forward<Tensor<S, E, D>, Tensor<S, E, D>> for $name {
            fn forward(&self, $x: Tensor<S, E, D>) -> Tensor<S, E, D> {
                $body
            }
        }
    )*};
}

activation! {
    /// `max(x, 0)`, like `nn.ReLU()`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::{layers::Relu, Forward};
    /// let y = Relu.forward(Tensor::<(C<2>,)>::from_vec(vec![-1.0, 2.0], (C,)).unwrap());
    /// assert_eq!(y.to_vec(), [0.0, 2.0]);
    /// ```
    Relu => "ReLU", |x| x.relu();
    /// The exact GELU, like `nn.GELU()`.
    Gelu => "GELU", |x| x.gelu();
    /// `tanh(x)`, like `nn.Tanh()`.
    Tanh => "Tanh", |x| x.tanh();
    /// `1 / (1 + e^-x)`, like `nn.Sigmoid()`.
    Sigmoid => "Sigmoid", |x| x.sigmoid();
    /// `x * sigmoid(x)`, like `nn.SiLU()`.
    Silu => "SiLU", |x| x.silu();
    /// The input unchanged, like `nn.Identity()`.
    Identity => "Identity", |x| x;
}
