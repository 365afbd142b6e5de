//! Fused elementwise expressions: [`fused`] evaluates an expression over up
//! to six tensors in one pass over memory, like the kernel `torch.compile`
//! generates for a chain of pointwise ops.
//!
//! `gelu(x * w + b)` as three ops reads and writes memory three times, with
//! two intermediate buffers; fused, it reads `x`, `w` and `b` once and writes
//! the result once, and its backward writes each input's gradient once. The
//! expression is built from the table ops (operators and the methods of
//! [`UnaryExprs`] and [`BinaryExprs`]), so every row of the unary and binary
//! tables is available, with its derivative.
//!
//! The shape rule is broadcasting, as for the binary ops: static sizes that
//! do not broadcast are a compile error; `Dyn` sizes are checked when the
//! expression runs. Each input's gradient is summed back to its own sizes.
//!
//! Numbers: in f32 and f64 a fused expression gives the same bits as the same
//! ops composed (each op rounds to the element type either way). For f16 and
//! bf16 the intermediates stay in f32 and the result is rounded once, as a
//! compiled PyTorch kernel does; [`try_composed`] runs the ops one by one,
//! rounding after each, as eager PyTorch does. A backend without a fused
//! kernel (CUDA today) runs the composed ops.

mod expr;
mod program;

pub use crate::ops::binary::BinaryExprs;
pub use crate::ops::unary::UnaryExprs;
pub use expr::{Arg, Binary, Expr, Unary};
pub use program::{runnable, visit_row, RowVisitor};

use crate::device::{Backend, Device};
use crate::dtype::Float;
use crate::error::{fmt_dims, Error, Result};
use crate::layout::{broadcast_dims, Layout};
use crate::shape::{op, BroadcastShape, Broadcasts, Shape};
use crate::tape::util::sum_to;
use crate::tape::{Raw, Var};
use crate::tensor::{ok, Tensor};
use std::sync::Arc;

/// The op's name, for errors and the tape.
const NAME: &str = "fused";

/// Backend support for fused expressions.
pub trait FusedKernel<E: Float>: Backend {
    /// `expr` at every position of the inputs, which all have the output's
    /// sizes (broadcast dims have stride 0); the result is row-major.
    ///
    /// `Ok(None)` (the default) means the backend has no fused kernel, and
    /// the caller runs the expression as composed ops.
    fn fused<X: Expr, const N: usize>(
        &self,
        expr: X,
        ins: [(&Self::Storage<E>, &Layout); N],
    ) -> Result<Option<Self::Storage<E>>> {
        let _ = (expr, ins);
        Ok(None)
    }

    /// The gradient of input `wrt`, over the output's sizes, row-major:
    /// `g * d(expr)/d(x[wrt])`. `ins` holds the inputs (as for
    /// [`FusedKernel::fused`]) and then the output gradient `g`, all of the
    /// output's sizes.
    ///
    /// `Ok(None)` (the default) means no fused kernel: the caller runs the
    /// composed ops' backwards.
    fn fused_backward<X: Expr, const M: usize>(
        &self,
        expr: X,
        ins: [(&Self::Storage<E>, &Layout); M],
        wrt: usize,
    ) -> Result<Option<Self::Storage<E>>> {
        let _ = (expr, ins, wrt);
        Ok(None)
    }

    /// The expression `nodes` (built at run time: see [`RowVisitor`]) at
    /// every position of `ins`, which all have the output's sizes
    /// (broadcast dims have stride 0); the result is row-major. Each row
    /// rounds to `E` as the op alone does, so the values are the composed
    /// ops', bit for bit. The caller has checked the nodes ([`runnable`]).
    ///
    /// `Ok(None)` (the default) means no such kernel: the caller runs the
    /// composed ops.
    fn fused_nodes(
        &self,
        nodes: &[crate::graph::Elem],
        ins: &[(&Self::Storage<E>, &Layout)],
    ) -> Result<Option<Self::Storage<E>>> {
        let _ = (nodes, ins);
        Ok(None)
    }
}

/// The tensors a fused expression reads: a tuple of one to six tensor
/// references with one element type and device, whose shapes broadcast.
pub trait Inputs {
    /// The element type.
    type Elem: Float;
    /// The device.
    type Dev: Device<Self::Elem>;
    /// The broadcast shape of the inputs: the result's shape.
    type Shape: Shape;
    /// The expression leaves handed to the closure: `(Arg<0>, Arg<1>, ...)`.
    type Args;

    /// The leaves.
    fn args() -> Self::Args;

    /// Runs `expr` over the inputs, fused unless `composed`.
    ///
    /// # Errors
    /// As [`try_fused`].
    fn run<X: Expr>(
        self,
        expr: X,
        composed: bool,
    ) -> Result<Tensor<Self::Shape, Self::Elem, Self::Dev>>;
}

macro_rules! inputs {
    ($shape:ty; $($s:ident $i:tt),+; where $($bound:tt)*) => {
        impl<'a, E: Float, D: Device<E>, $($s: Shape),+> Inputs for ($(&'a Tensor<$s, E, D>,)+)
        where
            $($bound)*
        {
            type Elem = E;
            type Dev = D;
            type Shape = $shape;
            type Args = ($(Arg<$i>,)+);

            fn args() -> Self::Args {
                ($(Arg::<$i>,)+)
            }

            fn run<X: Expr>(self, expr: X, composed: bool) -> Result<Tensor<$shape, E, D>> {
                $(self.0.same_device(NAME, self.$i)?;)+
                run(expr, [$(self.$i.raw()),+], [$(self.$i.var.clone()),+], composed)
            }
        }
    };
}

inputs!(A; A 0; where);
inputs!(<A as BroadcastShape<B>>::Output; A 0, B 1; where A: Broadcasts<B, op::fused_inputs>);
inputs!(
    <<A as BroadcastShape<B>>::Output as BroadcastShape<C>>::Output; A 0, B 1, C 2;
    where A: Broadcasts<B, op::fused_inputs>, <A as BroadcastShape<B>>::Output: Broadcasts<C, op::fused_inputs>
);
inputs!(
    <<<A as BroadcastShape<B>>::Output as BroadcastShape<C>>::Output as BroadcastShape<F>>::Output;
    A 0, B 1, C 2, F 3;
    where
        A: Broadcasts<B, op::fused_inputs>,
        <A as BroadcastShape<B>>::Output: Broadcasts<C, op::fused_inputs>,
        <<A as BroadcastShape<B>>::Output as BroadcastShape<C>>::Output: Broadcasts<F, op::fused_inputs>
);
/// The broadcast shape of four inputs' shapes.
type Out4<A, B, C, F> =
    <<<A as BroadcastShape<B>>::Output as BroadcastShape<C>>::Output as BroadcastShape<F>>::Output;
inputs!(
    <Out4<A, B, C, F> as BroadcastShape<G>>::Output;
    A 0, B 1, C 2, F 3, G 4;
    where
        A: Broadcasts<B, op::fused_inputs>,
        <A as BroadcastShape<B>>::Output: Broadcasts<C, op::fused_inputs>,
        <<A as BroadcastShape<B>>::Output as BroadcastShape<C>>::Output: Broadcasts<F, op::fused_inputs>,
        Out4<A, B, C, F>: Broadcasts<G, op::fused_inputs>
);
inputs!(
    <<Out4<A, B, C, F> as BroadcastShape<G>>::Output as BroadcastShape<H>>::Output;
    A 0, B 1, C 2, F 3, G 4, H 5;
    where
        A: Broadcasts<B, op::fused_inputs>,
        <A as BroadcastShape<B>>::Output: Broadcasts<C, op::fused_inputs>,
        <<A as BroadcastShape<B>>::Output as BroadcastShape<C>>::Output: Broadcasts<F, op::fused_inputs>,
        Out4<A, B, C, F>: Broadcasts<G, op::fused_inputs>,
        <Out4<A, B, C, F> as BroadcastShape<G>>::Output: Broadcasts<H, op::fused_inputs>
);

/// Evaluates the expression `f` builds over `inputs` in one pass: a new
/// tensor of the inputs' broadcast shape, recorded on the tape as one op
/// whose backward is also fused.
///
/// ```
/// use forma::prelude::*;
///
/// let x = Tensor::<(C<2>, C<3>)>::from_vec(vec![-1.0, 0.0, 1.0, 2.0, 3.0, 4.0], (C, C)).unwrap();
/// let w = Tensor::<(C<3>,)>::from_vec(vec![1.0, 2.0, 0.5], (C,)).unwrap();
/// let b = Tensor::<(C<3>,)>::from_vec(vec![0.0, 1.0, -1.0], (C,)).unwrap();
/// // One pass; the same numbers as `(&(&x * &w) + &b).relu()`.
/// let y = forma::fused((&x, &w, &b), |(x, w, b)| (x * w + b).relu());
/// assert_eq!(y.to_vec(), [0.0, 1.0, 0.0, 2.0, 7.0, 1.0]);
/// ```
///
/// # Panics
/// When `Dyn` sizes do not broadcast, or the inputs are on different
/// devices (see [`try_fused`]).
#[track_caller]
pub fn fused<I: Inputs, X: Expr>(
    inputs: I,
    f: impl FnOnce(I::Args) -> X,
) -> Tensor<I::Shape, I::Elem, I::Dev> {
    ok(try_fused(inputs, f))
}

/// [`fused`], returning an error instead of panicking.
///
/// # Errors
/// A [`crate::ShapeError`] when `Dyn` sizes do not broadcast or the inputs
/// are on different devices; a backend failure.
pub fn try_fused<I: Inputs, X: Expr>(
    inputs: I,
    f: impl FnOnce(I::Args) -> X,
) -> Result<Tensor<I::Shape, I::Elem, I::Dev>> {
    inputs.run(f(I::args()), false)
}

/// The same expression as [`fused`], run as composed ops: each op reads and
/// writes memory and rounds to the element type, like eager PyTorch. In f32
/// and f64 the result equals [`fused`]'s; in f16 and bf16 it is PyTorch
/// eager's rounding rather than a compiled kernel's.
///
/// # Errors
/// As [`try_fused`].
pub fn try_composed<I: Inputs, X: Expr>(
    inputs: I,
    f: impl FnOnce(I::Args) -> X,
) -> Result<Tensor<I::Shape, I::Elem, I::Dev>> {
    inputs.run(f(I::args()), true)
}

/// The broadcast sizes of all inputs.
fn out_dims<E: Float, D: Backend>(raws: &[Raw<E, D>]) -> Result<crate::shape::Dims> {
    let mut out = raws[0].layout.dims;
    for r in &raws[1..] {
        out = broadcast_dims(&out, &r.layout.dims).ok_or_else(|| {
            Error::shape(
                NAME,
                format!("a shape that broadcasts with {}", fmt_dims(&out)),
                &r.layout.dims,
            )
        })?;
    }
    Ok(out)
}

/// Runs `expr` over `raws` (fused, unless `composed` or the backend has no
/// kernel) and records its backward.
fn run<S: Shape, X: Expr, E: Float, D: Device<E>, const N: usize>(
    expr: X,
    raws: [Raw<E, D>; N],
    vars: [Option<Arc<Var<E, D>>>; N],
    composed: bool,
) -> Result<Tensor<S, E, D>> {
    let out = out_dims(&raws)?;
    crate::ops::binary::check_broadcast_type::<S>(NAME, &out)?;
    let vals = crate::graph::capturing().then(|| raws.each_ref().map(|r| r.val()));
    let dims = raws.each_ref().map(|r| r.layout.dims);
    let stretched = raws.map(|r| Raw {
        layout: r.layout.broadcast_to(&out),
        ..r
    });
    let device = stretched[0].device.clone();
    let fused = if composed {
        None
    } else {
        let guards = stretched.each_ref().map(|r| r.storage());
        let ins: [_; N] = std::array::from_fn(|i| (&*guards[i], &stretched[i].layout));
        device.fused(expr, ins)?
    };
    let y: Tensor<S, E, D> = match fused {
        Some(s) => Tensor::from_storage(s, &out, device),
        None => Tensor::from_raw(expr.compose(&stretched)?)?,
    };
    let need = vars.each_ref().map(Option::is_some);
    let saved = stretched.iter().map(Raw::saved).collect();
    Ok(y.record(NAME, &vars, saved, move |g: &Raw<E, D>| {
        let grads = backward(expr, &stretched, g, need, composed)?;
        grads
            .into_iter()
            .zip(&dims)
            .map(|(gi, d)| gi.map(|gi| sum_to(&gi, d)).transpose())
            .collect()
    })
    .noted(|| {
        let mut nodes = Vec::new();
        expr.graph(&mut nodes);
        let ins = vals.map(Vec::from).unwrap_or_default();
        (crate::graph::Op::Fused { nodes }, ins)
    }))
}

/// Each needed input's gradient over the output's sizes (a zero gradient
/// for an input the expression does not use).
fn backward<X: Expr, E: Float, D: Device<E>, const N: usize>(
    expr: X,
    x: &[Raw<E, D>; N],
    g: &Raw<E, D>,
    need: [bool; N],
    composed: bool,
) -> Result<Vec<Option<Raw<E, D>>>> {
    let mut grads: Vec<Option<Raw<E, D>>> = vec![None; N];
    let mut fallback = composed;
    if !composed {
        let guards = x.each_ref().map(|r| r.storage());
        let gs = g.storage();
        // Every entry past the inputs is the gradient.
        let mut ins = [(&*gs, &g.layout); 8];
        for i in 0..N {
            ins[i] = (&*guards[i], &x[i].layout);
        }
        for i in (0..N).filter(|&i| need[i]) {
            // The inputs, then the gradient: the first `N + 1` views (`N <= 6`).
            let s = match N {
                1 => g.device.fused_backward(expr, first::<_, 2>(&ins), i)?,
                2 => g.device.fused_backward(expr, first::<_, 3>(&ins), i)?,
                3 => g.device.fused_backward(expr, first::<_, 4>(&ins), i)?,
                4 => g.device.fused_backward(expr, first::<_, 5>(&ins), i)?,
                5 => g.device.fused_backward(expr, first::<_, 6>(&ins), i)?,
                6 => g.device.fused_backward(expr, first::<_, 7>(&ins), i)?,
                _ => unreachable!("fused expressions take at most six inputs"),
            };
            let Some(s) = s else {
                fallback = true;
                break;
            };
            grads[i] = Some(Raw::new(s, &g.layout.dims, g.device.clone()));
        }
    }
    if fallback {
        grads = vec![None; N];
        expr.compose_grad(x, g.clone(), &mut grads)?;
    }
    for i in 0..N {
        if !need[i] {
            grads[i] = None;
        } else if grads[i].is_none() {
            // The expression does not read this input.
            let zeros = g.device.full(g.layout.numel(), E::zero())?;
            grads[i] = Some(Raw::new(zeros, &g.layout.dims, g.device.clone()));
        }
    }
    Ok(grads)
}

/// The first `M` entries of `ins`.
fn first<T: Copy, const M: usize>(ins: &[T; 8]) -> [T; M] {
    std::array::from_fn(|i| ins[i])
}
