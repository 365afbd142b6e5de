//! An update rule run as composed ops: [`Composed`] is a [`Lane`] whose
//! values are whole tensors, so the rule written once for one element
//! (`UpdateOp::apply`) also runs op by op over tensors, each op a kernel
//! that reads and writes memory and rounds to the element type, as eager
//! PyTorch's single-tensor optimizers do. Backends without a fused update
//! kernel (CUDA), views that are not dense, and half types (whose optimizers
//! round after every op in PyTorch) take this path.
//!
//! Constants stay scalars: `x * R::c(k)` runs the `mul_scalar` row, `x +
//! R::c(k)` `add_scalar`, `x / R::c(k)` `div_scalar`, with the same cast of
//! `k` as the fused pass, so in f32 and f64 the two paths give the same bits.

use super::{Lane, UpdateOp};
use crate::device::Device;
use crate::dtype::{Float, Real};
use crate::error::Result;
use crate::ops::binary::{raw_binary as binary, Add, BinaryOp, Div, Maximum, Mul, Sub};
use crate::ops::unary::{AddScalar, DivScalar, MulScalar, Neg, Sqrt, UnaryOp};
use crate::tape::Raw;
use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;

/// One value of a composed update: a tensor, or a constant not yet applied.
#[derive(Debug)]
pub(crate) enum Value<E: Float, D: Device<E>> {
    /// A constant (`R::c(v)`).
    Const(f64),
    /// A tensor of the operands' sizes.
    Tensor(Raw<E, D>),
}

impl<E: Float, D: Device<E>> Clone for Value<E, D> {
    fn clone(&self) -> Self {
        match self {
            Value::Const(v) => Value::Const(*v),
            Value::Tensor(r) => Value::Tensor(r.clone()),
        }
    }
}

/// The values of the running rule, addressed by [`Composed`] handles, and
/// the first error an op raised (later ops are skipped).
struct Arena<E: Float, D: Device<E>> {
    vals: Vec<Value<E, D>>,
    err: Option<crate::Error>,
}

thread_local! {
    /// The arena of the composed update running on this thread, if any.
    static ARENA: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// A tensor-valued [`Lane`]: a handle to a value of the composed update
/// running on this thread. Handles are `Copy`, as the per-element rule's
/// values are, which a tensor is not; they exist only inside
/// [`UpdateOp::apply`] called by `run`.
#[derive(Debug)]
pub struct Composed<E, D> {
    id: usize,
    _t: PhantomData<fn() -> (E, D)>,
}

impl<E, D> Clone for Composed<E, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E, D> Copy for Composed<E, D> {}

/// Runs `f` on this thread's arena.
///
/// # Panics
/// When no composed update runs on this thread: a handle was kept past
/// the `apply` call it was given to.
fn with<E: Float, D: Device<E>, T>(f: impl FnOnce(&mut Arena<E, D>) -> T) -> T {
    ARENA.with(|a| {
        let mut a = a.borrow_mut();
        let arena = a
            .as_mut()
            .and_then(|b| b.downcast_mut::<Arena<E, D>>())
            .expect("a composed update value used outside its update");
        f(arena)
    })
}

/// A constant folded in the accumulation type, as the fused pass computes it.
fn acc<E: Float>(v: f64) -> E::Acc {
    <E::Acc as Real>::c(v)
}

fn to_f64<R: Real>(v: R) -> f64 {
    v.to_f64().unwrap_or(f64::NAN)
}

/// `op(x)` over a tensor.
fn unary<Op: UnaryOp, E: Float, D: Device<E>>(op: Op, x: &Raw<E, D>) -> Result<Raw<E, D>> {
    let s = x.device.unary(op, &x.storage(), &x.layout)?;
    Ok(Raw::new(s, &x.layout.dims, x.device.clone()))
}

/// A tensor of `like`'s sizes holding `v` (a constant on the side of an op
/// that has no scalar form).
fn full<E: Float, D: Device<E>>(like: &Raw<E, D>, v: f64) -> Result<Raw<E, D>> {
    let n = like.layout.numel();
    let s = like.device.full(n, E::from_f64(v))?;
    Ok(Raw::new(s, &like.layout.dims, like.device.clone()))
}

impl<E: Float, D: Device<E>> Composed<E, D> {
    /// A new value computed from the arena's values (skipped after an error).
    fn push(f: impl FnOnce(&[Value<E, D>]) -> Result<Value<E, D>>) -> Self {
        with::<E, D, _>(|a| {
            let v = if a.err.is_some() {
                Value::Const(0.0)
            } else {
                f(&a.vals).unwrap_or_else(|e| {
                    a.err = Some(e);
                    Value::Const(0.0)
                })
            };
            a.vals.push(v);
            Composed {
                id: a.vals.len() - 1,
                _t: PhantomData,
            }
        })
    }

    /// `op(self)`: the row's kernel on a tensor, its function on a constant.
    fn unary_op(self, op: impl UnaryOp) -> Self {
        Self::push(|v| {
            Ok(match &v[self.id] {
                Value::Const(c) => Value::Const(to_f64(op.f(acc::<E>(*c)))),
                Value::Tensor(x) => Value::Tensor(unary(op, x)?),
            })
        })
    }

    /// `op(self, rhs)`, with `scalar` the op's scalar forms: given the
    /// constant and whether it is on the left, a closure over the tensor
    /// (`None`: no scalar form, the constant becomes a tensor).
    #[allow(clippy::type_complexity)] // a closure returning a closure
    fn binary_op<Op: BinaryOp>(
        self,
        rhs: Self,
        op: Op,
        scalar: impl FnOnce(f64, bool) -> Option<Box<dyn FnOnce(&Raw<E, D>) -> Result<Raw<E, D>>>>,
    ) -> Self {
        Self::push(|v| {
            Ok(match (&v[self.id], &v[rhs.id]) {
                (Value::Const(a), Value::Const(b)) => {
                    Value::Const(to_f64(op.f(acc::<E>(*a), acc::<E>(*b))))
                }
                (Value::Tensor(a), Value::Tensor(b)) => Value::Tensor(binary(op, a, b)?),
                (Value::Tensor(x), Value::Const(c)) => Value::Tensor(match scalar(*c, false) {
                    Some(f) => f(x)?,
                    None => binary(op, x, &full(x, *c)?)?,
                }),
                (Value::Const(c), Value::Tensor(x)) => Value::Tensor(match scalar(*c, true) {
                    Some(f) => f(x)?,
                    None => binary(op, &full(x, *c)?, x)?,
                }),
            })
        })
    }
}

/// The scalar form `x -> op(x)` of a unary row.
fn with_scalar<E: Float, D: Device<E>, Op: UnaryOp>(
    op: Op,
) -> Option<Box<dyn FnOnce(&Raw<E, D>) -> Result<Raw<E, D>>>> {
    Some(Box::new(move |x| unary(op, x)))
}

impl<E: Float, D: Device<E>> std::ops::Add for Composed<E, D> {
    type Output = Self;
    fn add(self, rhs: Self) -> Self {
        self.binary_op(rhs, Add, |value, _| with_scalar(AddScalar { value }))
    }
}

impl<E: Float, D: Device<E>> std::ops::Sub for Composed<E, D> {
    type Output = Self;
    fn sub(self, rhs: Self) -> Self {
        self.binary_op(rhs, Sub, |value, left| {
            if left {
                // `k - x` is `(-x) + k`, one rounding as the fused pass.
                Some(Box::new(move |x| {
                    unary(AddScalar { value }, &unary(Neg {}, x)?)
                }))
            } else {
                with_scalar(AddScalar { value: -value })
            }
        })
    }
}

impl<E: Float, D: Device<E>> std::ops::Mul for Composed<E, D> {
    type Output = Self;
    fn mul(self, rhs: Self) -> Self {
        self.binary_op(rhs, Mul, |value, _| with_scalar(MulScalar { value }))
    }
}

impl<E: Float, D: Device<E>> std::ops::Div for Composed<E, D> {
    type Output = Self;
    fn div(self, rhs: Self) -> Self {
        self.binary_op(rhs, Div, |value, left| {
            (!left).then(|| -> Box<dyn FnOnce(&Raw<E, D>) -> Result<Raw<E, D>>> {
                Box::new(move |x| unary(DivScalar { value }, x))
            })
        })
    }
}

impl<E: Float, D: Device<E>> std::ops::Neg for Composed<E, D> {
    type Output = Self;
    fn neg(self) -> Self {
        self.unary_op(Neg {})
    }
}

impl<E: Float, D: Device<E>> Lane for Composed<E, D> {
    fn c(v: f64) -> Self {
        Self::push(|_| Ok(Value::Const(v)))
    }

    fn sqrt(self) -> Self {
        self.unary_op(Sqrt {})
    }

    fn maximum(self, other: Self) -> Self {
        self.binary_op(other, Maximum, |_, _| None)
    }
}

/// Runs `op` as composed ops on `grad` and `state`: the new value of each
/// state tensor, or `None` for one the rule left as it was.
///
/// # Errors
/// The first error an op raised (a backend failure).
pub(crate) fn run<const N: usize, Op: UpdateOp<N>, E: Float, D: Device<E>>(
    op: Op,
    grad: Raw<E, D>,
    state: [Raw<E, D>; N],
) -> Result<[Option<Value<E, D>>; N]> {
    let mut vals = Vec::with_capacity(4 * (N + 1));
    vals.push(Value::Tensor(grad));
    vals.extend(state.into_iter().map(Value::Tensor));
    let arena: Box<dyn Any> = Box::new(Arena::<E, D> { vals, err: None });
    ARENA.with(|a| *a.borrow_mut() = Some(arena));
    // Leaves: the gradient is value 0, `state[k]` is value `k + 1`.
    let handle = |id| Composed::<E, D> {
        id,
        _t: PhantomData,
    };
    let g = handle(0);
    let mut lanes: [Composed<E, D>; N] = std::array::from_fn(|k| handle(k + 1));
    // The arena is taken back even if the rule panics, so that a later
    // update on this thread starts clean.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            ARENA.with(|a| *a.borrow_mut() = None);
        }
    }
    let reset = Reset;
    op.apply(g, &mut lanes);
    let arena = ARENA
        .with(|a| a.borrow_mut().take())
        .and_then(|b| b.downcast::<Arena<E, D>>().ok())
        .expect("the arena set above");
    drop(reset);
    if let Some(e) = arena.err {
        return Err(e);
    }
    Ok(std::array::from_fn(|k| {
        let id = lanes[k].id;
        (id != k + 1).then(|| arena.vals[id].clone())
    }))
}
