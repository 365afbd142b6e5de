//! Rotating and repeating the elements of one axis, like `torch.roll` and
//! `torch.repeat_interleave`.
//!
//! The shape rule: the axis must exist ([`AxisOf`], whose message names
//! the op); `roll` keeps the shape, `repeat_interleave` makes the axis
//! [`Dyn`]. Both are an
//! `index_select` along the axis with indices computed on the host, so the
//! gradient adds up every copy of an element.

use crate::device::Device;
use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::shape::{op, AxisOf, Dyn, HasAxis, Shape};
use crate::tensor::{ok, Tensor};

impl<S: Shape, E: Float, D: Device<E>> Tensor<S, E, D> {
    /// Shifts axis `AX` by `shift` places, wrapping around, like
    /// `x.roll(shift, dims=ax)`: element `i` moves to `(i + shift) mod n`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<5>,)>::from_vec(vec![1., 2., 3., 4., 5.], (C,)).unwrap();
    /// assert_eq!(x.roll::<0>(2).to_vec(), [4., 5., 1., 2., 3.]);
    /// assert_eq!(x.roll::<0>(-1).to_vec(), [2., 3., 4., 5., 1.]);
    /// ```
    #[track_caller]
    pub fn roll<const AX: isize>(&self, shift: i64) -> Self
    where
        S: AxisOf<AX, op::roll>,
    {
        ok(self.try_roll::<AX>(shift))
    }

    /// [`Tensor::roll`], returning a backend failure as an error.
    ///
    /// # Errors
    /// A backend failure.
    pub fn try_roll<const AX: isize>(&self, shift: i64) -> Result<Self>
    where
        S: AxisOf<AX, op::roll>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let n = self.layout.dims[ax] as i64;
        let idx: Vec<i64> = (0..n).map(|i| (i - shift).rem_euclid(n.max(1))).collect();
        Ok(self.select_along::<AX>(idx)?.retype())
    }

    /// Repeats each element of axis `AX` `repeats` times in place, like
    /// `x.repeat_interleave(repeats, dim=ax)`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>, C<2>)>::from_vec(vec![1., 2., 3., 4.], (C, C)).unwrap();
    /// assert_eq!(x.repeat_interleave::<1>(2).to_vec(), [1., 1., 2., 2., 3., 3., 4., 4.]);
    /// assert_eq!(x.repeat_interleave::<0>(2).to_vec(), [1., 2., 1., 2., 3., 4., 3., 4.]);
    /// ```
    #[track_caller]
    pub fn repeat_interleave<const AX: isize>(
        &self,
        repeats: usize,
    ) -> Tensor<<S as AxisOf<AX, op::repeat_interleave>>::Replaced<Dyn>, E, D>
    where
        S: AxisOf<AX, op::repeat_interleave>,
    {
        ok(self.try_repeat_interleave::<AX>(repeats))
    }

    /// [`Tensor::repeat_interleave`], returning a backend failure as an error.
    ///
    /// # Errors
    /// A backend failure.
    pub fn try_repeat_interleave<const AX: isize>(
        &self,
        repeats: usize,
    ) -> Result<Tensor<<S as AxisOf<AX, op::repeat_interleave>>::Replaced<Dyn>, E, D>>
    where
        S: AxisOf<AX, op::repeat_interleave>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let n = self.layout.dims[ax];
        self.try_repeat_interleave_each::<AX>(&vec![repeats; n])
    }

    /// Repeats element `i` of axis `AX` `repeats[i]` times, like
    /// `x.repeat_interleave(torch.tensor(repeats), dim=ax)`.
    ///
    /// # Errors
    /// When `repeats` does not have one count per element of the axis.
    pub fn try_repeat_interleave_each<const AX: isize>(
        &self,
        repeats: &[usize],
    ) -> Result<Tensor<<S as AxisOf<AX, op::repeat_interleave>>::Replaced<Dyn>, E, D>>
    where
        S: AxisOf<AX, op::repeat_interleave>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let n = self.layout.dims[ax];
        if repeats.len() != n {
            return Err(Error::invalid(
                "repeat_interleave",
                format!(
                    "{} repeat counts for axis {ax} of size {n}: give one per element",
                    repeats.len()
                ),
            ));
        }
        let idx = repeats
            .iter()
            .enumerate()
            .flat_map(|(i, &r)| std::iter::repeat_n(i as i64, r))
            .collect();
        Ok(self.select_along::<AX>(idx)?.retype())
    }

    /// `index_select` along `AX` with host indices.
    pub(crate) fn select_along<const AX: isize>(
        &self,
        idx: Vec<i64>,
    ) -> Result<Tensor<<S as HasAxis<AX>>::Replaced<Dyn>, E, D>>
    where
        S: HasAxis<AX>,
    {
        let len = idx.len();
        let idx = Tensor::<(Dyn,), i64, D>::from_vec_on(idx, (Dyn(len),), &self.device)?;
        self.index_select_at::<AX, Dyn>(&idx)
    }
}
