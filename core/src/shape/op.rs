//! Names of operations, as types, so a shape rule can say which operation
//! it failed for: `add: shapes cannot be broadcast together: size 3 does
//! not match size 4`.
//!
//! A check trait takes the name as a parameter (`S: Broadcasts<S2,
//! op::add>`, `S: AxisOf<AX, op::sum>`), carries it down to the sizes that
//! disagree, and its `#[diagnostic::on_unimplemented]` message prints it.
//! rustc prints a type by its bare name when no other public item of any
//! crate in the build has that name, so each name here is the method's own
//! and must stay unique: the op modules that share one (`ops::matmul`,
//! `ops::softmax`, `ops::cumsum`) are `#[doc(hidden)]`, which takes them out
//! of that count; `std` is the standard library's (hence `std_dev`); and a
//! free function that programs import by a glob and call (`where_cond`,
//! `fused`, `cat`) gets the name of its part (`where_cond_branches`) or
//! PyTorch's other name for it (`concatenate`). Where a name is not unique
//! the message still ends in it (`forma::forma_core::shape::op::add`).
//!
//! Code generic over shapes names the operation in its bound:
//! `fn f<S1: Broadcasts<S2, op::add>, S2: Shape>(a: &Tensor<S1>, b:
//! &Tensor<S2>) { a + b }`, or takes them all: [`Elementwise`],
//! [`AlongAxis`]. Code generic over a dim only needs `B: Dim`: every dim
//! broadcasts with itself under every elementwise name.
#![allow(non_camel_case_types)]

use super::dims::{Dim, DimBroadcasts};
use super::{AppendDimOf, AxisOf, Broadcasts, HasAxis, Shape};
use crate::device::Backend;
use crate::dtype::Dtype;
use crate::tensor::Tensor;

macro_rules! names {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            #[derive(Debug)]
            pub enum $name {}
        )*

        /// Every dim broadcasts with itself, to itself, under every
        /// elementwise operation's name: a supertrait of [`Dim`], so code
        /// generic over a batch `B: Dim` adds two `B`-batched tensors with
        /// no further bound.
        pub trait BroadcastsWithItself: Sized $(+ DimBroadcasts<Self, $name>)* {}
        impl<D: Dim> BroadcastsWithItself for D where D: Sized $(+ DimBroadcasts<D, $name>)* {}

        /// Two shapes that broadcast together under every elementwise
        /// operation named here: one bound for code generic over shapes
        /// that applies several (`S1: Elementwise<S2>`).
        pub trait Elementwise<Rhs: Shape>: Sized $(+ Broadcasts<Rhs, $name>)* {}
        impl<S: Shape, Rhs: Shape> Elementwise<Rhs> for S where S: Sized $(+ Broadcasts<Rhs, $name>)* {}
    };
}

names! {
    /// `a + b`, [`crate::Tensor::add`].
    add,
    /// `a - b`, [`crate::Tensor::sub`].
    sub,
    /// `a * b`, [`crate::Tensor::mul`].
    mul,
    /// `a / b`, [`crate::Tensor::div`].
    div,
    /// [`crate::Tensor::pow`].
    pow,
    /// [`crate::Tensor::maximum`].
    maximum,
    /// [`crate::Tensor::minimum`].
    minimum,
    /// [`crate::Tensor::fmax`].
    fmax,
    /// [`crate::Tensor::fmin`].
    fmin,
    /// [`crate::Tensor::eq`].
    eq,
    /// [`crate::Tensor::ne`].
    ne,
    /// [`crate::Tensor::lt`].
    lt,
    /// [`crate::Tensor::le`].
    le,
    /// [`crate::Tensor::gt`].
    gt,
    /// [`crate::Tensor::ge`].
    ge,
    /// `logical_and` of two masks.
    logical_and,
    /// `logical_or` of two masks.
    logical_or,
    /// `logical_xor` of two masks.
    logical_xor,
    /// [`crate::ops::cmp::where_cond`]: its two branches broadcast together.
    /// (Not `where_cond`: a program that imports the function by a glob and
    /// calls it makes rustc print a type of that name in full.)
    where_cond_branches,
    /// [`crate::ops::fused::fused`]: its inputs broadcast together (named
    /// as `where_cond_branches` is).
    fused_inputs,
    /// [`crate::Tensor::matmul`]: the batch dims broadcast.
    matmul,
}

/// [`crate::Tensor::expand`] (and any rule that stretches a shape to
/// another without naming its operation).
#[derive(Debug)]
pub enum expand {}

/// [`crate::ops::cmp::where_cond`]: the condition stretches to the
/// branches' shape.
#[derive(Debug)]
pub enum where_cond_mask {}

/// [`crate::Tensor::masked_fill`]: the mask stretches to the tensor.
#[derive(Debug)]
pub enum masked_fill {}

macro_rules! along {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            #[derive(Debug)]
            pub enum $name {}
        )*

        /// A shape that has axis `AX` under every operation along an axis
        /// named here: one bound for code generic over shapes that applies
        /// several (`S: AlongAxis<1>`).
        pub trait AlongAxis<const AX: isize>: Sized $(+ AxisOf<AX, $name>)* {}
        impl<S: HasAxis<AX>, const AX: isize> AlongAxis<AX> for S where S: Sized $(+ AxisOf<AX, $name>)* {}
    };
}

along! {
    /// [`crate::Tensor::sum`] and its `_keepdim` form.
    sum,
    /// [`crate::Tensor::mean`].
    mean,
    /// [`crate::Tensor::max`].
    max,
    /// [`crate::Tensor::min`].
    min,
    /// [`crate::Tensor::prod`].
    prod,
    /// [`crate::Tensor::logsumexp`].
    logsumexp,
    /// [`crate::Tensor::argmax`].
    argmax,
    /// [`crate::Tensor::argmin`].
    argmin,
    /// [`crate::Tensor::var`].
    var,
    /// [`crate::Tensor::std`] (not `std`, the standard library's name, which
    /// rustc would print in full).
    std_dev,
    /// [`crate::Tensor::cumsum`].
    cumsum,
    /// [`crate::Tensor::softmax`].
    softmax,
    /// [`crate::Tensor::log_softmax`].
    log_softmax,
    /// [`crate::Tensor::index_select`].
    index_select,
    /// [`crate::Tensor::gather`].
    gather,
    /// [`crate::Tensor::scatter_add`].
    scatter_add,
    /// [`crate::Tensor::squeeze`].
    squeeze,
    /// [`crate::Tensor::narrow`] and `narrow_static`.
    narrow,
    /// [`crate::Tensor::slice`].
    slice,
    /// [`crate::Tensor::split`].
    split,
    /// [`crate::Tensor::chunk`].
    chunk,
    /// [`crate::ops::cat::cat`], named as `torch.concatenate` (a program that
    /// imports `cat` through the prelude's glob and calls it would see this
    /// type's whole path were it named `cat`).
    concatenate,
    /// [`crate::Tensor::sort`].
    sort,
    /// [`crate::Tensor::argsort`].
    argsort,
    /// [`crate::Tensor::topk`].
    topk,
    /// [`crate::Tensor::roll`].
    roll,
    /// [`crate::Tensor::repeat_interleave`] and its `_each` form.
    repeat_interleave,
    /// [`crate::Tensor::pad`].
    pad,
    /// [`crate::Tensor::flatten`] (axis 0 is kept).
    flatten,
    /// [`crate::Tensor::try_reduce`] and its `_keepdim` form.
    try_reduce,
    /// [`crate::Tensor::tril`], whose rule is that axis -2 exists (rank 2 or more).
    tril,
    /// [`crate::Tensor::triu`], as `tril`.
    triu,
}

/// [`crate::ops::cat::stack`]'s new axis (named after its part, as
/// [`where_cond_mask`] is: `stack` is a function programs import by a glob).
#[derive(Debug)]
pub enum stack_axis {}

/// [`crate::Tensor::unsqueeze`].
#[derive(Debug)]
pub enum unsqueeze {}

/// [`crate::Tensor::cat_with`]: the pieces agree outside the joined axis.
#[derive(Debug)]
pub enum cat_with {}

/// [`crate::Tensor::embedding`]: its indices are `i64`, and of rank 5 at
/// most since the result appends the table's dim (named as
/// `where_cond_branches` is: `embedding` is a public module of `forma-nn`).
#[derive(Debug)]
pub enum embedding_indices {}

/// An operand's element type `Self`, which must be `E` under operation
/// `Op` (the right operand of `matmul`, a loss's target, `i64` indices):
/// implemented only for `E` itself, so another type is one error naming
/// the op and both types ("matmul: an operand of f64 where f32 is
/// expected") rather than "mismatched types" on the argument.
#[diagnostic::on_unimplemented(
    message = "{Op}: an operand of {Self} where {E} is expected",
    label = "a tensor of {Self} here",
    note = "operands share one element type; convert with `.to_dtype::<{E}>()` (indices are i64)"
)]
pub trait SameDtype<E: Dtype, Op>: Dtype {
    /// `t`, whose element type is `E` (it is `Self`).
    fn same<S: Shape, D: Backend>(t: &Tensor<S, Self, D>) -> &Tensor<S, E, D>;
}

impl<E: Dtype, Op> SameDtype<E, Op> for E {
    #[inline]
    fn same<S: Shape, D: Backend>(t: &Tensor<S, E, D>) -> &Tensor<S, E, D> {
        t
    }
}

/// [`crate::Tensor::one_hot`].
#[derive(Debug)]
pub enum one_hot {}

/// [`crate::Tensor::conv2d`] and its `_bias` form.
#[derive(Debug)]
pub enum conv2d {}

/// [`crate::Tensor::conv1d`].
#[derive(Debug)]
pub enum conv1d {}

/// [`crate::Tensor::conv_transpose2d`].
#[derive(Debug)]
pub enum conv_transpose2d {}

/// [`crate::Tensor::max_pool2d`].
#[derive(Debug)]
pub enum max_pool2d {}

/// [`crate::Tensor::avg_pool2d`].
#[derive(Debug)]
pub enum avg_pool2d {}

/// [`crate::Tensor::try_max_pool2d_with_indices`].
#[derive(Debug)]
pub enum max_pool2d_with_indices {}

/// [`crate::Tensor::try_max_pool1d`].
#[derive(Debug)]
pub enum max_pool1d {}

/// [`crate::Tensor::try_avg_pool1d`].
#[derive(Debug)]
pub enum avg_pool1d {}

/// [`crate::Tensor::try_max_unpool2d`].
#[derive(Debug)]
pub enum max_unpool2d {}

// A method of every tensor whose receiver must have some rank states that
// rule on one of its own type parameters (`Co: ImageInput<S, op::conv2d>`,
// the weight's first dim), not on the receiver's shape. rustc looks a
// method up before it reads the arguments, so then it cannot yet tell that
// the rule fails: a rank-3 input is one E0277 naming the op ("conv2d: the
// input `(C<1>, C<28>, C<28>)` is not [batch, channels, height, width]").
// Lookup does settle a rule on the receiver's shape alone when the shape
// meets it for no parameters at all (no `ImageBatch<_>` for any rank-3
// tuple), which is E0599 "no method named" or "its trait bounds were not
// satisfied", as is a method of rank-4 tensors only (tried on rustc 1.95);
// hence the one `AxisOf` impl of `()`, for an axis nobody names.
// `S: AxisOf<-2, op::tril>` on a rank-1 shape is E0277: `(D0,)` has
// `AxisOf` impls for other axes.

/// A shape laid out `[batch, channels, height, width]`, the input of `Op`.
#[diagnostic::on_unimplemented(
    message = "{Op}: the input `{Self}` is not [batch, channels, height, width]",
    label = "not a rank-4 input",
    note = "a single image [channels, height, width] needs a batch dim first: `x.unsqueeze::<0>()`"
)]
pub trait ImageBatch<Op>: Shape {
    /// The batch dim.
    type Batch: Dim;
    /// The channel dim.
    type Channels: Dim;
}

impl<N: Dim, C: Dim, H: Dim, W: Dim, Op> ImageBatch<Op> for (N, C, H, W) {
    type Batch = N;
    type Channels = C;
}

/// A shape laid out `[batch, channels, length]`, the input of `Op`.
#[diagnostic::on_unimplemented(
    message = "{Op}: the input `{Self}` is not [batch, channels, length]",
    label = "not a rank-3 input",
    note = "a single sequence [channels, length] needs a batch dim first: `x.unsqueeze::<0>()`"
)]
pub trait SequenceBatch<Op>: Shape {
    /// The batch dim.
    type Batch: Dim;
    /// The channel dim.
    type Channels: Dim;
}

impl<N: Dim, C: Dim, L: Dim, Op> SequenceBatch<Op> for (N, C, L) {
    type Batch = N;
    type Channels = C;
}

/// The input `S` of a 2-d convolution or pooling `Op` is an
/// [`ImageBatch`], stated on a type parameter `Self` of the method (the
/// weight's first dim, the pooling parameters; see above why).
pub trait ImageInput<S: Shape, Op> {
    /// The input's batch dim.
    type Batch: Dim;
    /// The input's channel dim.
    type Channels: Dim;
}

impl<X, S: ImageBatch<Op>, Op> ImageInput<S, Op> for X {
    type Batch = S::Batch;
    type Channels = S::Channels;
}

/// The input `S` of a 1-d convolution `Op` is a [`SequenceBatch`], stated
/// on a dim `Self` of the weight.
pub trait SequenceInput<S: Shape, Op> {
    /// The input's batch dim.
    type Batch: Dim;
}

impl<X, S: SequenceBatch<Op>, Op> SequenceInput<S, Op> for X {
    type Batch = S::Batch;
}

/// The input `S` of a 1-d pooling `Op` is a [`SequenceBatch`], stated on
/// its window size, a plain `usize` (this trait's only impl, so a literal
/// `2` is read as one).
#[diagnostic::on_unimplemented(
    message = "{Op}: the window size is a `usize`, not `{Self}`",
    label = "not a `usize`"
)]
pub trait SequencePool<S: Shape, Op> {
    /// The input's batch dim.
    type Batch: Dim;
    /// The input's channel dim.
    type Channels: Dim;
    /// The window size.
    fn size(self) -> usize;
}

impl<S: SequenceBatch<Op>, Op> SequencePool<S, Op> for usize {
    type Batch = S::Batch;
    type Channels = S::Channels;
    fn size(self) -> usize {
        self
    }
}

/// The input `S` of an unpooling `Op` is an [`ImageBatch`], stated on its
/// output size, a plain `[usize; 2]` (this trait's only impl, so literals
/// `[4, 4]` are read as one).
#[diagnostic::on_unimplemented(
    message = "{Op}: the output size is a `[usize; 2]` (height, width), not `{Self}`",
    label = "not a `[usize; 2]`"
)]
pub trait ImageUnpool<S: Shape, Op> {
    /// The input's batch dim.
    type Batch: Dim;
    /// The input's channel dim.
    type Channels: Dim;
    /// The output's height and width.
    fn size(self) -> [usize; 2];
}

impl<S: ImageBatch<Op>, Op> ImageUnpool<S, Op> for [usize; 2] {
    type Batch = S::Batch;
    type Channels = S::Channels;
    fn size(self) -> [usize; 2] {
        self
    }
}

/// `one_hot`'s input `S` takes another dim ([`AppendDimOf`]), stated on
/// its output element type `Self`.
pub trait OneHotOf<S: Shape, const N: usize> {
    /// `S` with `N` classes appended.
    type Out: Shape;
}

impl<F, S: AppendDimOf<one_hot>, const N: usize> OneHotOf<S, N> for F {
    type Out = S::Appended<super::C<N>>;
}
