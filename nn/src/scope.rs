//! The path of the module whose forward is running, for errors and hooks.
//!
//! A model runs a child as a named child ([`Forward::try_forward_as`], or
//! the [`child!`](crate::child) macro, which takes the name `state_dict`
//! gives the field); while it runs, its name is on a per-thread stack. An
//! error the child returns is wrapped once, at the innermost named child, in
//! [`Error::InModule`] with the dotted path
//! (`encoder.layer.3.attention.self: matmul: ...`), and the forward hooks
//! registered for that path ([`crate::hooks`]) run around it.
//!
//! What it costs when nothing fails and no hook is registered: a push and a
//! pop on a thread-local vector, and one relaxed atomic load, per named
//! child; the path is joined into a string only when an error is raised or
//! a hook is registered.

use crate::{hooks, Forward};
use forma_core::{Error, Result};
use std::cell::RefCell;
use std::fmt::{self, Write as _};

/// One step of a module path: a field name (its `state_dict` key) or an
/// index in a list of modules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// A field, by its `state_dict` key; `""` (a flattened field) adds no step.
    Name(&'static str),
    /// A position in a list (`layer.3`).
    Index(usize),
    /// A name made at run time.
    Owned(String),
}

impl From<&'static str> for Segment {
    fn from(name: &'static str) -> Self {
        Segment::Name(name)
    }
}

impl From<usize> for Segment {
    fn from(index: usize) -> Self {
        Segment::Index(index)
    }
}

impl From<String> for Segment {
    fn from(name: String) -> Self {
        Segment::Owned(name)
    }
}

impl fmt::Display for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Segment::Name(n) => f.write_str(n),
            Segment::Index(i) => write!(f, "{i}"),
            Segment::Owned(n) => f.write_str(n),
        }
    }
}

impl Segment {
    fn is_empty(&self) -> bool {
        match self {
            Segment::Name(n) => n.is_empty(),
            Segment::Owned(n) => n.is_empty(),
            Segment::Index(_) => false,
        }
    }
}

thread_local! {
    static PATH: RefCell<Vec<Segment>> = const { RefCell::new(Vec::new()) };
}

/// Pops the segment it pushed, also when the child panics.
struct Entered;

impl Drop for Entered {
    fn drop(&mut self) {
        PATH.with(|p| {
            p.borrow_mut().pop();
        });
    }
}

fn enter(segment: Segment) -> Entered {
    PATH.with(|p| p.borrow_mut().push(segment));
    Entered
}

/// The dotted path of the module running now on this thread (`""` outside
/// any named child).
pub fn current_path() -> String {
    PATH.with(|p| {
        let p = p.borrow();
        let mut out = String::new();
        for s in p.iter().filter(|s| !s.is_empty()) {
            if !out.is_empty() {
                out.push('.');
            }
            // Writing to a String cannot fail.
            let _ = write!(out, "{s}");
        }
        out
    })
}

/// `e` with the current path, unless it already has one or there is none.
fn attach(e: Error) -> Error {
    if e.module_path().is_some() {
        return e;
    }
    let path = current_path();
    if path.is_empty() {
        e
    } else {
        e.in_module(|| path)
    }
}

/// Runs `f` as the child `name` of the module now running: for a child
/// called through a method of its own (`try_forward_with`) rather than
/// [`Forward`]. An error `f` returns carries the path; module hooks do not
/// run (they see [`Forward`] calls).
///
/// # Errors
/// What `f` returns, with the path.
pub fn run<T>(name: impl Into<Segment>, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let _entered = enter(name.into());
    f().map_err(attach)
}

/// [`Forward::try_forward_as`].
pub(crate) fn forward_child<M, X, Y>(m: &M, name: Segment, x: X) -> Result<Y>
where
    M: Forward<X, Y>,
    X: 'static,
    Y: 'static,
{
    let _entered = enter(name);
    let run = || {
        if !hooks::any() {
            return m.try_forward(x);
        }
        let path = current_path();
        let x = hooks::run_pre(&path, x)?;
        let y = m.try_forward(x)?;
        hooks::run_post(&path, y)
    };
    run().map_err(attach)
}

/// Runs `$self.$field`'s forward on `$x` as a named child, with the name
/// `state_dict` gives the field (its `rename`, if any); `$self.$field[$i]`
/// names an element of a list field (`layer.3`). Returns the child's
/// `Result`: see [`Forward::try_forward_as`].
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{child, layers::{Linear, Relu}};
///
/// #[derive(Module)]
/// struct Mlp { fc1: Linear<4, 8>, act: Relu, fc2: Linear<8, 2> }
///
/// impl Forward<Tensor![Dyn, 4], Tensor![Dyn, 2]> for Mlp {
///     fn try_forward(&self, x: Tensor![Dyn, 4]) -> forma::Result<Tensor![Dyn, 2]> {
///         let h = child!(self.fc1, x)?;
///         let h = child!(self.act, h)?;
///         child!(self.fc2, h)
///     }
/// }
/// # let mut rng = Rng::seed_from(0);
/// # let mlp = Mlp { fc1: Linear::new(&Cpu, &mut rng), act: Relu, fc2: Linear::new(&Cpu, &mut rng) };
/// # assert_eq!(mlp.forward(Tensor::zeros_with((Dyn(3), C))).dims().to_vec(), [3, 2]);
/// ```
#[macro_export]
macro_rules! child {
    ($self:ident . $field:tt [$i:expr], $x:expr $(,)?) => {{
        let __index: usize = $i;
        $crate::scope::run(
            <Self as $crate::Module>::child_name(::core::stringify!($field)),
            || $crate::Forward::try_forward_as(&$self.$field[__index], __index, $x),
        )
    }};
    ($self:ident . $field:tt, $x:expr $(,)?) => {
        $crate::Forward::try_forward_as(
            &$self.$field,
            <Self as $crate::Module>::child_name(::core::stringify!($field)),
            $x,
        )
    };
}
