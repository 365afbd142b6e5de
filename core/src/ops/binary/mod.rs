//! Elementwise binary ops with PyTorch's broadcasting. Each op is a row in
//! [`table`]. The shape rule is [`BroadcastShape`]: static sizes that do not
//! broadcast are a compile error; `Dyn` sizes are checked when the op runs.

mod table;

pub use table::*;

use crate::device::Backend;
use crate::dtype::{Float, Real};
use crate::error::{fmt_dims, Error, Result};
use crate::layout::{broadcast_dims, Layout};
use crate::shape::{BroadcastShape, Dims, Shape};
use crate::tensor::Tensor;

/// An elementwise function of two values.
pub trait BinaryOp: Copy + Send + Sync + 'static {
    /// The op's name, for errors and anomaly reports.
    const NAME: &'static str;
    /// The function, evaluated in the accumulation type.
    fn f<R: Real>(&self, a: R, b: R) -> R;
}

/// Backend support for [`BinaryOp`]s.
pub trait BinaryKernel<E: Float>: Backend {
    /// Applies `op` pairwise. `la` and `lb` have the same sizes (the output's;
    /// broadcast dims have stride 0); the result is row-major.
    fn binary<Op: BinaryOp>(
        &self,
        op: Op,
        a: &Self::Storage<E>,
        la: &Layout,
        b: &Self::Storage<E>,
        lb: &Layout,
    ) -> Result<Self::Storage<E>>;
}

/// The broadcast sizes of two operands and their layouts stretched to them.
pub(crate) fn broadcast_layouts(
    op: &'static str,
    a: &Layout,
    b: &Layout,
) -> Result<(Dims, Layout, Layout)> {
    let out = broadcast_dims(&a.dims, &b.dims).ok_or_else(|| {
        Error::shape(
            op,
            format!("a shape that broadcasts with {}", fmt_dims(&a.dims)),
            &b.dims,
        )
    })?;
    Ok((out, a.broadcast_to(&out), b.broadcast_to(&out)))
}

impl<S: Shape, E: Float, D: BinaryKernel<E>> Tensor<S, E, D> {
    /// Applies a binary op with broadcasting (the entry point of every table row).
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when `Dyn` sizes do not broadcast, or the
    /// operands are on different devices.
    pub fn try_zip<S2: Shape, Op: BinaryOp>(
        &self,
        op: Op,
        rhs: &Tensor<S2, E, D>,
    ) -> Result<Tensor<<S as BroadcastShape<S2>>::Output, E, D>>
    where
        S: BroadcastShape<S2>,
    {
        self.same_device(Op::NAME, rhs)?;
        let (out, la, lb) = broadcast_layouts(Op::NAME, &self.layout, &rhs.layout)?;
        let s = self
            .device
            .binary(op, &self.storage(), &la, &rhs.storage(), &lb)?;
        Ok(Tensor::from_storage(s, &out, self.device.clone()))
    }
}
