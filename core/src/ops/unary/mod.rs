//! Elementwise unary ops. Each op is a row in [`table`]: a type implementing
//! [`UnaryOp`] with its scalar function; backends run every row through one
//! generic kernel ([`UnaryKernel`]), monomorphised per op, so the hot loop has
//! no dispatch.

mod table;

pub use table::*;

use crate::device::Backend;
use crate::dtype::{Float, Real};
use crate::error::Result;
use crate::layout::Layout;
use crate::shape::Shape;
use crate::tensor::Tensor;

/// An elementwise function of one value.
pub trait UnaryOp: Copy + Send + Sync + 'static {
    /// The op's name, for errors and anomaly reports.
    const NAME: &'static str;
    /// The function, evaluated in the accumulation type.
    fn f<R: Real>(&self, x: R) -> R;
}

/// Backend support for [`UnaryOp`]s.
pub trait UnaryKernel<E: Float>: Backend {
    /// Applies `op` to every element of the view; the result is row-major.
    fn unary<Op: UnaryOp>(
        &self,
        op: Op,
        x: &Self::Storage<E>,
        layout: &Layout,
    ) -> Result<Self::Storage<E>>;
}

impl<S: Shape, E: Float, D: UnaryKernel<E>> Tensor<S, E, D> {
    /// Applies a unary op (the entry point every table row uses).
    pub fn map_unary<Op: UnaryOp>(&self, op: Op) -> Self {
        let s = crate::tensor::ok(self.device.unary(op, &self.storage(), &self.layout));
        Self::from_storage(s, &self.layout.dims, self.device.clone())
    }
}
