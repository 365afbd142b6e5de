//! Cumulative sums along a typed axis, like `torch.cumsum(x, dim)`: element
//! `i` of a lane is the sum of its elements `0..=i`, accumulated in the
//! accumulation type (f32 for f16 and bf16) and rounded once per output, as
//! PyTorch's CPU kernel does.
//!
//! The shape rule: the axis must exist ([`HasAxis`]); the output has the
//! input's shape. The gradient is the reverse cumulative sum of the output
//! gradient (PyTorch's `grad.flip(dim).cumsum(dim).flip(dim)`), the same
//! kernel run from the end of each lane.

use crate::device::{Backend, Device};
use crate::dtype::Float;
use crate::error::Result;
use crate::layout::Layout;
use crate::shape::{op, AxisOf, HasAxis, Shape};
use crate::tape::Raw;
use crate::tensor::{ok, Tensor};

/// Backend support for cumulative sums.
pub trait CumsumKernel<E: Float>: Backend {
    /// The running sums along `axis` of a view (any strides), from the
    /// start of each lane, or from its end when `reverse`; the result is
    /// row-major in the input's axis order.
    fn cumsum(
        &self,
        x: &Self::Storage<E>,
        layout: &Layout,
        axis: usize,
        reverse: bool,
    ) -> Result<Self::Storage<E>>;
}

/// `x`'s running sums along `axis`, as a raw tensor.
fn scan<E: Float, D: Device<E>>(x: &Raw<E, D>, axis: usize, reverse: bool) -> Result<Raw<E, D>> {
    let s = x.device.cumsum(&x.storage(), &x.layout, axis, reverse)?;
    Ok(Raw::new(s, &x.layout.dims, x.device.clone()))
}

impl<S: Shape, E: Float, D: Device<E>> Tensor<S, E, D> {
    /// The cumulative sum along `AX`, like `torch.cumsum(x, dim=AX)`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>, C<3>)>::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C)).unwrap();
    /// assert_eq!(x.cumsum::<1>().to_vec(), [1., 3., 6., 4., 9., 15.]);
    /// assert_eq!(x.cumsum::<0>().to_vec(), [1., 2., 3., 5., 7., 9.]);
    /// ```
    ///
    /// # Panics
    /// On a backend failure (see [`Tensor::try_cumsum`]); the axis is
    /// checked when the program is built.
    #[track_caller]
    pub fn cumsum<const AX: isize>(&self) -> Self
    where
        S: AxisOf<AX, op::cumsum>,
    {
        ok(self.try_cumsum::<AX>())
    }

    /// [`Tensor::cumsum`], returning a backend failure as an error.
    ///
    /// # Errors
    /// A backend failure.
    pub fn try_cumsum<const AX: isize>(&self) -> Result<Self>
    where
        S: AxisOf<AX, op::cumsum>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        let y = Self::from_raw(scan(&self.raw(), ax, false)?)?;
        Ok(y.record(
            "cumsum",
            std::slice::from_ref(&self.var),
            Vec::new(),
            move |g| Ok(vec![Some(scan(g, ax, true)?)]),
        )
        .noted(|| (crate::graph::Op::Cumsum { axis: ax }, vec![self.val()])))
    }
}
