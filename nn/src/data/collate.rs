//! Collating: turning a batch's items into one value, usually tensors with
//! a leading batch axis.
//!
//! [`DefaultCollate`] does what PyTorch's `default_collate` does, with types:
//! tensors are stacked along a new first axis (`Tensor<S>` items give a
//! `Tensor<(Dyn, ...S)>`), numbers become a rank-1 tensor, and tuples are
//! collated field by field, so `(Tensor<(C<1>, C<28>, C<28>)>, i64)` items
//! give `(Tensor<(Dyn, C<1>, C<28>, C<28>)>, Tensor<(Dyn,), i64>)`. Anything
//! else takes a custom [`Collate`]: any `Fn(Vec<Item>) -> Result<Batch,
//! DataError>` closure is one.

use super::DataError;
use forma_core::shape::{op, InsertAxisOf};
use forma_core::{Backend, Dtype, Dyn, Shape, Tensor};
use forma_cpu::Cpu;

/// Turns the items of one batch (in order) into a batch.
///
/// Implemented by [`DefaultCollate`] and by every
/// `Fn(Vec<I>) -> Result<B, DataError> + Send + Sync` closure.
pub trait Collate<I>: Send + Sync {
    /// What a batch is.
    type Batch;

    /// Collates `items` (never empty when called by a [`super::DataLoader`]).
    ///
    /// # Errors
    /// Items that cannot be combined (different sizes, ...).
    fn collate(&self, items: Vec<I>) -> Result<Self::Batch, DataError>;
}

impl<I, B, F> Collate<I> for F
where
    F: Fn(Vec<I>) -> Result<B, DataError> + Send + Sync,
{
    type Batch = B;
    fn collate(&self, items: Vec<I>) -> Result<B, DataError> {
        self(items)
    }
}

/// PyTorch's `default_collate`: stacks each field of the items along a new
/// first axis. Works for every item type that is [`Batchable`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DefaultCollate;

impl<I: Batchable> Collate<I> for DefaultCollate {
    type Batch = I::Batch;
    fn collate(&self, items: Vec<I>) -> Result<I::Batch, DataError> {
        if items.is_empty() {
            return Err(DataError::Collate {
                reason: "a batch needs at least one item".to_string(),
            });
        }
        I::batch(items)
    }
}

/// An item type that [`DefaultCollate`] knows how to batch.
pub trait Batchable: Sized {
    /// The batched form.
    type Batch;

    /// Batches `items` (at least one).
    ///
    /// # Errors
    /// Items whose runtime sizes differ.
    fn batch(items: Vec<Self>) -> Result<Self::Batch, DataError>;
}

/// Tensors stack along a new first axis, like `torch.stack(items, 0)`.
impl<S, E: Dtype, D: Backend> Batchable for Tensor<S, E, D>
where
    S: Shape + InsertAxisOf<0, op::stack_axis>,
{
    type Batch = Tensor<<S as InsertAxisOf<0, op::stack_axis>>::Inserted<Dyn>, E, D>;
    fn batch(items: Vec<Self>) -> Result<Self::Batch, DataError> {
        Ok(forma_core::ops::cat::try_stack::<0, _, _>(&items)?)
    }
}

macro_rules! batchable_scalar {
    ($($t:ty),*) => {$(
        /// Numbers become a rank-1 CPU tensor, like `torch.tensor(items)`.
        impl Batchable for $t {
            type Batch = Tensor<(Dyn,), $t, Cpu>;
            fn batch(items: Vec<Self>) -> Result<Self::Batch, DataError> {
                let n = items.len();
                Ok(Tensor::from_vec_on(items, (Dyn(n),), &Cpu)?)
            }
        }
    )*};
}
batchable_scalar!(i64, u32, f32, f64);

macro_rules! batchable_tuple {
    ($(($($T:ident $v:ident $x:ident),+))*) => {$(
        /// Tuples are batched field by field.
        impl<$($T: Batchable),+> Batchable for ($($T,)+) {
            type Batch = ($($T::Batch,)+);
            fn batch(items: Vec<Self>) -> Result<Self::Batch, DataError> {
                $(let mut $v = Vec::with_capacity(items.len());)+
                for ($($x,)+) in items {
                    $($v.push($x);)+
                }
                Ok(($($T::batch($v)?,)+))
            }
        }
    )*};
}
batchable_tuple! {
    (A a0 a1)
    (A a0 a1, B b0 b1)
    (A a0 a1, B b0 b1, C3 c0 c1)
    (A a0 a1, B b0 b1, C3 c0 c1, D4 d0 d1)
}
