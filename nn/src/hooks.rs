//! Module forward hooks, like PyTorch's `register_forward_pre_hook` and
//! `register_forward_hook`: a function that sees, and may replace, the input
//! or the output of the module at a path each time it runs as a named child
//! ([`Forward::try_forward_as`](crate::Forward::try_forward_as), the
//! [`child!`](crate::child) macro, `#[derive(Sequential)]`'s steps and the
//! built-in composite layers).
//!
//! A hook is keyed by a module path in `state_dict` names
//! (`encoder.layer.3.attention`), where a `*` step matches any one step
//! (`encoder.layer.*`), and by the type of what it sees: a hook registered
//! for a path whose module takes (or returns) another type makes that
//! forward fail with an error naming both types, rather than being skipped.
//! Hooks are kept per process, not per model value: while registered, a
//! hook runs for the module at its path in every model run on any thread.
//! Several hooks on one path run in the order they were registered, each
//! seeing what the one before returned. [`HookHandle::remove`] unregisters.
//!
//! Activation statistics, the classic use:
//!
//! ```
//! use forma::prelude::*;
//! use forma::nn::{hooks, layers::{Linear, Relu}};
//! use std::sync::{Arc, Mutex};
//!
//! #[derive(Module, Sequential)]
//! #[sequential(input = [Dyn, 4], output = [Dyn, 2])]
//! struct Mlp { fc1: Linear<4, 8>, act: Relu, fc2: Linear<8, 2> }
//!
//! let mut rng = Rng::seed_from(0);
//! let mlp = Mlp { fc1: Linear::new(&Cpu, &mut rng), act: Relu, fc2: Linear::new(&Cpu, &mut rng) };
//! let means = Arc::new(Mutex::new(Vec::new()));
//! let seen = means.clone();
//! let handle = hooks::register_forward_hook("act", move |path, y: &Tensor![Dyn, 8]| {
//!     seen.lock().unwrap().push((path.to_string(), y.mean_all().item()));
//!     None // keep the output
//! });
//! let x = Tensor::<(Dyn, C<4>)>::randn((Dyn(3), C), &mut rng);
//! mlp.forward(x.clone());
//! handle.remove();
//! mlp.forward(x);
//! let means = means.lock().unwrap();
//! assert_eq!(means.len(), 1);
//! assert_eq!(means[0].0, "act");
//! assert!(means[0].1 >= 0.0); // after a ReLU
//! ```

use forma_core::tape::HookHandle;
use forma_core::{Error, Result};
use std::any::{type_name, Any, TypeId};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

type Erased = Arc<dyn Fn(&str, &dyn Any) -> Option<Box<dyn Any>> + Send + Sync>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pre,
    Post,
}

#[derive(Clone)]
struct Entry {
    id: u64,
    kind: Kind,
    pattern: String,
    ty: TypeId,
    ty_name: &'static str,
    hook: Erased,
}

static HOOKS: RwLock<Vec<Entry>> = RwLock::new(Vec::new());
/// How many hooks are registered: the one load a forward pays when none is.
static COUNT: AtomicUsize = AtomicUsize::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Whether any module hook is registered.
pub(crate) fn any() -> bool {
    COUNT.load(Ordering::Relaxed) != 0
}

fn matches(pattern: &str, path: &str) -> bool {
    let mut p = pattern.split('.');
    let mut q = path.split('.');
    loop {
        match (p.next(), q.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == "*" || a == b => {}
            _ => return false,
        }
    }
}

fn register<T: 'static>(
    kind: Kind,
    pattern: &str,
    hook: impl Fn(&str, &T) -> Option<T> + Send + Sync + 'static,
) -> HookHandle {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let erased: Erased = Arc::new(move |path: &str, value: &dyn Any| {
        let value = value.downcast_ref::<T>()?;
        hook(path, value).map(|v| Box::new(v) as Box<dyn Any>)
    });
    let entry = Entry {
        id,
        kind,
        pattern: pattern.to_string(),
        ty: TypeId::of::<T>(),
        ty_name: type_name::<T>(),
        hook: erased,
    };
    HOOKS.write().unwrap_or_else(|e| e.into_inner()).push(entry);
    COUNT.fetch_add(1, Ordering::Relaxed);
    HookHandle::from_remove(move || {
        let mut hooks = HOOKS.write().unwrap_or_else(|e| e.into_inner());
        let before = hooks.len();
        hooks.retain(|e| e.id != id);
        COUNT.fetch_sub(before - hooks.len(), Ordering::Relaxed);
    })
}

/// Registers `hook` to run before the forward of the module at `path`, like
/// `register_forward_pre_hook`: it sees the input, and a `Some` it returns
/// replaces it. See the [module docs](self).
pub fn register_forward_pre_hook<X: 'static>(
    path: &str,
    hook: impl Fn(&str, &X) -> Option<X> + Send + Sync + 'static,
) -> HookHandle {
    register(Kind::Pre, path, hook)
}

/// Registers `hook` to run after the forward of the module at `path`, like
/// `register_forward_hook`: it sees the output, and a `Some` it returns
/// replaces it. See the [module docs](self).
pub fn register_forward_hook<Y: 'static>(
    path: &str,
    hook: impl Fn(&str, &Y) -> Option<Y> + Send + Sync + 'static,
) -> HookHandle {
    register(Kind::Post, path, hook)
}

fn run<T: 'static>(kind: Kind, path: &str, mut value: T) -> Result<T> {
    let hooks: Vec<Entry> = HOOKS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|e| e.kind == kind && matches(&e.pattern, path))
        .cloned()
        .collect();
    for e in hooks {
        if e.ty != TypeId::of::<T>() {
            let (op, what) = match kind {
                Kind::Pre => ("forward_pre_hook", "takes"),
                Kind::Post => ("forward_hook", "returns"),
            };
            return Err(Error::invalid(
                op,
                format!(
                    "the hook registered for `{}` sees a `{}`, but the module at `{path}` {what} a `{}`",
                    e.pattern,
                    e.ty_name,
                    type_name::<T>()
                ),
            ));
        }
        if let Some(new) = (e.hook)(path, &value) {
            match new.downcast::<T>() {
                Ok(v) => value = *v,
                Err(_) => unreachable!("the hook's type was checked"),
            }
        }
    }
    Ok(value)
}

pub(crate) fn run_pre<X: 'static>(path: &str, x: X) -> Result<X> {
    run(Kind::Pre, path, x)
}

pub(crate) fn run_post<Y: 'static>(path: &str, y: Y) -> Result<Y> {
    run(Kind::Post, path, y)
}
