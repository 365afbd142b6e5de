//! Elementwise unary ops. Each op is a row in `table.rs`: a type implementing
//! [`UnaryOp`] with its scalar function; backends run every row through one
//! generic kernel ([`UnaryKernel`]), monomorphised per op, so the hot loop has
//! no dispatch.

mod table;

pub use table::*;

use crate::device::{Backend, Device};
use crate::dtype::{Float, Real};
use crate::error::Result;
use crate::layout::Layout;
use crate::shape::Shape;
use crate::tape::Raw;
use crate::tensor::Tensor;

/// An elementwise function of one value.
pub trait UnaryOp: Copy + Send + Sync + 'static {
    /// The op's name, for errors and anomaly reports.
    const NAME: &'static str;
    /// The function, evaluated in the accumulation type.
    fn f<R: Real>(&self, x: R) -> R;
    /// Whether [`UnaryOp::df`] reads `x`: the backward saves the input only then.
    const READS_INPUT: bool = true;
    /// Whether [`UnaryOp::df`] reads `y`: the backward saves the output only then.
    const READS_OUTPUT: bool = true;
    /// Its derivative at `x`, given also `y = f(x)` (whichever is cheaper).
    fn df<R: Real>(&self, x: R, y: R) -> R;
    /// The row's CUDA form and the parameters it passes, for backends that
    /// generate their kernels from the table ([`CUDA_ROWS`]); `None` (the
    /// default, for an op defined outside the table) runs it on the host.
    fn cuda(&self) -> Option<(&'static CudaRow, [f64; 2])> {
        None
    }
    /// The row's parameters in field order, for graph capture.
    fn params(&self) -> Vec<f64> {
        Vec::new()
    }
}

/// A unary row in CUDA C: its kernel symbol (the method's name) and its
/// function and derivative as expressions in the accumulation type `A` of
/// `x`, `y` (the output) and the parameters `p0`, `p1`. Kept beside the
/// Rust form in `table.rs` (core itself never compiles them).
#[derive(Debug, PartialEq, Eq)]
pub struct CudaRow {
    /// The kernel symbol: the method's name.
    pub symbol: &'static str,
    /// `f(x)`.
    pub f: &'static str,
    /// `df/dx`, of `x` and `y`.
    pub df: &'static str,
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
    /// `g * op.df(x, y)` elementwise: the gradient of the input. All three
    /// views have the same sizes; the result is row-major.
    fn unary_backward<Op: UnaryOp>(
        &self,
        op: Op,
        x: &Self::Storage<E>,
        lx: &Layout,
        y: &Self::Storage<E>,
        ly: &Layout,
        g: &Self::Storage<E>,
        lg: &Layout,
    ) -> Result<Self::Storage<E>>;
}

impl<S: Shape, E: Float, D: Device<E>> Tensor<S, E, D> {
    /// Applies a unary op (the entry point every table row uses); its backward
    /// multiplies the output gradient by the row's derivative.
    pub fn map_unary<Op: UnaryOp>(&self, op: Op) -> Self {
        let s = crate::tensor::ok(self.device.unary(op, &self.storage(), &self.layout));
        let y = Self::from_storage(s, &self.layout.dims, self.device.clone());
        let (xs, ys) = (self.raw(), y.raw());
        y.record(
            Op::NAME,
            std::slice::from_ref(&self.var),
            [
                Op::READS_INPUT.then(|| xs.saved()),
                Op::READS_OUTPUT.then(|| ys.saved()),
            ]
            .into_iter()
            .flatten()
            .collect(),
            move |g: &Raw<E, D>| {
                let s = g.device.unary_backward(
                    op,
                    &xs.storage(),
                    &xs.layout,
                    &ys.storage(),
                    &ys.layout,
                    &g.storage(),
                    &g.layout,
                )?;
                Ok(vec![Some(Raw::new(s, &g.layout.dims, g.device.clone()))])
            },
        )
        .noted(|| {
            let (name, params) = (Op::NAME, op.params());
            (crate::graph::Op::Unary { name, params }, vec![self.val()])
        })
    }
}
