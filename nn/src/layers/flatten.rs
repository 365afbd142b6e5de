//! `Flatten`, like `nn.Flatten()`: every axis after the batch into one.

use crate::Forward;
use forma_core::device::Device;
use forma_core::{Dim, Float, Tensor};
use forma_macros::Module;

/// Flattens all axes after the first, like `nn.Flatten()` (start_dim=1).
/// The caller (or the next layer's input type) states the flattened size; a
/// static size that is not the product of the input's fails `cargo build`.
#[derive(Module, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct Flatten;

impl Flatten {
    fn extra_repr(&self) -> String {
        "start_dim=1, end_dim=-1".to_string()
    }
}

macro_rules! flatten_forward {
    ($($d:ident),*) => {
        impl<B: Dim, $($d: Dim,)* O: Dim, E: Float, D: Device<E>>
            Forward<Tensor<(B, $($d,)*), E, D>, Tensor<(B, O), E, D>> for Flatten
        {
            fn try_forward(&self, x: Tensor<(B, $($d,)*), E, D>) -> forma_core::Result<Tensor<(B, O), E, D>> {
                x.try_flatten::<O>()
            }
        }
    };
}

flatten_forward!(A1, A2);
flatten_forward!(A1, A2, A3);
flatten_forward!(A1, A2, A3, A4);

impl crate::shape_step::ShapeStep for Flatten {
    const STEP: crate::shape_step::Step = crate::shape_step::Step::Flatten { layer: "Flatten" };
}
