//! Softmax and log-softmax along a typed axis, stable on extreme inputs (the
//! maximum is subtracted first; an all `-inf` row gives NaN, as in PyTorch).

use crate::device::Backend;
use crate::dtype::Float;
use crate::error::Result;
use crate::layout::Layout;
use crate::ops::reduce::around_axis;
use crate::shape::{op, AxisOf, HasAxis, Shape};
use crate::tape::util::reshape;
use crate::tensor::{ok, Tensor};

/// Backend support for softmax.
pub trait SoftmaxKernel<E: Float>: Backend {
    /// Softmax (or log-softmax when `log`) along `axis`; the result is row-major.
    fn softmax(
        &self,
        x: &Self::Storage<E>,
        layout: &Layout,
        axis: usize,
        log: bool,
    ) -> Result<Self::Storage<E>>;
}

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    pub(crate) fn softmax_impl(&self, axis: usize, log: bool) -> Self {
        let s = ok(self
            .device
            .softmax(&self.storage(), &self.layout, axis, log));
        let y = Self::from_storage(s, &self.layout.dims, self.device.clone());
        let (yr, dims) = (y.raw(), self.layout.dims);
        y.record(
            if log { "log_softmax" } else { "softmax" },
            std::slice::from_ref(&self.var),
            vec![yr.saved()],
            move |g| {
                let y3 = around_axis(&yr, axis)?;
                let g3 = around_axis(g, axis)?;
                let gx = if log {
                    // d log_softmax: g - softmax * sum(g)
                    &g3 - &(&y3.exp() * &g3.sum_keepdim::<1>())
                } else {
                    // d softmax: y * (g - sum(g * y))
                    &y3 * &(&g3 - &(&g3 * &y3).sum_keepdim::<1>())
                };
                Ok(vec![Some(reshape(&gx.raw(), &dims)?)])
            },
        )
        .noted(|| {
            (
                crate::graph::Op::SoftmaxAxis { axis, log },
                vec![self.val()],
            )
        })
    }

    /// Softmax along `AX`, like `x.softmax(ax)`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<1>, C<3>)>::from_vec(vec![1000., 1000., f32::NEG_INFINITY], (C, C)).unwrap();
    /// assert_eq!(x.softmax::<1>().to_vec(), vec![0.5, 0.5, 0.0]);
    /// ```
    pub fn softmax<const AX: isize>(&self) -> Self
    where
        S: AxisOf<AX, op::softmax>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        self.softmax_impl(ax, false)
    }

    /// Log-softmax along `AX`, like `x.log_softmax(ax)`.
    pub fn log_softmax<const AX: isize>(&self) -> Self
    where
        S: AxisOf<AX, op::log_softmax>,
    {
        let ax = <S as HasAxis<AX>>::INDEX;
        self.softmax_impl(ax, true)
    }
}
