//! Elementwise binary ops with PyTorch's broadcasting. Each op is a row in
//! `table.rs` (re-exported here). The shape rule is [`crate::shape::Broadcasts`]
//! under the row's name (`op::add`); [`BroadcastShape`] gives the result's type.
//! Static sizes that do not broadcast are a compile error that starts with
//! the op's name; `Dyn` sizes are checked when the op runs.
//! The backward sums each operand's gradient back over the broadcast dims.

mod table;

pub use table::*;

use crate::device::{Backend, Device};
use crate::dtype::{Float, Real};
use crate::error::{fmt_dims, Error, Result};
use crate::layout::{broadcast_dims, Layout};
use crate::shape::{BroadcastShape, Dims, Shape};
use crate::tape::util::sum_to;
use crate::tape::Raw;
use crate::tensor::Tensor;

/// An elementwise function of two values.
pub trait BinaryOp: Copy + Send + Sync + 'static {
    /// The op's name, for errors and anomaly reports.
    const NAME: &'static str;
    /// The function, evaluated in the accumulation type.
    fn f<R: Real>(&self, a: R, b: R) -> R;
    /// Whether [`BinaryOp::df`] reads `a`: the backward saves it only then.
    const READS_LHS: bool = true;
    /// Whether [`BinaryOp::df`] reads `b`: the backward saves it only then.
    const READS_RHS: bool = true;
    /// The partial derivatives `(df/da, df/db)` at `(a, b)`.
    fn df<R: Real>(&self, a: R, b: R) -> (R, R);
    /// The row's CUDA form, for backends that generate their kernels from
    /// the table ([`CUDA_ROWS`]); `None` (the default, for an op defined
    /// outside the table) runs it on the host.
    fn cuda(&self) -> Option<&'static CudaRow> {
        None
    }
}

/// A binary row in CUDA C: its kernel symbol (the method's name), its
/// function and its two partial derivatives as expressions in the
/// accumulation type `A` of `a` and `b`. Kept beside the Rust form in
/// `table.rs` (core itself never compiles them).
#[derive(Debug, PartialEq, Eq)]
pub struct CudaRow {
    /// The kernel symbol: the method's name.
    pub symbol: &'static str,
    /// `f(a, b)`.
    pub f: &'static str,
    /// `df/da`.
    pub da: &'static str,
    /// `df/db`.
    pub db: &'static str,
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

    /// The gradients `(g * df/da, g * df/db)` over the output's sizes (all
    /// three views have them), both row-major; the caller sums them back to
    /// each operand's sizes.
    fn binary_backward<Op: BinaryOp>(
        &self,
        op: Op,
        a: &Self::Storage<E>,
        la: &Layout,
        b: &Self::Storage<E>,
        lb: &Layout,
        g: &Self::Storage<E>,
        lg: &Layout,
    ) -> Result<(Self::Storage<E>, Self::Storage<E>)>;
}

/// The broadcast sizes of two operands and their layouts stretched to them,
/// checked against the result's type `O`.
pub(crate) fn broadcast_layouts<O: Shape>(
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
    check_broadcast_type::<O>(op, &out)?;
    Ok((out, a.broadcast_to(&out), b.broadcast_to(&out)))
}

/// Refuses broadcast sizes that the result's type `O` cannot hold: a
/// static size stretched at run time by a `Dyn` operand (a `C<1>` meeting a
/// `Dyn` of 4), which would leave a tensor whose type states the wrong
/// size. A static size-1 axis that stretches is written [`crate::One`].
pub(crate) fn check_broadcast_type<O: Shape>(op: &'static str, out: &[usize]) -> Result<()> {
    match O::from_dims(out) {
        Some(_) => Ok(()),
        None => Err(Error::shape(
            op,
            format!(
                "{} (the result's static sizes: a static size 1 does not stretch, `One` does)",
                O::describe()
            ),
            out,
        )),
    }
}

impl<S: Shape, E: Float, D: Device<E>> Tensor<S, E, D> {
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
        let (out, la, lb) = broadcast_layouts::<<S as BroadcastShape<S2>>::Output>(
            Op::NAME,
            &self.layout,
            &rhs.layout,
        )?;
        let s = self
            .device
            .binary(op, &self.storage(), &la, &rhs.storage(), &lb)?;
        let y: Tensor<<S as BroadcastShape<S2>>::Output, E, D> =
            Tensor::from_storage(s, &out, self.device.clone());
        let (a, b) = (
            Raw {
                layout: la,
                ..self.raw()
            },
            Raw {
                layout: lb,
                ..rhs.raw()
            },
        );
        let (da, db) = (self.layout.dims, rhs.layout.dims);
        Ok(y.record(
            Op::NAME,
            &[self.var.clone(), rhs.var.clone()],
            [
                Op::READS_LHS.then(|| a.saved()),
                Op::READS_RHS.then(|| b.saved()),
            ]
            .into_iter()
            .flatten()
            .collect(),
            move |g: &Raw<E, D>| {
                let (ga, gb) = binary_grads(op, &a, &b, g)?;
                Ok(vec![Some(sum_to(&ga, &da)?), Some(sum_to(&gb, &db)?)])
            },
        )
        .noted(|| {
            let name = Op::NAME;
            (
                crate::graph::Op::Binary { name },
                vec![self.val(), rhs.val()],
            )
        }))
    }
}

/// `op(a, b)` for two raw tensors of one size, outside the tape.
pub(crate) fn raw_binary<Op: BinaryOp, E: Float, D: Device<E>>(
    op: Op,
    a: &Raw<E, D>,
    b: &Raw<E, D>,
) -> Result<Raw<E, D>> {
    let s = a
        .device
        .binary(op, &a.storage(), &a.layout, &b.storage(), &b.layout)?;
    Ok(Raw::new(s, &a.layout.dims, a.device.clone()))
}

/// [`raw_binary_backward`], except that where a partial derivative is
/// the constant 1 (both of `add`'s, `sub`'s first) the gradient is `g`
/// itself rather than a pass computing `g * 1`: the same values, without
/// writing a tensor of the output's size for each operand (a bias add's
/// backward in every linear layer).
fn binary_grads<Op: BinaryOp, E: Float, D: Device<E>>(
    op: Op,
    a: &Raw<E, D>,
    b: &Raw<E, D>,
    g: &Raw<E, D>,
) -> Result<(Raw<E, D>, Raw<E, D>)> {
    if Op::READS_LHS || Op::READS_RHS {
        return raw_binary_backward(op, a, b, g);
    }
    // The derivatives read neither operand: they are constants.
    let (ca, cb) = op.df(0.0f64, 0.0f64);
    if ca == 1.0 && cb == 1.0 {
        return Ok((g.clone(), g.clone()));
    }
    let (ga, gb) = raw_binary_backward(op, a, b, g)?;
    let pass = |c: f64, computed: Raw<E, D>| if c == 1.0 { g.clone() } else { computed };
    Ok((pass(ca, ga), pass(cb, gb)))
}

/// `(g * df/da, g * df/db)` for raw operands whose views have `g`'s sizes:
/// row-major, over `g`'s sizes (not yet summed back to the operands').
pub(crate) fn raw_binary_backward<Op: BinaryOp, E: Float, D: Device<E>>(
    op: Op,
    a: &Raw<E, D>,
    b: &Raw<E, D>,
    g: &Raw<E, D>,
) -> Result<(Raw<E, D>, Raw<E, D>)> {
    let (ga, gb) = g.device.binary_backward(
        op,
        &a.storage(),
        &a.layout,
        &b.storage(),
        &b.layout,
        &g.storage(),
        &g.layout,
    )?;
    let dims = &g.layout.dims;
    Ok((
        Raw::new(ga, dims, g.device.clone()),
        Raw::new(gb, dims, g.device.clone()),
    ))
}
