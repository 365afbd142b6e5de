//! The shape rule of every loss: the target's shape must be the input's
//! (for class indices, the input's without its class axis). Two static sizes
//! that differ are a compile error naming both in decimal; a [`Dyn`] size is
//! checked when the loss runs and reported as a [`super::LossError`].
//!
//! Code generic over a dim (`fn step<B: Dim>(..)`) states the rule as a bound,
//! `B: LossDim<B>`, which every concrete dim satisfies.

use forma_core::{Dim, Dyn, One, Shape, C};

/// A target shape that matches the input shape `Self` dim by dim.
#[diagnostic::on_unimplemented(
    message = "loss: expected a target of shape `{Self}`, but the target has shape `{T}`",
    label = "the target must have the input's shape (without the class axis, for class indices)",
    note = "a loss compares the input and the target element by element; with class indices the target is the input without its class axis (axis 1)"
)]
pub trait LossShape<T: Shape>: Shape {}

/// A target dim that matches the input dim `Self`: equal static sizes, or a
/// [`Dyn`] on either side (checked at run time).
#[diagnostic::on_unimplemented(
    message = "loss: the input and the target differ in size: {Self} vs {T}",
    label = "the input's size {Self} vs the target's size {T}",
    note = "each dim of the target must equal the input's; a `Dyn` dim is checked when the loss runs"
)]
pub trait LossDim<T: Dim>: Dim {}

/// Two static sizes that must be equal, carried as numbers so the message
/// prints them in decimal.
#[diagnostic::on_unimplemented(
    message = "loss: the input has size {A} where the target has size {B}",
    label = "the input's size {A} vs the target's size {B}",
    note = "the target of a loss must have the input's shape (with class indices, the input's shape without the class axis)"
)]
pub trait LossSizes<const A: usize, const B: usize> {}
impl<const N: usize> LossSizes<N, N> for () {}

impl<const N: usize, const M: usize> LossDim<C<M>> for C<N> where (): LossSizes<N, M> {}
impl<const N: usize> LossDim<Dyn> for C<N> {}
impl<const N: usize> LossDim<C<N>> for Dyn {}
impl LossDim<Dyn> for Dyn {}
impl LossDim<One> for One {}
impl LossDim<Dyn> for One {}
impl LossDim<One> for Dyn {}
impl<const N: usize> LossDim<C<N>> for One where (): LossSizes<1, N> {}
impl<const N: usize> LossDim<One> for C<N> where (): LossSizes<N, 1> {}

macro_rules! loss_shape {
    ($(($($a:ident $b:ident),*))*) => {$(
        impl<$($a: Dim, $b: Dim),*> LossShape<($($b,)*)> for ($($a,)*)
        where
            $($a: LossDim<$b>),*
        {
        }
    )*};
}

impl LossShape<()> for () {}
loss_shape! {
    (A0 B0)
    (A0 B0, A1 B1)
    (A0 B0, A1 B1, A2 B2)
    (A0 B0, A1 B1, A2 B2, A3 B3)
    (A0 B0, A1 B1, A2 B2, A3 B3, A4 B4)
    (A0 B0, A1 B1, A2 B2, A3 B3, A4 B4, A5 B5)
}
