//! Lower and upper triangles of the last two axes, like `torch.tril` and
//! `torch.triu`: elements on the wrong side of diagonal `k` become zero
//! (NaN and Inf included), and so does their gradient.
//!
//! The shape rule: the tensor has at least two axes (the bound
//! `S: AxisOf<-2, op::tril>`, which holds exactly for rank 2 and up, and
//! whose message names the op); the output has the input's shape.
//! Composite: a mask of the last two axes and `masked_fill`.

use crate::device::Device;
use crate::dtype::Float;
use crate::error::Result;
use crate::shape::{op, AxisOf, Dyn, Shape};
use crate::tensor::{ok, Tensor};

impl<S: Shape, E: Float, D: Device<E>> Tensor<S, E, D> {
    /// The lower triangle of the last two axes, like `x.tril(diagonal)`:
    /// element `(i, j)` is kept where `j - i <= diagonal`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>, C<3>)>::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C)).unwrap();
    /// assert_eq!(x.tril(0).to_vec(), [1., 0., 0., 4., 5., 0.]);
    /// assert_eq!(x.tril(-1).to_vec(), [0., 0., 0., 4., 0., 0.]);
    /// ```
    #[track_caller]
    pub fn tril(&self, diagonal: i64) -> Self
    where
        S: AxisOf<-2, op::tril>,
    {
        ok(self.try_tril(diagonal))
    }

    /// [`Tensor::tril`], returning a backend failure as an error.
    ///
    /// # Errors
    /// A backend failure.
    pub fn try_tril(&self, diagonal: i64) -> Result<Self>
    where
        S: AxisOf<-2, op::tril>,
    {
        self.try_zero_outside(|i, j| j - i > diagonal)
    }

    /// The upper triangle of the last two axes, like `x.triu(diagonal)`:
    /// element `(i, j)` is kept where `j - i >= diagonal`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>, C<3>)>::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C)).unwrap();
    /// assert_eq!(x.triu(1).to_vec(), [0., 2., 3., 0., 0., 6.]);
    /// ```
    #[track_caller]
    pub fn triu(&self, diagonal: i64) -> Self
    where
        S: AxisOf<-2, op::triu>,
    {
        ok(self.try_triu(diagonal))
    }

    /// [`Tensor::triu`], returning a backend failure as an error.
    ///
    /// # Errors
    /// A backend failure.
    pub fn try_triu(&self, diagonal: i64) -> Result<Self>
    where
        S: AxisOf<-2, op::triu>,
    {
        self.try_zero_outside(|i, j| j - i < diagonal)
    }

    /// Zeroes element `(.., i, j)` wherever `drop(i, j)`.
    fn try_zero_outside(&self, drop: impl Fn(i64, i64) -> bool) -> Result<Self> {
        let dims = &self.layout.dims;
        let (rows, cols) = (dims[S::RANK - 2], dims[S::RANK - 1]);
        let mask: Vec<bool> = (0..rows as i64)
            .flat_map(|i| (0..cols as i64).map(move |j| (i, j)))
            .map(|(i, j)| drop(i, j))
            .collect();
        let mask =
            Tensor::<(Dyn, Dyn), bool, D>::from_vec_on(mask, (Dyn(rows), Dyn(cols)), &self.device)?;
        self.try_fill_where(&mask, 0.0)
    }
}
