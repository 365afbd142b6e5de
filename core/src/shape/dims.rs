//! The three kinds of dimension: static [`C`], runtime [`Dyn`], and the
//! broadcasting size-1 [`One`].

use std::fmt;

use super::op::{self, BroadcastsWithItself};

/// One dimension of a shape.
///
/// Every dim broadcasts with itself to itself, under every elementwise
/// operation ([`BroadcastsWithItself`]), so code generic over a batch
/// `B: Dim` can add two `B`-batched tensors with no further bound.
pub trait Dim:
    Copy
    + Clone
    + fmt::Debug
    + PartialEq
    + Send
    + Sync
    + 'static
    + BroadcastDim<Self, Out = Self>
    + BroadcastsWithItself
{
    /// `Some(n)` when the size is known to the compiler.
    const STATIC: Option<usize>;
    /// The size.
    fn size(&self) -> usize;
    /// Builds the dim from a runtime size; `None` when a static size disagrees.
    fn from_size(n: usize) -> Option<Self>;
}

/// A dim whose size is a compile-time constant.
pub trait ConstDim: Dim {
    /// The size.
    const SIZE: usize;
    /// The dim's value.
    const VALUE: Self;
}

/// A static dimension of size `N`: `Tensor<(C<2>, C<3>)>` is a 2x3 tensor.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct C<const N: usize>;

impl<const N: usize> fmt::Debug for C<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{N}")
    }
}

impl<const N: usize> Dim for C<N> {
    const STATIC: Option<usize> = Some(N);
    #[inline]
    fn size(&self) -> usize {
        N
    }
    #[inline]
    fn from_size(n: usize) -> Option<Self> {
        (n == N).then_some(C)
    }
}

impl<const N: usize> ConstDim for C<N> {
    const SIZE: usize = N;
    const VALUE: Self = C;
}

/// A dimension whose size is known only at run time (batch, sequence length).
/// Operations check it when they run and report a [`crate::ShapeError`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dyn(pub usize);

impl fmt::Debug for Dyn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Dyn({})", self.0)
    }
}

impl Dim for Dyn {
    const STATIC: Option<usize> = None;
    #[inline]
    fn size(&self) -> usize {
        self.0
    }
    #[inline]
    fn from_size(n: usize) -> Option<Self> {
        Some(Dyn(n))
    }
}

/// A static size-1 dimension that stretches to any size under broadcasting,
/// like PyTorch's size-1 dims. `sum_keepdim` and `unsqueeze` produce it.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct One;

impl fmt::Debug for One {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("1")
    }
}

impl Dim for One {
    const STATIC: Option<usize> = Some(1);
    #[inline]
    fn size(&self) -> usize {
        1
    }
    #[inline]
    fn from_size(n: usize) -> Option<Self> {
        (n == 1).then_some(One)
    }
}

impl ConstDim for One {
    const SIZE: usize = 1;
    const VALUE: Self = One;
}

/// Two dims that must be equal, checked by the compiler when both are static
/// and at run time when one is [`Dyn`]. Used where an op needs equal sizes
/// without broadcasting (the inner dimension of matmul, concat's other axes).
#[diagnostic::on_unimplemented(
    message = "dimension mismatch: size {Self} is not size {Rhs}",
    label = "these sizes must be equal"
)]
pub trait SameDim<Rhs: Dim>: Dim {}
impl<const N: usize> SameDim<C<N>> for C<N> {}
impl<const N: usize> SameDim<Dyn> for C<N> {}
impl<const N: usize> SameDim<C<N>> for Dyn {}
impl SameDim<Dyn> for Dyn {}
impl SameDim<One> for One {}
impl SameDim<Dyn> for One {}
impl SameDim<One> for Dyn {}

/// The inner dimensions of a matrix product: the left operand's columns and the
/// right operand's rows must agree.
#[diagnostic::on_unimplemented(
    message = "matmul: the left operand has {Self} columns but the right operand has {Rhs} rows",
    label = "inner dimensions of this matmul differ: {Self} vs {Rhs}",
    note = "for `a.matmul(&b)`, the last dim of `a` must equal the second-to-last dim of `b`"
)]
pub trait MatmulDim<Rhs: Dim>: Dim {}
impl<const N: usize, const M: usize> MatmulDim<C<M>> for C<N> where (): MatmulSizes<N, M> {}
impl<const N: usize> MatmulDim<Dyn> for C<N> {}
impl<const N: usize> MatmulDim<C<N>> for Dyn {}
impl MatmulDim<Dyn> for Dyn {}
impl MatmulDim<One> for One {}
impl MatmulDim<Dyn> for One {}
impl MatmulDim<One> for Dyn {}

/// The dim two dims broadcast to (the type of an elementwise result):
/// defined for every pair, a static size meeting another static size gives
/// the left one. Whether they agree is [`DimBroadcasts`]' rule.
pub trait BroadcastDim<Rhs> {
    /// The broadcast result.
    type Out: Dim;
}
impl<const N: usize, const M: usize> BroadcastDim<C<M>> for C<N> {
    type Out = C<N>;
}
impl<const N: usize> BroadcastDim<One> for C<N> {
    type Out = C<N>;
}
impl<const N: usize> BroadcastDim<C<N>> for One {
    type Out = C<N>;
}
impl<const N: usize> BroadcastDim<Dyn> for C<N> {
    type Out = C<N>;
}
impl<const N: usize> BroadcastDim<C<N>> for Dyn {
    type Out = C<N>;
}
impl BroadcastDim<One> for One {
    type Out = One;
}
impl BroadcastDim<Dyn> for One {
    type Out = Dyn;
}
impl BroadcastDim<One> for Dyn {
    type Out = Dyn;
}
impl BroadcastDim<Dyn> for Dyn {
    type Out = Dyn;
}

/// Broadcasting of one pair of dims under operation `Op` (elementwise ops):
/// equal sizes, or a [`One`] that stretches, or a [`Dyn`] checked at run time.
#[diagnostic::on_unimplemented(
    message = "{Op}: shapes cannot be broadcast together: size {Self} does not match size {Rhs}",
    label = "size {Self} vs size {Rhs}: these shapes do not broadcast",
    note = "broadcasting aligns shapes from the last dim; each pair must be equal, or one of them `One` (a size-1 dim from `unsqueeze` or `*_keepdim`), or `Dyn`"
)]
pub trait DimBroadcasts<Rhs, Op>: BroadcastDim<Rhs> {}
impl<const N: usize, const M: usize, Op> DimBroadcasts<C<M>, Op> for C<N> where
    (): BroadcastSizes<N, M, Op>
{
}
impl<const N: usize, Op> DimBroadcasts<One, Op> for C<N> {}
impl<const N: usize, Op> DimBroadcasts<C<N>, Op> for One {}
impl<const N: usize, Op> DimBroadcasts<Dyn, Op> for C<N> {}
impl<const N: usize, Op> DimBroadcasts<C<N>, Op> for Dyn {}
impl<Op> DimBroadcasts<One, Op> for One {}
impl<Op> DimBroadcasts<Dyn, Op> for One {}
impl<Op> DimBroadcasts<One, Op> for Dyn {}
impl<Op> DimBroadcasts<Dyn, Op> for Dyn {}

/// Expanding a dim to a target size (`expand`, `broadcast_to`, a mask):
/// equal, from [`One`], or involving [`Dyn`] (checked at run time). `Op`
/// names the operation in the compiler's message.
#[diagnostic::on_unimplemented(
    message = "{Op}: cannot expand size {Self} to size {Target}",
    label = "only a `One` (size-1) dim stretches; size {Self} cannot become {Target}"
)]
pub trait ExpandDim<Target: Dim, Op = op::expand>: Dim {}
impl<const N: usize, const M: usize, Op> ExpandDim<C<M>, Op> for C<N> where (): ExpandSizes<N, M, Op>
{}
impl<const N: usize, Op> ExpandDim<C<N>, Op> for One {}
impl<const N: usize, Op> ExpandDim<C<N>, Op> for Dyn {}
impl<const N: usize, Op> ExpandDim<Dyn, Op> for C<N> {}
impl<Op> ExpandDim<One, Op> for One {}
impl<Op> ExpandDim<Dyn, Op> for One {}
impl<Op> ExpandDim<Dyn, Op> for Dyn {}
impl<Op> ExpandDim<One, Op> for Dyn {}

/// Two dims that must be the same size under operation `Op` (the axes two
/// pieces share in `cat_with`): equal static sizes, or a [`Dyn`] checked at
/// run time.
#[diagnostic::on_unimplemented(
    message = "{Op}: size {Self} does not match size {Rhs}",
    label = "these sizes must be equal"
)]
pub trait DimEquals<Rhs, Op> {}
impl<const N: usize, const M: usize, Op> DimEquals<C<M>, Op> for C<N> where (): EqualSizes<N, M, Op> {}
impl<const N: usize, Op> DimEquals<Dyn, Op> for C<N> {}
impl<const N: usize, Op> DimEquals<C<N>, Op> for Dyn {}
impl<Op> DimEquals<Dyn, Op> for Dyn {}
impl<Op> DimEquals<One, Op> for One {}
impl<Op> DimEquals<Dyn, Op> for One {}
impl<Op> DimEquals<One, Op> for Dyn {}
impl<const N: usize, Op> DimEquals<One, Op> for C<N> where (): EqualSizes<N, 1, Op> {}
impl<const N: usize, Op> DimEquals<C<N>, Op> for One where (): EqualSizes<1, N, Op> {}

/// A dim that may be removed by `squeeze`: size 1 ([`One`], `C<1>`), or [`Dyn`]
/// (checked at run time).
#[diagnostic::on_unimplemented(
    message = "squeeze: size {Self} is not 1",
    label = "only a size-1 dim can be squeezed"
)]
pub trait SizeOne: Dim {}
impl SizeOne for One {}
impl<const N: usize> SizeOne for C<N> where (): SqueezeSize<N> {}
impl SizeOne for Dyn {}

// The traits below carry the sizes as plain numbers, so the messages print
// `size 3` rather than a type name. Each has one impl: equal sizes (or 1).

/// Two static sizes that must be equal for broadcasting under operation `Op`.
#[diagnostic::on_unimplemented(
    message = "{Op}: shapes cannot be broadcast together: size {A} does not match size {B}",
    label = "size {A} vs size {B}: these shapes do not broadcast",
    note = "broadcasting aligns shapes from the last dim; each pair must be equal, or one of them `One` (a size-1 dim from `unsqueeze` or `*_keepdim`), or `Dyn`"
)]
pub trait BroadcastSizes<const A: usize, const B: usize, Op> {}
impl<const N: usize, Op> BroadcastSizes<N, N, Op> for () {}

/// The inner sizes of a matrix product.
#[diagnostic::on_unimplemented(
    message = "matmul: the left operand has {A} columns but the right operand has {B} rows",
    label = "inner dimensions of this matmul differ: {A} vs {B}",
    note = "for `a.matmul(&b)`, the last dim of `a` must equal the second-to-last dim of `b`"
)]
pub trait MatmulSizes<const A: usize, const B: usize> {}
impl<const N: usize> MatmulSizes<N, N> for () {}

/// Two static sizes that must be equal under operation `Op`.
#[diagnostic::on_unimplemented(
    message = "{Op}: size {A} does not match size {B}",
    label = "size {A} vs size {B}: these must be equal",
    note = "pieces joined along an axis must have the same size on every other axis"
)]
pub trait EqualSizes<const A: usize, const B: usize, Op> {}
impl<const N: usize, Op> EqualSizes<N, N, Op> for () {}

/// A static size expanded to another under operation `Op`.
#[diagnostic::on_unimplemented(
    message = "{Op}: cannot expand size {A} to size {B}",
    label = "only a `One` (size-1) dim stretches; size {A} cannot become {B}"
)]
pub trait ExpandSizes<const A: usize, const B: usize, Op> {}
impl<const N: usize, Op> ExpandSizes<N, N, Op> for () {}

/// A static size that `squeeze` removes.
#[diagnostic::on_unimplemented(
    message = "squeeze: size {N} is not 1",
    label = "only a size-1 dim can be squeezed"
)]
pub trait SqueezeSize<const N: usize> {}
impl SqueezeSize<1> for () {}
