//! Joining tensors: `cat` along an existing axis and `stack` along a new one.
//! The operands share one shape type, so their other static sizes agree by
//! construction; `Dyn` sizes are checked at run time.

use crate::device::Backend;
use crate::dtype::Dtype;
use crate::error::{fmt_dims, Error, Result};
use crate::shape::check::assert_cat_sum;
use crate::shape::{
    op, AxisOf, Dim, Dyn, HasAxis, InsertAxis, InsertAxisOf, JoinsAlong, One, Shape,
};
use crate::tape::Raw;
use crate::tensor::{ok, Tensor};

/// Tensors of type `Self` concatenate along `AX` into an `O`, a tensor
/// whose size along `AX` is `Dyn`: [`cat`]'s rule (the shape has axis
/// `AX`, [`AxisOf`]). Its result is a parameter rather than a type named
/// through the rule, so that an axis the tensors lack is one error (a
/// result type named through a failing rule is reported a second time).
pub trait Concatenate<const AX: isize, O>: Sized {
    /// [`try_cat`]'s work.
    ///
    /// # Errors
    /// An empty list, or sizes that differ outside `AX`.
    fn try_cat_all(pieces: &[Self]) -> Result<O>;
}

impl<const AX: isize, S, E: Dtype, D: Backend>
    Concatenate<AX, Tensor<<S as AxisOf<AX, op::concatenate>>::Replaced<Dyn>, E, D>>
    for Tensor<S, E, D>
where
    S: Shape + AxisOf<AX, op::concatenate>,
{
    fn try_cat_all(
        pieces: &[Self],
    ) -> Result<Tensor<<S as AxisOf<AX, op::concatenate>>::Replaced<Dyn>, E, D>> {
        join("cat", pieces, <S as HasAxis<AX>>::INDEX)
    }
}

/// Concatenates along `AX`, like `torch.cat(tensors, ax)`; the axis becomes
/// `Dyn`. `T` (the pieces' tensor type) and `O` (the result's) are
/// inferred: `try_cat::<1, _, _>(&[a, b])`.
///
/// # Errors
/// An empty list, or sizes that differ outside `AX`.
pub fn try_cat<const AX: isize, T, O>(tensors: &[T]) -> Result<O>
where
    T: Concatenate<AX, O>,
{
    T::try_cat_all(tensors)
}

/// Joins `tensors` along axis `ax` into a tensor of shape type `S2`
/// (checked against the joined sizes).
fn join<S: Shape, S2: Shape, E: Dtype, D: Backend>(
    op: &'static str,
    tensors: &[Tensor<S, E, D>],
    ax: usize,
) -> Result<Tensor<S2, E, D>> {
    let first = tensors
        .first()
        .ok_or_else(|| Error::invalid(op, "needs at least one tensor"))?;
    let mut total = 0;
    for t in tensors {
        first.same_device(op, t)?;
        let same = (0..S::RANK).all(|i| i == ax || t.layout.dims[i] == first.layout.dims[i]);
        if !same {
            return Err(Error::shape(
                op,
                format!("{} outside axis {ax}", fmt_dims(&first.layout.dims)),
                &t.layout.dims,
            ));
        }
        total += t.layout.dims[ax];
    }
    let mut dims = first.layout.dims;
    dims[ax] = total;
    if S2::from_dims(&dims).is_none() {
        return Err(Error::shape(op, S2::describe(), &dims));
    }
    let dev = &first.device;
    let guards: Vec<_> = tensors.iter().map(|t| t.storage()).collect();
    let parts: Vec<_> = guards
        .iter()
        .zip(tensors)
        .map(|(g, t)| (&**g, &t.layout))
        .collect();
    let out = dev.concat(&parts, ax)?;
    drop(parts);
    drop(guards);
    let lens: Vec<usize> = tensors.iter().map(|t| t.layout.dims[ax]).collect();
    let vars: Vec<_> = tensors.iter().map(|t| t.var.clone()).collect();
    Ok(Tensor::from_storage(out, &dims, dev.clone())
        .record("cat", &vars, vec![], move |g| {
            let mut start = 0;
            Ok(lens
                .iter()
                .map(|&len| {
                    let piece = Raw {
                        layout: g.layout.narrow(ax, start, len),
                        ..g.clone()
                    };
                    start += len;
                    Some(piece)
                })
                .collect())
        })
        .noted(|| {
            let ins = tensors.iter().map(|t| t.val()).collect();
            (crate::graph::Op::Cat { axis: ax }, ins)
        }))
}

/// [`try_cat`] that panics on mismatched sizes: `cat::<1, _, _>(&[a, b])`.
#[track_caller]
pub fn cat<const AX: isize, T, O>(tensors: &[T]) -> O
where
    T: Concatenate<AX, O>,
{
    ok(try_cat::<AX, T, O>(tensors))
}

impl<S: Shape, E: Dtype, D: Backend> Tensor<S, E, D> {
    /// Concatenates `other` after `self` along `AX`, like
    /// `torch.cat([a, b], ax)`, for pieces whose sizes along `AX` differ in
    /// type (a U-Net skip: 3 channels and 4). The other axes are the same
    /// types; the result's size along `AX` is `O`, stated or inferred from
    /// the next use, and checked: statically when both pieces and `O` are
    /// static (`cargo build`), at run time otherwise.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let a = Tensor::<(Dyn, C<3>)>::zeros_with((Dyn(2), C));
    /// let b = Tensor::<(Dyn, C<4>)>::ones_with((Dyn(2), C));
    /// let y: Tensor<(Dyn, C<7>)> = a.cat_with::<1, _, _>(&b);
    /// assert_eq!(y.to_vec()[..8], [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
    /// ```
    ///
    /// # Panics
    /// When the sizes disagree at run time; see [`Tensor::try_cat_with`].
    #[track_caller]
    pub fn cat_with<const AX: isize, O: Dim, S2>(
        &self,
        other: &Tensor<S2, E, D>,
    ) -> Tensor<<S as HasAxis<AX>>::Replaced<O>, E, D>
    where
        S: HasAxis<AX> + JoinsAlong<S2, AX, op::cat_with>,
        S2: HasAxis<AX>,
    {
        const {
            assert_cat_sum(
                <<S as HasAxis<AX>>::At as Dim>::STATIC,
                <<S2 as HasAxis<AX>>::At as Dim>::STATIC,
                O::STATIC,
            )
        };
        ok(self.try_cat_with::<AX, O, S2>(other))
    }

    /// Fallible [`Tensor::cat_with`].
    ///
    /// # Errors
    /// A shape error when the sizes outside `AX` differ at run time, or the
    /// joined size is not `O`'s.
    pub fn try_cat_with<const AX: isize, O: Dim, S2>(
        &self,
        other: &Tensor<S2, E, D>,
    ) -> Result<Tensor<<S as HasAxis<AX>>::Replaced<O>, E, D>>
    where
        S: HasAxis<AX> + JoinsAlong<S2, AX, op::cat_with>,
        S2: HasAxis<AX>,
    {
        let a = self.try_into_shape::<<S as HasAxis<AX>>::Replaced<Dyn>>()?;
        let b = other.try_into_shape::<<S as HasAxis<AX>>::Replaced<Dyn>>()?;
        join("cat_with", &[a, b], <S as HasAxis<AX>>::INDEX)
    }
}

/// Tensors of type `Self` stack along a new axis `AX` into an `O`, a
/// tensor whose size along `AX` is `Dyn`: [`stack`]'s rule (the axis can
/// be inserted, [`InsertAxisOf`]), with its result a parameter as in
/// [`Concatenate`].
pub trait Stack<const AX: isize, O>: Sized {
    /// [`try_stack`]'s work.
    ///
    /// # Errors
    /// An empty list, or tensors of different sizes.
    fn try_stack_all(pieces: &[Self]) -> Result<O>;
}

impl<const AX: isize, S, E: Dtype, D: Backend>
    Stack<AX, Tensor<<S as InsertAxisOf<AX, op::stack_axis>>::Inserted<Dyn>, E, D>>
    for Tensor<S, E, D>
where
    S: Shape + InsertAxisOf<AX, op::stack_axis>,
{
    fn try_stack_all(
        pieces: &[Self],
    ) -> Result<Tensor<<S as InsertAxisOf<AX, op::stack_axis>>::Inserted<Dyn>, E, D>> {
        let parts: Vec<Tensor<<S as InsertAxis<AX>>::Inserted<One>, E, D>> =
            pieces.iter().map(|t| t.unsqueeze_at::<AX>()).collect();
        join("stack", &parts, <S as InsertAxis<AX>>::INDEX)
    }
}

/// Stacks along a new axis `AX`, like `torch.stack(tensors, ax)`; `T` and
/// `O` are inferred: `try_stack::<0, _, _>(&[a, b])`.
///
/// # Errors
/// An empty list, or tensors of different sizes.
pub fn try_stack<const AX: isize, T, O>(tensors: &[T]) -> Result<O>
where
    T: Stack<AX, O>,
{
    T::try_stack_all(tensors)
}

/// [`try_stack`] that panics on mismatched sizes: `stack::<0, _, _>(&[a, b])`.
#[track_caller]
pub fn stack<const AX: isize, T, O>(tensors: &[T]) -> O
where
    T: Stack<AX, O>,
{
    ok(try_stack::<AX, T, O>(tensors))
}
