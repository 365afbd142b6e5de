//! Explicit conversions between static and dynamic shapes.

use super::Tensor;
use crate::device::Backend;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::shape::Shape;

impl<S: Shape, E: Dtype, D: Backend> Tensor<S, E, D> {
    /// Forgets the static sizes: every dim becomes `Dyn` (a view). Always succeeds.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>, C<3>)>::zeros();
    /// let d: Tensor<(Dyn, Dyn)> = x.into_dyn();
    /// assert_eq!(d.shape(), (Dyn(2), Dyn(3)));
    /// ```
    pub fn into_dyn(&self) -> Tensor<S::Dynamic, E, D> {
        self.clone().retype()
    }

    /// Claims a shape type `S2` of the same rank, checked at run time (a view).
    ///
    /// ```
    /// use forma::prelude::*;
    /// let d = Tensor::<(Dyn, Dyn)>::zeros_with((Dyn(2), Dyn(3)));
    /// let ok: Tensor<(C<2>, C<3>)> = d.try_into_shape().unwrap();
    /// let err = d.try_into_shape::<(C<3>, C<3>)>().unwrap_err();
    /// assert_eq!(err.to_string(), "try_into_shape: expected shape [3, 3], got [2, 3]");
    /// ```
    ///
    /// # Errors
    /// A [`crate::ShapeError`] naming the expected and actual shapes when a
    /// static dim of `S2` disagrees or the rank differs.
    pub fn try_into_shape<S2: Shape>(&self) -> Result<Tensor<S2, E, D>> {
        match S2::from_dims(&self.layout.dims) {
            Some(_) => Ok(self.clone().retype()),
            None => Err(Error::shape(
                "try_into_shape",
                S2::describe(),
                &self.layout.dims,
            )),
        }
    }
}
