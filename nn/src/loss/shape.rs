//! The shape rule of every loss: the target's shape must be the input's
//! (for class indices, the input's without its class axis). Two static sizes
//! that differ, or two ranks, are a compile error naming the loss and both
//! numbers in decimal; a [`Dyn`] size is checked when the loss runs and
//! reported as a [`super::LossError`].
//!
//! The rule takes the loss's name as a type (`Op`, one of [`op`]), so the
//! message starts with it: "mse_loss: the input has size 10 where the target
//! has size 9". Code generic over a dim (`fn step<B: Dim>(..)`) states the
//! rule as a bound, `B: LossDim<B, op::mse_loss>`, which every concrete dim
//! satisfies.

use forma_core::{Dim, Dyn, One, Shape, C};

/// The names of the losses, as the shape rule's `Op` (see the module's docs).
#[allow(non_camel_case_types)]
pub mod op {
    macro_rules! names {
        ($($name:ident),*) => {$(
            #[doc = concat!("[`super::super::", stringify!($name), "`] and its struct form.")]
            #[derive(Debug)]
            pub enum $name {}
        )*};
    }
    names!(
        mse_loss,
        l1_loss,
        smooth_l1_loss,
        huber_loss,
        binary_cross_entropy,
        binary_cross_entropy_with_logits,
        cross_entropy,
        nll_loss,
        kl_div
    );
}

/// A target shape that matches the input shape `Self` dim by dim, for the
/// loss `Op`.
#[diagnostic::on_unimplemented(
    message = "{Op}: expected a target of shape `{Self}`, but the target has shape `{T}`",
    label = "the target must have the input's shape (without the class axis, for class indices)",
    note = "a loss compares the input and the target element by element; with class indices the target is the input without its class axis (axis 1)"
)]
pub trait LossShape<T: Shape, Op>: Shape {}

/// A target dim that matches the input dim `Self`: equal static sizes, or a
/// [`Dyn`] on either side (checked at run time).
#[diagnostic::on_unimplemented(
    message = "{Op}: the input and the target differ in size: {Self} vs {T}",
    label = "the input's size {Self} vs the target's size {T}",
    note = "each dim of the target must equal the input's; a `Dyn` dim is checked when the loss runs"
)]
pub trait LossDim<T: Dim, Op>: Dim {}

/// Two static sizes that must be equal, carried as numbers so the message
/// prints them in decimal.
#[diagnostic::on_unimplemented(
    message = "{Op}: the input has size {A} where the target has size {B}",
    label = "the input's size {A} vs the target's size {B}",
    note = "the target of a loss must have the input's shape (with class indices, the input's shape without the class axis)"
)]
pub trait LossSizes<const A: usize, const B: usize, Op> {}
impl<const N: usize, Op> LossSizes<N, N, Op> for () {}

/// Two ranks that must be equal, carried as numbers.
#[diagnostic::on_unimplemented(
    message = "{Op}: the target has rank {B} where rank {A} is expected",
    label = "a target of rank {B}; the input calls for rank {A}",
    note = "the target of a loss must have the input's shape (with class indices, the input's shape without the class axis)"
)]
pub trait LossRanks<const A: usize, const B: usize, Op> {}

/// No dim is either of these; the two impls below keep rustc from settling
/// `B0: LossRanks<..>` while the target's first dim `B0` is still unknown
/// (with one impl, or with a bound it could already see fail, rustc picks
/// the same-rank impl before reading the target and reports "mismatched
/// types" instead of the ranks).
#[allow(dead_code)] // never built: a type for the impls below only
enum Unranked1 {}
#[allow(dead_code)]
enum Unranked2 {}
impl<const A: usize, const B: usize, Op> LossRanks<A, B, Op> for Unranked1 {}
impl<const A: usize, const B: usize, Op> LossRanks<A, B, Op> for Unranked2 {}

impl<const N: usize, const M: usize, Op> LossDim<C<M>, Op> for C<N> where (): LossSizes<N, M, Op> {}
impl<const N: usize, Op> LossDim<Dyn, Op> for C<N> {}
impl<const N: usize, Op> LossDim<C<N>, Op> for Dyn {}
impl<Op> LossDim<Dyn, Op> for Dyn {}
impl<Op> LossDim<One, Op> for One {}
impl<Op> LossDim<Dyn, Op> for One {}
impl<Op> LossDim<One, Op> for Dyn {}
impl<const N: usize, Op> LossDim<C<N>, Op> for One where (): LossSizes<1, N, Op> {}
impl<const N: usize, Op> LossDim<One, Op> for C<N> where (): LossSizes<N, 1, Op> {}

macro_rules! loss_shape {
    ($(($($a:ident $b:ident),*))*) => {$(
        impl<$($a: Dim, $b: Dim,)* Op> LossShape<($($b,)*), Op> for ($($a,)*)
        where
            $($a: LossDim<$b, Op>),*
        {
        }
    )*};
}

impl<Op> LossShape<(), Op> for () {}
loss_shape! {
    (A0 B0)
    (A0 B0, A1 B1)
    (A0 B0, A1 B1, A2 B2)
    (A0 B0, A1 B1, A2 B2, A3 B3)
    (A0 B0, A1 B1, A2 B2, A3 B3, A4 B4)
    (A0 B0, A1 B1, A2 B2, A3 B3, A4 B4, A5 B5)
}

/// A target of another rank (1 to 6; a scalar target of a tensor input
/// stays "mismatched types"): an impl per pair of ranks that reports the two
/// ranks (with one impl per input rank, rustc would instead unify the target
/// with it and print "mismatched types").
macro_rules! loss_ranks {
    ($(($($a:ident),*) $ra:literal, ($($b:ident),*) $rb:literal;)*) => {$(
        impl<$($a: Dim,)* $($b: Dim,)* Op> LossShape<($($b,)*), Op> for ($($a,)*) where
            B0: LossRanks<$ra, $rb, Op>
        {
        }
    )*};
}

loss_ranks! {
    () 0, (B0) 1;
    () 0, (B0, B1) 2;
    () 0, (B0, B1, B2) 3;
    () 0, (B0, B1, B2, B3) 4;
    () 0, (B0, B1, B2, B3, B4) 5;
    () 0, (B0, B1, B2, B3, B4, B5) 6;
    (A0) 1, (B0, B1) 2;
    (A0) 1, (B0, B1, B2) 3;
    (A0) 1, (B0, B1, B2, B3) 4;
    (A0) 1, (B0, B1, B2, B3, B4) 5;
    (A0) 1, (B0, B1, B2, B3, B4, B5) 6;
    (A0, A1) 2, (B0) 1;
    (A0, A1) 2, (B0, B1, B2) 3;
    (A0, A1) 2, (B0, B1, B2, B3) 4;
    (A0, A1) 2, (B0, B1, B2, B3, B4) 5;
    (A0, A1) 2, (B0, B1, B2, B3, B4, B5) 6;
    (A0, A1, A2) 3, (B0) 1;
    (A0, A1, A2) 3, (B0, B1) 2;
    (A0, A1, A2) 3, (B0, B1, B2, B3) 4;
    (A0, A1, A2) 3, (B0, B1, B2, B3, B4) 5;
    (A0, A1, A2) 3, (B0, B1, B2, B3, B4, B5) 6;
    (A0, A1, A2, A3) 4, (B0) 1;
    (A0, A1, A2, A3) 4, (B0, B1) 2;
    (A0, A1, A2, A3) 4, (B0, B1, B2) 3;
    (A0, A1, A2, A3) 4, (B0, B1, B2, B3, B4) 5;
    (A0, A1, A2, A3) 4, (B0, B1, B2, B3, B4, B5) 6;
    (A0, A1, A2, A3, A4) 5, (B0) 1;
    (A0, A1, A2, A3, A4) 5, (B0, B1) 2;
    (A0, A1, A2, A3, A4) 5, (B0, B1, B2) 3;
    (A0, A1, A2, A3, A4) 5, (B0, B1, B2, B3) 4;
    (A0, A1, A2, A3, A4) 5, (B0, B1, B2, B3, B4, B5) 6;
    (A0, A1, A2, A3, A4, A5) 6, (B0) 1;
    (A0, A1, A2, A3, A4, A5) 6, (B0, B1) 2;
    (A0, A1, A2, A3, A4, A5) 6, (B0, B1, B2) 3;
    (A0, A1, A2, A3, A4, A5) 6, (B0, B1, B2, B3) 4;
    (A0, A1, A2, A3, A4, A5) 6, (B0, B1, B2, B3, B4) 5;
}

/// The shape of class-index targets for an input `Self`: the input without
/// its class axis (axis 1), and `()` for one sample's `[classes]`. Defined
/// for every shape, so a result type named through it is never the error
/// (a free function would otherwise report a wrong input twice);
/// [`ClassInput`] is the rule.
pub trait ClassTargets: Shape {
    /// The shape of class-index targets.
    type Targets: Shape;
    /// The class dim (`Dyn` for a shape without one).
    type Classes: Dim;
}

impl ClassTargets for () {
    type Targets = ();
    type Classes = Dyn;
}

/// The input of a class loss `Op` (`cross_entropy`, `nll_loss`): one
/// sample's scores `[classes]`, or `[batch, classes, d1, ..]`, as PyTorch
/// takes them.
#[diagnostic::on_unimplemented(
    message = "{Op}: the input `{Self}` has no class axis",
    label = "a scalar, not scores over classes",
    note = "a class loss takes scores [classes] for one sample or [batch, classes, ..] for a batch"
)]
pub trait ClassInput<Op>: ClassTargets {}

impl<K: Dim> ClassTargets for (K,) {
    type Targets = ();
    type Classes = K;
}

impl<K: Dim, Op> ClassInput<Op> for (K,) {}

macro_rules! class_input {
    ($(($($rest:ident),*))*) => {$(
        impl<N: Dim, K: Dim, $($rest: Dim,)*> ClassTargets for (N, K, $($rest,)*) {
            type Targets = (N, $($rest,)*);
            type Classes = K;
        }

        impl<N: Dim, K: Dim, $($rest: Dim,)* Op> ClassInput<Op> for (N, K, $($rest,)*) {}
    )*};
}

class_input! {
    ()
    (D2)
    (D2, D3)
    (D2, D3, D4)
    (D2, D3, D4, D5)
}

/// Two static class counts that must be equal, the input's and its class
/// weight's, carried as numbers so the message prints them in decimal.
#[diagnostic::on_unimplemented(
    message = "{Op}: the input has {A} classes where the class weight has {B}",
    label = "the weight's length differs from the input's class axis",
    note = "a class weight has one value per class: `[C]` for logits `[batch, C, ..]`"
)]
pub trait WeightSizes<const A: usize, const B: usize, Op> {}
impl<const N: usize, Op> WeightSizes<N, N, Op> for () {}

/// A class weight of length `K` for an input whose class dim is `Self`, in
/// the loss `Op`: equal static sizes, or a [`Dyn`] on either side (checked
/// when the loss runs). A loss without a weight has `K = Dyn`, which every
/// class dim takes (so code generic over the input needs no bound for it).
pub trait ClassWeight<K: Dim, Op>: Dim {}
impl<X: Dim, Op> ClassWeight<Dyn, Op> for X {}
impl<const N: usize, const M: usize, Op> ClassWeight<C<M>, Op> for C<N> where
    (): WeightSizes<N, M, Op>
{
}
impl<const M: usize, Op> ClassWeight<C<M>, Op> for Dyn {}
impl<const M: usize, Op> ClassWeight<C<M>, Op> for One where (): WeightSizes<1, M, Op> {}
impl<const N: usize, Op> ClassWeight<One, Op> for C<N> where (): WeightSizes<N, 1, Op> {}
impl<Op> ClassWeight<One, Op> for Dyn {}
impl<Op> ClassWeight<One, Op> for One {}
