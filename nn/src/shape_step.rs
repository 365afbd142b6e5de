//! What a layer does to the sizes of its input, stated beside the layer, so
//! `#[derive(Sequential)]` can follow a model's shape through every layer,
//! built-in or the user's, without knowing any layer by name.
//!
//! Each layer implements [`ShapeStep`] with one associated const, a
//! [`Step`]: "acts on the last axis, 400 features in and 120 out"
//! ([`Step::features`]), "a 5x5 window over height and width, 1 channel in
//! and 6 out" ([`Step::Window`]), "same shape" ([`Step::same`]), and so on.
//! The derive chains the steps in `const` items: the sizes after each layer
//! are computed by the compiler with the window rule of
//! [`forma_core::shape::window`], each layer's input and output types are
//! built from them ([`BuildShape`]), and a mismatch between neighbours stops
//! the build with one message naming the field, the layer and both sizes:
//!
//! ```text
//! error[E0080]: evaluation panicked: layer `fc1` (Linear) takes 256 input features,
//!               but receives [B, 400] (400 features) from `flatten`
//! ```
//!
//! A layer of your own takes part by saying what it does:
//!
//! ```
//! use forma::nn::{layers::Linear, shape_step::{ShapeStep, Step}, Forward};
//! use forma::prelude::*;
//!
//! /// Two linear layers with a residual: `[.., 16]` in, `[.., 16]` out.
//! #[derive(Module)]
//! struct Residual {
//!     fc: Linear<16, 16>,
//! }
//!
//! impl ShapeStep for Residual {
//!     const STEP: Step = Step::features("Residual", 16, 16);
//! }
//!
//! impl Forward<Tensor<(Dyn, C<16>)>, Tensor<(Dyn, C<16>)>> for Residual {
//!     fn try_forward(&self, x: Tensor<(Dyn, C<16>)>) -> forma::Result<Tensor<(Dyn, C<16>)>> {
//!         Ok(&child!(self.fc, x.clone())? + &x)
//!     }
//! }
//!
//! #[derive(Module, Sequential)]
//! #[sequential(input = [Dyn, 16], output = [Dyn, 4])]
//! struct Net {
//!     block: Residual,
//!     head: Linear<16, 4>,
//! }
//! # let mut rng = Rng::seed_from(0);
//! # let net = Net { block: Residual { fc: Linear::new(&Cpu, &mut rng) }, head: Linear::new(&Cpu, &mut rng) };
//! # let y: Tensor<(Dyn, C<4>)> = net.forward(Tensor::zeros_with((Dyn(2), C)));
//! # assert_eq!(y.dims()[..], [2, 4]);
//! ```
//!
//! A `#[derive(Sequential)]` model implements [`ShapeStep`] itself (its
//! declared input and output, [`Step::fixed`]), so sequential models nest.

use forma_core::shape::check::ConstMsg;
use forma_core::shape::window::{pool_window_out, transposed_window_out};
use forma_core::shape::HasAxis;
use forma_core::{Backend, Dim, Dtype, Shape, Tensor, C};

/// The most axes a step follows (typed shapes go to rank 6).
pub const RANK: usize = 6;

/// What a layer does to the sizes of its input, for `#[derive(Sequential)]`.
///
/// Implement it beside the layer's `Forward`; the derive reads
/// [`ShapeStep::STEP`] for every field, so a layer that does not implement
/// it cannot be a step of a sequential model.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say what it does to a shape, so #[derive(Sequential)] cannot follow it",
    label = "this layer has no `ShapeStep`",
    note = "implement `forma::nn::shape_step::ShapeStep` for it, e.g. `impl ShapeStep for MyLayer {{ const STEP: Step = Step::features(\"MyLayer\", 16, 32); }}`",
    note = "the other steps: `Step::same`, `Step::channels`, `Step::Window`, `Step::fixed` (see the module docs of `forma::nn::shape_step`)"
)]
pub trait ShapeStep {
    /// The step.
    const STEP: Step;
}

/// One size of a shape the derive follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// A static size.
    Static(usize),
    /// Whatever axis `j` of the model's declared input is (a `Dyn`, a
    /// generic batch `B`): in [`Step::fixed`], axis `j` of the layer's input.
    Input(usize),
    /// A size known at run time only.
    Dyn,
}

impl Size {
    const fn get(self) -> Option<usize> {
        match self {
            Size::Static(n) => Some(n),
            _ => None,
        }
    }
}

/// One axis of a sliding window: PyTorch's options for that axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowAxis {
    /// Taps of the kernel.
    pub kernel: usize,
    /// Step between windows.
    pub stride: usize,
    /// Implicit padding on each side.
    pub padding: usize,
    /// Spacing of the taps.
    pub dilation: usize,
    /// Pooling's `ceil_mode`.
    pub ceil_mode: bool,
    /// `Some(output_padding)` for a transposed convolution.
    pub transposed: Option<usize>,
}

impl WindowAxis {
    /// A window of `kernel` taps with PyTorch's conv defaults otherwise.
    pub const fn new(kernel: usize, stride: usize, padding: usize, dilation: usize) -> Self {
        WindowAxis {
            kernel,
            stride,
            padding,
            dilation,
            ceil_mode: false,
            transposed: None,
        }
    }

    /// The output length for an input of `n`, by the one window rule.
    const fn out(&self, n: usize) -> Option<usize> {
        match self.transposed {
            None => pool_window_out(
                n,
                self.kernel,
                self.stride,
                self.padding,
                self.dilation,
                self.ceil_mode,
            ),
            Some(op) => {
                transposed_window_out(n, self.kernel, self.stride, self.padding, op, self.dilation)
            }
        }
    }
}

/// What a layer does to its input's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Elementwise: any shape of at least `min_rank` axes, unchanged.
    Same {
        /// The layer's name in messages (`"Relu"`).
        layer: &'static str,
        /// The fewest axes it takes.
        min_rank: usize,
    },
    /// Acts on the last axis: it must hold `input`, and holds `output` after
    /// (Linear, LayerNorm, an LSTM over `[batch, seq, features]`).
    LastAxis {
        /// The layer's name in messages.
        layer: &'static str,
        /// Size the last axis must have.
        input: usize,
        /// Size of the last axis after the layer.
        output: usize,
        /// The exact rank it takes, or 0 for any rank of at least 1.
        rank: usize,
    },
    /// Acts on the channels, axis 1 of `[batch, channels, ..]` with
    /// `min_rank..=max_rank` axes, keeping the shape (BatchNorm, GroupNorm).
    Channels {
        /// The layer's name in messages.
        layer: &'static str,
        /// The channels it takes.
        channels: usize,
        /// The fewest axes it takes.
        min_rank: usize,
        /// The most axes it takes.
        max_rank: usize,
    },
    /// A sliding window over the last `spatial` axes of
    /// `[batch, channels, *spatial]` (convolution, pooling).
    Window {
        /// The layer's name in messages.
        layer: &'static str,
        /// `Some((in, out))` channels for a convolution; `None` keeps them
        /// (pooling).
        channels: Option<(usize, usize)>,
        /// The number of spatial axes, 1 or 2.
        spatial: usize,
        /// Each spatial axis's window, in order.
        axes: [WindowAxis; 2],
    },
    /// Sets the last `spatial` axes of `[batch, channels, *spatial]` to
    /// fixed sizes (adaptive pooling).
    Resize {
        /// The layer's name in messages.
        layer: &'static str,
        /// The number of spatial axes, 1 or 2.
        spatial: usize,
        /// Their sizes after the layer.
        out: [usize; 2],
    },
    /// Every axis after the first into one (`nn.Flatten()`).
    Flatten {
        /// The layer's name in messages.
        layer: &'static str,
    },
    /// A fixed input pattern and output (a nested sequential model, a
    /// block): see [`Step::fixed`].
    Fixed {
        /// The layer's name in messages.
        layer: &'static str,
        /// The input's rank.
        rank_in: usize,
        /// What each input axis must be: `Static(n)` is checked,
        /// `Input(_)`/`Dyn` take anything.
        input: [Size; RANK],
        /// The output's rank.
        rank_out: usize,
        /// Each output axis: static, `Dyn`, or `Input(j)`, the input's axis `j`.
        output: [Size; RANK],
    },
}

impl Step {
    /// Elementwise, any rank of at least 1.
    pub const fn same(layer: &'static str) -> Step {
        Step::Same { layer, min_rank: 1 }
    }

    /// Acts on the last axis of any rank: `input` features in, `output` out.
    pub const fn features(layer: &'static str, input: usize, output: usize) -> Step {
        Step::LastAxis {
            layer,
            input,
            output,
            rank: 0,
        }
    }

    /// Acts on the channels (axis 1) of a `min_rank..=max_rank` input and
    /// keeps the shape.
    pub const fn channels(
        layer: &'static str,
        channels: usize,
        min_rank: usize,
        max_rank: usize,
    ) -> Step {
        Step::Channels {
            layer,
            channels,
            min_rank,
            max_rank,
        }
    }

    /// Takes `input` (static sizes checked; [`Size::Input`] or [`Size::Dyn`]
    /// for any size) and gives `output`, whose [`Size::Input`]`(j)` axes
    /// pass axis `j` of the input through.
    ///
    /// # Panics
    /// At compile time, for a rank over [`RANK`].
    pub const fn fixed(layer: &'static str, input: &[Size], output: &[Size]) -> Step {
        Step::Fixed {
            layer,
            rank_in: input.len(),
            input: pad(input),
            rank_out: output.len(),
            output: pad(output),
        }
    }

    /// The layer's name in messages.
    pub const fn layer(&self) -> &'static str {
        match *self {
            Step::Same { layer, .. }
            | Step::LastAxis { layer, .. }
            | Step::Channels { layer, .. }
            | Step::Window { layer, .. }
            | Step::Resize { layer, .. }
            | Step::Flatten { layer }
            | Step::Fixed { layer, .. } => layer,
        }
    }
}

const fn pad(s: &[Size]) -> [Size; RANK] {
    assert!(s.len() <= RANK, "a shape step has at most 6 axes");
    let mut d = [Size::Dyn; RANK];
    let mut i = 0;
    while i < s.len() {
        d[i] = s[i];
        i += 1;
    }
    d
}

/// The sizes of a shape as the derive follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    rank: usize,
    d: [Size; RANK],
}

impl Sizes {
    /// A shape of `dims.len()` axes.
    ///
    /// # Panics
    /// At compile time, for a rank over [`RANK`].
    pub const fn new(dims: &[Size]) -> Sizes {
        Sizes {
            rank: dims.len(),
            d: pad(dims),
        }
    }

    /// The rank.
    pub const fn rank(&self) -> usize {
        self.rank
    }

    /// The size at `axis` (`Dyn` past the rank).
    pub const fn at(&self, axis: usize) -> Size {
        if axis < self.rank {
            self.d[axis]
        } else {
            Size::Dyn
        }
    }

    /// The kind of axis `axis` for [`Slot`]: 0 the model input's axis, 1
    /// static, 2 `Dyn`.
    pub const fn kind(&self, axis: usize) -> u8 {
        match self.at(axis) {
            Size::Input(_) => 0,
            Size::Static(_) => 1,
            Size::Dyn => 2,
        }
    }

    /// The value of axis `axis` for [`Slot`]: the input axis or the size.
    pub const fn value(&self, axis: usize) -> usize {
        match self.at(axis) {
            Size::Input(j) | Size::Static(j) => j,
            Size::Dyn => 0,
        }
    }

    const fn with(mut self, axis: usize, s: Size) -> Sizes {
        self.d[axis] = s;
        self
    }

    /// The sizes of `self`, adjusted to `rank` axes: what a layer that
    /// takes `rank` axes is given when the previous one gives another rank
    /// (the mismatch is reported; the rest of the chain still type-checks).
    const fn with_rank(mut self, rank: usize) -> Sizes {
        let mut i = self.rank;
        while i < rank {
            self.d[i] = Size::Dyn;
            i += 1;
        }
        self.rank = rank;
        self
    }
}

/// One link of a sequential chain: the input a layer is given, what it
/// gives, and the first mismatch found so far.
#[derive(Clone, Copy, Debug)]
pub struct Link {
    /// What the layer takes (the previous output, with this layer's
    /// requirements imposed where they disagree).
    pub input: Sizes,
    /// What the layer gives.
    pub output: Sizes,
    names: [&'static str; RANK],
    failed_at: usize,
    msg: ConstMsg,
}

/// No mismatch yet.
const NONE: usize = usize::MAX;
/// The index [`Link::finish`] reports at.
pub const OUTPUT: usize = usize::MAX - 1;

struct Show<'a> {
    s: &'a Sizes,
    names: &'a [&'static str; RANK],
}

const fn show(msg: ConstMsg, s: Show) -> ConstMsg {
    let mut msg = msg.s("[");
    let mut i = 0;
    while i < s.s.rank {
        if i > 0 {
            msg = msg.s(", ");
        }
        msg = match s.s.d[i] {
            Size::Static(n) => msg.n(n),
            Size::Input(j) => msg.s(s.names[j]),
            Size::Dyn => msg.s("Dyn"),
        };
        i += 1;
    }
    msg.s("]")
}

impl Link {
    /// The model's declared input; `names` spells each axis (`"B"`, `"28"`).
    pub const fn start(input: Sizes, names: [&'static str; RANK]) -> Link {
        Link {
            input,
            output: input,
            names,
            failed_at: NONE,
            msg: ConstMsg::new(),
        }
    }

    const fn fail(mut self, index: usize, msg: ConstMsg) -> Link {
        if self.failed_at == NONE {
            self.failed_at = index;
            self.msg = msg;
        }
        self
    }

    const fn head(&self, field: &str, step: &Step) -> ConstMsg {
        ConstMsg::new()
            .s("layer `")
            .s(field)
            .s("` (")
            .s(step.layer())
            .s(")")
    }

    const fn show<'a>(&'a self, s: &'a Sizes) -> Show<'a> {
        Show {
            s,
            names: &self.names,
        }
    }

    /// `msg`, then ", but receives [..]" (the given sizes), the size found
    /// (`(400 features)`) and where it came from.
    const fn receives(
        &self,
        msg: ConstMsg,
        given: &Sizes,
        got: Option<(usize, &str)>,
        prev: &str,
    ) -> ConstMsg {
        let msg = show(msg.s(", but receives "), self.show(given));
        let msg = match got {
            Some((n, what)) => msg.s(" (").n(n).s(what).s(")"),
            None => msg,
        };
        msg.s(" from ").s(prev)
    }

    /// The next link: `step` (field `field`, the `index`-th) after `self`,
    /// whose output came from `prev` (a field, or "the model's input").
    pub const fn then(self, step: Step, index: usize, field: &str, prev: &str) -> Link {
        let given = self.output;
        let head = self.head(field, &step);
        let mut next = self;
        let (input, output) = match step {
            Step::Same { min_rank, .. } => {
                let input = if given.rank < min_rank {
                    let msg = head.s(" takes at least ").n(min_rank).s(" axes");
                    next = next.fail(index, self.receives(msg, &given, None, prev));
                    given.with_rank(min_rank)
                } else {
                    given
                };
                (input, input)
            }
            Step::LastAxis {
                input: want,
                output,
                rank,
                ..
            } => {
                let mut input = given;
                if rank != 0 && given.rank != rank {
                    let msg = head.s(" takes a rank-").n(rank).s(" input");
                    next = next.fail(index, self.receives(msg, &given, None, prev));
                    input = given.with_rank(rank);
                } else if given.rank == 0 {
                    next = next.fail(
                        index,
                        head.s(" takes features on a last axis, but receives a scalar from ")
                            .s(prev),
                    );
                    input = given.with_rank(1);
                }
                let last = input.rank - 1;
                if let Some(got) = input.at(last).get() {
                    if got != want {
                        let msg = head.s(" takes ").n(want).s(" input features");
                        let got = Some((got, " features"));
                        next = next.fail(index, self.receives(msg, &given, got, prev));
                    }
                }
                input = input.with(last, Size::Static(want));
                (input, input.with(last, Size::Static(output)))
            }
            Step::Channels {
                channels,
                min_rank,
                max_rank,
                ..
            } => {
                let mut input = given;
                if given.rank < min_rank || given.rank > max_rank {
                    let msg = head.s(" takes a [batch, channels");
                    let msg = match (min_rank, max_rank) {
                        (4, 4) => msg.s(", height, width"),
                        (_, 2) => msg,
                        _ => msg.s(", .."),
                    };
                    next = next.fail(index, self.receives(msg.s("] input"), &given, None, prev));
                    input = given.with_rank(if given.rank < min_rank {
                        min_rank
                    } else {
                        max_rank
                    });
                }
                next = next.check_channels(index, head, &given, &input, channels, prev);
                let input = input.with(1, Size::Static(channels));
                (input, input)
            }
            Step::Window {
                channels,
                spatial,
                axes,
                ..
            } => {
                let mut input = given;
                let rank = spatial + 2;
                if given.rank != rank {
                    let msg = if spatial == 1 {
                        head.s(" takes a [batch, channels, length] input")
                    } else {
                        head.s(" takes a [batch, channels, height, width] input")
                    };
                    next = next.fail(index, self.receives(msg, &given, None, prev));
                    input = given.with_rank(rank);
                }
                let mut output = input;
                if let Some((cin, cout)) = channels {
                    next = next.check_channels(index, head, &given, &input, cin, prev);
                    input = input.with(1, Size::Static(cin));
                    output = output.with(1, Size::Static(cout));
                }
                let mut k = 0;
                while k < spatial {
                    let axis = 2 + k;
                    let w = axes[k];
                    let name = if spatial == 1 {
                        "length"
                    } else if k == 0 {
                        "height"
                    } else {
                        "width"
                    };
                    output = match input.at(axis) {
                        Size::Static(n) => match w.out(n) {
                            Some(o) => output.with(axis, Size::Static(o)),
                            None => {
                                let msg = head
                                    .s(": an input ")
                                    .s(name)
                                    .s(" of ")
                                    .n(n)
                                    .s(" with kernel ")
                                    .n(w.kernel)
                                    .s(", stride ")
                                    .n(w.stride)
                                    .s(", padding ")
                                    .n(w.padding);
                                next = next.fail(
                                    index,
                                    msg.s(" leaves no output (the kernel is larger than the padded input)"),
                                );
                                output.with(axis, Size::Dyn)
                            }
                        },
                        _ => output.with(axis, Size::Dyn),
                    };
                    k += 1;
                }
                (input, output)
            }
            Step::Resize { spatial, out, .. } => {
                let mut input = given;
                if given.rank != spatial + 2 {
                    let msg = head.s(" takes a [batch, channels, ..] input with ");
                    let msg = msg.n(spatial).s(" spatial axes");
                    next = next.fail(index, self.receives(msg, &given, None, prev));
                    input = given.with_rank(spatial + 2);
                }
                let mut output = input;
                let mut k = 0;
                while k < spatial {
                    output = output.with(2 + k, Size::Static(out[k]));
                    k += 1;
                }
                (input, output)
            }
            Step::Flatten { .. } => {
                let mut input = given;
                if given.rank < 2 {
                    let msg = head.s(" takes a [batch, ..] input of at least 2 axes");
                    next = next.fail(index, self.receives(msg, &given, None, prev));
                    input = given.with_rank(2);
                }
                let mut numel = Some(1usize);
                let mut i = 1;
                while i < input.rank {
                    numel = match (numel, input.d[i].get()) {
                        (Some(a), Some(b)) => a.checked_mul(b),
                        _ => None,
                    };
                    i += 1;
                }
                let flat = match numel {
                    Some(n) => Size::Static(n),
                    None => Size::Dyn,
                };
                (input, Sizes::new(&[input.d[0], flat]))
            }
            Step::Fixed {
                rank_in,
                input: want,
                rank_out,
                output: out,
                ..
            } => {
                let mut input = given;
                if given.rank != rank_in {
                    let want = Sizes {
                        rank: rank_in,
                        d: want,
                    };
                    let msg = show(
                        head.s(" takes "),
                        Show {
                            s: &want,
                            names: &["_"; RANK],
                        },
                    );
                    next = next.fail(index, self.receives(msg, &given, None, prev));
                    input = given.with_rank(rank_in);
                }
                let mut i = 0;
                while i < rank_in {
                    if let Size::Static(w) = want[i] {
                        if let Some(got) = input.d[i].get() {
                            if got != w {
                                let msg = head.s(" takes a size of ").n(w).s(" on axis ").n(i);
                                let got = Some((got, ""));
                                next = next.fail(index, self.receives(msg, &given, got, prev));
                            }
                        }
                        input = input.with(i, Size::Static(w));
                    }
                    i += 1;
                }
                let mut output = Sizes::new(&[]).with_rank(rank_out);
                let mut i = 0;
                while i < rank_out {
                    output = output.with(
                        i,
                        match out[i] {
                            Size::Input(j) if j < rank_in => input.d[j],
                            Size::Input(_) => Size::Dyn,
                            s => s,
                        },
                    );
                    i += 1;
                }
                (input, output)
            }
        };
        next.input = input;
        next.output = output;
        next
    }

    const fn check_channels(
        self,
        index: usize,
        head: ConstMsg,
        given: &Sizes,
        input: &Sizes,
        want: usize,
        prev: &str,
    ) -> Link {
        match input.at(1).get() {
            Some(got) if got != want && given.rank > 1 => {
                let msg = head.s(" takes ").n(want).s(" input channels");
                self.fail(
                    index,
                    self.receives(msg, given, Some((got, " channels")), prev),
                )
            }
            _ => self,
        }
    }

    /// Checks the last layer's output against the model's declared output
    /// (static sizes and the rank; other sizes are checked at run time).
    pub const fn finish(self, declared: Sizes) -> Link {
        let got = self.output;
        let mut same = got.rank == declared.rank;
        let mut i = 0;
        while same && i < got.rank {
            if let (Some(a), Some(b)) = (got.d[i].get(), declared.d[i].get()) {
                same = a == b;
            }
            i += 1;
        }
        if same {
            return self;
        }
        let msg = show(
            ConstMsg::new().s("the model declares output "),
            self.show(&declared),
        )
        .s(" but its last layer gives ");
        let msg = show(msg, self.show(&got));
        let mut next = self.fail(OUTPUT, msg);
        next.input = declared;
        next.output = declared;
        next
    }

    /// The message of the first mismatch when it was found at `index`.
    pub const fn error_at(&self, index: usize) -> Option<&str> {
        if self.failed_at == index {
            Some(self.msg.as_str())
        } else {
            None
        }
    }
}

/// One axis of a shape type built from a [`Link`]: `K` 0 is the model
/// input's axis `N`, 1 the static size `N`, 2 a `Dyn`.
#[derive(Debug)]
pub struct Slot<const K: u8, const N: usize>;

/// The dim a [`Slot`] stands for, given the model's input shape `In`.
pub trait SlotDim<In> {
    /// The dim.
    type Dim: Dim;
}

/// Axis `N` of a shape, counted from the front.
pub trait AxisAt<const N: usize> {
    /// The dim there.
    type At: Dim;
}

macro_rules! axis_at {
    ($($n:literal)*) => {$(
        impl<S: HasAxis<$n>> AxisAt<$n> for S {
            type At = <S as HasAxis<$n>>::At;
        }
    )*};
}
axis_at!(0 1 2 3 4 5);

impl<In: AxisAt<N>, const N: usize> SlotDim<In> for Slot<0, N> {
    type Dim = <In as AxisAt<N>>::At;
}

impl<In, const N: usize> SlotDim<In> for Slot<1, N> {
    type Dim = C<N>;
}

impl<In, const N: usize> SlotDim<In> for Slot<2, N> {
    type Dim = forma_core::Dyn;
}

/// A shape of rank `R` built from six [`Slot`]s (those past `R` unused).
#[derive(Debug)]
pub struct Build<const R: usize, S0, S1, S2, S3, S4, S5>(
    core::marker::PhantomData<(S0, S1, S2, S3, S4, S5)>,
);

/// The shape a [`Build`] stands for, given the model's input shape `In`.
pub trait BuildShape<In> {
    /// The shape.
    type Shape: Shape;
}

macro_rules! build {
    ($r:literal: $($s:ident)* ; $($u:ident)*) => {
        impl<In, $($s: SlotDim<In>,)* $($u,)*> BuildShape<In> for Build<$r, $($s,)* $($u,)*> {
            type Shape = ($(<$s as SlotDim<In>>::Dim,)*);
        }
    };
}
build!(0: ; S0 S1 S2 S3 S4 S5);
build!(1: S0 ; S1 S2 S3 S4 S5);
build!(2: S0 S1 ; S2 S3 S4 S5);
build!(3: S0 S1 S2 ; S3 S4 S5);
build!(4: S0 S1 S2 S3 ; S4 S5);
build!(5: S0 S1 S2 S3 S4 ; S5);
build!(6: S0 S1 S2 S3 S4 S5 ;);

/// Hands the previous layer's output to a layer as the type its step says
/// it takes: the same type in a correct model, so a no-op, and a run-time
/// check of the `Dyn` sizes otherwise (a model whose steps disagree does
/// not build, so no mismatch of static sizes gets here).
///
/// # Errors
/// A shape error naming `field` when a run-time size disagrees.
pub fn enter<S: Shape, S2: Shape, E: Dtype, D: Backend>(
    field: &'static str,
    x: Tensor<S, E, D>,
) -> forma_core::Result<Tensor<S2, E, D>> {
    x.try_into_shape::<S2>()
        .map_err(|_| forma_core::Error::shape(field, S2::describe(), &x.dims()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: [&str; RANK] = ["B", "", "", "", "", ""];

    fn start(dims: &[Size]) -> Link {
        Link::start(Sizes::new(dims), NAMES)
    }

    #[test]
    fn windows_follow_the_one_rule() {
        // LeNet's first half: 28 -> conv 5 pad 2 -> 28 -> pool 2 -> 14.
        let conv = Step::Window {
            layer: "Conv2d",
            channels: Some((1, 6)),
            spatial: 2,
            axes: [WindowAxis::new(5, 1, 2, 1); 2],
        };
        let pool = WindowAxis {
            ceil_mode: true,
            ..WindowAxis::new(2, 2, 0, 1)
        };
        let pool = Step::Window {
            layer: "MaxPool2d",
            channels: None,
            spatial: 2,
            axes: [pool; 2],
        };
        let l = start(&[Size::Input(0), Size::Static(1), Size::Static(28), Size::Dyn])
            .then(conv, 0, "conv", "input")
            .then(pool, 1, "pool", "`conv`");
        let want = [Size::Input(0), Size::Static(6), Size::Static(14), Size::Dyn];
        assert_eq!(l.output, Sizes::new(&want));
        assert_eq!(l.error_at(0), None);
        assert_eq!(l.error_at(1), None);
        // A 27-high input rounds up under ceil_mode: 27 -> 14.
        let l = start(&[
            Size::Input(0),
            Size::Static(6),
            Size::Static(27),
            Size::Static(27),
        ])
        .then(pool, 0, "pool", "input");
        assert_eq!(l.output.at(2), Size::Static(14));
    }

    #[test]
    fn the_first_mismatch_is_kept_and_the_chain_goes_on() {
        let l = start(&[Size::Input(0), Size::Static(400)])
            .then(Step::features("Linear", 256, 10), 0, "fc1", "`flatten`")
            .then(Step::features("Linear", 20, 2), 1, "fc2", "`fc1`");
        assert_eq!(
            l.error_at(0),
            Some("layer `fc1` (Linear) takes 256 input features, but receives [B, 400] (400 features) from `flatten`")
        );
        assert_eq!(l.error_at(1), None);
        // The layer is given what it takes, so the types after it still check.
        assert_eq!(l.input, Sizes::new(&[Size::Input(0), Size::Static(20)]));
        assert_eq!(l.output, Sizes::new(&[Size::Input(0), Size::Static(2)]));
    }

    #[test]
    fn fixed_steps_pass_axes_through_and_check_static_ones() {
        let block = Step::fixed(
            "Stem",
            &[Size::Input(0), Size::Static(4)],
            &[Size::Input(0), Size::Static(16), Size::Dyn],
        );
        let l = start(&[Size::Input(0), Size::Static(4)]).then(block, 0, "stem", "input");
        assert_eq!(l.error_at(0), None);
        let want = [Size::Input(0), Size::Static(16), Size::Dyn];
        assert_eq!(l.output, Sizes::new(&want));
        let l = start(&[Size::Input(0), Size::Static(5)]).then(block, 0, "stem", "input");
        assert_eq!(
            l.error_at(0),
            Some("layer `stem` (Stem) takes a size of 4 on axis 1, but receives [B, 5] (5) from input")
        );
    }

    #[test]
    fn flatten_multiplies_static_sizes_and_finish_checks_the_declared_output() {
        let l = start(&[
            Size::Input(0),
            Size::Static(16),
            Size::Static(5),
            Size::Static(5),
        ])
        .then(Step::Flatten { layer: "Flatten" }, 0, "flatten", "input");
        assert_eq!(l.output, Sizes::new(&[Size::Input(0), Size::Static(400)]));
        let done = l.finish(Sizes::new(&[Size::Input(0), Size::Static(400)]));
        assert_eq!(done.error_at(OUTPUT), None);
        let done = l.finish(Sizes::new(&[Size::Input(0), Size::Static(10)]));
        assert_eq!(
            done.error_at(OUTPUT),
            Some("the model declares output [B, 10] but its last layer gives [B, 400]")
        );
        // A `Dyn` height leaves the flattened size to run time.
        let l = start(&[Size::Input(0), Size::Static(16), Size::Dyn]).then(
            Step::Flatten { layer: "Flatten" },
            0,
            "flatten",
            "input",
        );
        assert_eq!(l.output.at(1), Size::Dyn);
    }
}
