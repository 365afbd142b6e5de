//! Reductions as types, so a loss's output shape follows from the reduction:
//! [`Mean`] and [`Sum`] give a scalar `Tensor<()>` (ready for `backward()`),
//! [`NoReduction`] (PyTorch's `reduction='none'`) the per-element or
//! per-sample loss with its typed shape, and [`BatchMean`] (`kl_div` only) the
//! sum divided by the batch size.

use forma_core::Shape;
use std::fmt::Debug;

/// The reduction a marker type stands for, as PyTorch spells it (`"mean"`,
/// `"sum"`, `"none"`, `"batchmean"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReductionKind {
    /// The mean of the per-element losses (weighted, for class losses).
    Mean,
    /// The sum.
    Sum,
    /// No reduction: the per-element (or per-sample) losses.
    None,
    /// The sum divided by the batch size (`kl_div` only).
    BatchMean,
}

impl ReductionKind {
    /// PyTorch's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ReductionKind::Mean => "mean",
            ReductionKind::Sum => "sum",
            ReductionKind::None => "none",
            ReductionKind::BatchMean => "batchmean",
        }
    }
}

/// Every reduction marker: what it is and the shape of the loss it gives for
/// an unreduced loss of shape `S`. `kl_div` accepts any; the other losses take
/// the narrower [`Reduction`].
pub trait AnyReduction: Copy + Default + Debug + Send + Sync + 'static {
    /// Which reduction this is.
    const KIND: ReductionKind;
    /// The reduced loss's shape: `()` for the reducing markers, `S` for
    /// [`NoReduction`].
    type Output<S: Shape>: Shape;
}

/// The reductions every loss accepts: [`Mean`], [`Sum`], [`NoReduction`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a reduction this loss accepts",
    note = "losses take `Mean`, `Sum` or `NoReduction`; `BatchMean` is for `kl_div` only"
)]
pub trait Reduction: AnyReduction {}

/// `reduction='mean'`: a scalar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mean;

/// `reduction='sum'`: a scalar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sum;

/// `reduction='none'`: the unreduced losses, shaped like the input (or like
/// the input without its class axis, for class losses).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoReduction;

/// `reduction='batchmean'` (`kl_div` only): the sum over the batch divided by
/// the batch size (the first dim), which is the mathematical KL divergence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchMean;

impl AnyReduction for Mean {
    const KIND: ReductionKind = ReductionKind::Mean;
    type Output<S: Shape> = ();
}
impl AnyReduction for Sum {
    const KIND: ReductionKind = ReductionKind::Sum;
    type Output<S: Shape> = ();
}
impl AnyReduction for NoReduction {
    const KIND: ReductionKind = ReductionKind::None;
    type Output<S: Shape> = S;
}
impl AnyReduction for BatchMean {
    const KIND: ReductionKind = ReductionKind::BatchMean;
    type Output<S: Shape> = ();
}
impl Reduction for Mean {}
impl Reduction for Sum {}
impl Reduction for NoReduction {}
