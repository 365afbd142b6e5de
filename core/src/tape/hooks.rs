//! Gradient hooks, PyTorch's `Tensor.register_hook` and
//! `Tensor.register_post_accumulate_grad_hook`.
//!
//! A **gradient hook** sees the gradient with respect to its tensor once
//! backward has summed every contribution to it, and may replace it (for a
//! leaf, before it is accumulated into `grad()`; for an intermediate tensor,
//! before it flows on to the op's inputs and before `retain_grad` keeps it).
//! Hooks run in the order they were registered, each seeing the previous
//! one's result.
//!
//! A **post-accumulate-grad hook** runs on a leaf (a parameter) right after
//! this backward has accumulated its gradient, with the parameter itself, so
//! it can read `grad()` or replace it with `try_set_grad`: leaves are
//! reported as they become ready, the last used in the forward first, which
//! is how data-parallel training starts reducing a gradient while backward
//! still runs.
//!
//! Each registration returns a [`HookHandle`]; [`HookHandle::remove`]
//! unregisters it (dropping the handle keeps the hook, as in PyTorch).
//!
//! ```
//! use forma::prelude::*;
//! use std::sync::{Arc, Mutex};
//!
//! let w = Tensor::<(C<3>,)>::from_vec(vec![1., 2., 3.], (C,)).unwrap().requires_grad();
//! // Log the gradient's norm, and halve it.
//! let norms = Arc::new(Mutex::new(vec![]));
//! let log = Arc::clone(&norms);
//! let handle = w.register_hook(move |g| {
//!     log.lock().unwrap().push(g.square().sum_all().item().sqrt());
//!     Some(g.mul_scalar(0.5))
//! });
//! (&w * &w).sum_all().backward(); // d/dw = 2w
//! assert_eq!(w.grad().unwrap().to_vec(), [1., 2., 3.]);
//! assert_eq!(norms.lock().unwrap().len(), 1);
//! handle.remove();
//! w.zero_grad();
//! (&w * &w).sum_all().backward();
//! assert_eq!(w.grad().unwrap().to_vec(), [2., 4., 6.]);
//! ```

use super::{Raw, Var};
use crate::device::Backend;
use crate::dtype::Dtype;
use crate::error::{fmt_dims, Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use std::sync::{Arc, Weak};

/// A gradient hook on erased tensors: `Some` replaces the gradient.
pub(crate) type GradHook<E, D> = Arc<dyn Fn(&Raw<E, D>) -> Result<Option<Raw<E, D>>> + Send + Sync>;
/// A post-accumulate hook, given the leaf's variable.
pub(crate) type PostHook<E, D> = Arc<dyn Fn(&Arc<Var<E, D>>) -> Result<()> + Send + Sync>;

/// The hooks registered on one variable, each with its id.
pub(crate) struct VarHooks<E: Dtype, D: Backend> {
    next: u64,
    pub(crate) grad: Vec<(u64, GradHook<E, D>)>,
    pub(crate) post: Vec<(u64, PostHook<E, D>)>,
}

impl<E: Dtype, D: Backend> Default for VarHooks<E, D> {
    fn default() -> Self {
        VarHooks {
            next: 0,
            grad: Vec::new(),
            post: Vec::new(),
        }
    }
}

impl<E: Dtype, D: Backend> VarHooks<E, D> {
    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

/// Unregisters a hook: see [`HookHandle::remove`].
pub struct HookHandle {
    remove: Box<dyn FnOnce() + Send + Sync>,
}

impl std::fmt::Debug for HookHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookHandle")
    }
}

impl HookHandle {
    /// Removes the hook, like `handle.remove()`; later backwards skip it.
    pub fn remove(self) {
        (self.remove)()
    }

    /// A handle whose `remove` runs `remove`: how hooks kept elsewhere (a
    /// module's forward hooks) hand out the same handle type.
    pub fn from_remove(remove: impl FnOnce() + Send + Sync + 'static) -> Self {
        HookHandle {
            remove: Box::new(remove),
        }
    }

    fn new<E: Dtype, D: Backend>(var: &Arc<Var<E, D>>, id: u64) -> Self {
        let weak: Weak<Var<E, D>> = Arc::downgrade(var);
        HookHandle {
            remove: Box::new(move || {
                if let Some(v) = weak.upgrade() {
                    let mut h = v.hooks();
                    h.grad.retain(|(i, _)| *i != id);
                    h.post.retain(|(i, _)| *i != id);
                }
            }),
        }
    }
}

impl<S: Shape, E: Dtype, D: Backend> Tensor<S, E, D> {
    fn hook_var(&self, op: &'static str) -> Result<&Arc<Var<E, D>>> {
        self.var.as_ref().ok_or_else(|| {
            Error::invalid(
                op,
                "cannot register a hook on a tensor that does not require a gradient",
            )
        })
    }

    /// Registers `hook` on the gradient with respect to this tensor, like
    /// `tensor.register_hook(hook)`: it runs during each backward that reaches
    /// this tensor, with the summed gradient, and a `Some` it returns replaces
    /// that gradient (same sizes). See the [module docs](self).
    ///
    /// # Errors
    /// When this tensor does not require a gradient.
    pub fn try_register_hook(
        &self,
        hook: impl Fn(&Tensor<S, E, D>) -> Option<Tensor<S, E, D>> + Send + Sync + 'static,
    ) -> Result<HookHandle> {
        let var = self.hook_var("register_hook")?;
        let erased: GradHook<E, D> = Arc::new(move |g: &Raw<E, D>| {
            let t = Tensor::<S, E, D>::from_raw(g.clone())?;
            let Some(new) = hook(&t) else {
                return Ok(None);
            };
            if new.layout.dims != g.layout.dims {
                return Err(Error::shape(
                    "register_hook",
                    format!("a gradient of {}", fmt_dims(&g.layout.dims)),
                    &new.layout.dims,
                ));
            }
            Ok(Some(new.raw()))
        });
        let mut h = var.hooks();
        let id = h.id();
        h.grad.push((id, erased));
        Ok(HookHandle::new(var, id))
    }

    /// [`Tensor::try_register_hook`] that panics when this tensor does not
    /// require a gradient.
    #[track_caller]
    pub fn register_hook(
        &self,
        hook: impl Fn(&Tensor<S, E, D>) -> Option<Tensor<S, E, D>> + Send + Sync + 'static,
    ) -> HookHandle {
        crate::tensor::ok(self.try_register_hook(hook))
    }

    /// Registers `hook` to run on this leaf once a backward has accumulated
    /// its gradient, like `tensor.register_post_accumulate_grad_hook(hook)`:
    /// it gets the leaf itself (read `grad()`, or replace it with
    /// `try_set_grad`). See the [module docs](self).
    ///
    /// ```
    /// use forma::prelude::*;
    /// use std::sync::{Arc, Mutex};
    ///
    /// let a = Tensor::<(C<2>,)>::ones().requires_grad();
    /// let b = Tensor::<(C<2>,)>::ones().requires_grad();
    /// let ready = Arc::new(Mutex::new(vec![]));
    /// for (name, p) in [("a", &a), ("b", &b)] {
    ///     let ready = Arc::clone(&ready);
    ///     p.register_post_accumulate_grad_hook(move |p| {
    ///         ready.lock().unwrap().push((name, p.grad().unwrap().to_vec()));
    ///     });
    /// }
    /// // b is used last in the forward, so its gradient is ready first.
    /// a.mul_scalar(2.0).exp().mul(&b).sum_all().backward();
    /// let ready = ready.lock().unwrap();
    /// assert_eq!(ready[0].0, "b");
    /// assert_eq!(ready[1].0, "a");
    /// ```
    ///
    /// # Errors
    /// When this tensor is not a leaf that requires a gradient.
    pub fn try_register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor<S, E, D>) + Send + Sync + 'static,
    ) -> Result<HookHandle> {
        let var = self.hook_var("register_post_accumulate_grad_hook")?;
        if !var.is_leaf() {
            return Err(Error::invalid(
                "register_post_accumulate_grad_hook",
                "post-accumulate-grad hooks can only be registered on leaf tensors",
            ));
        }
        // The hook holds the storage but not the variable (that would be a
        // cycle through the variable's own hook list); backward hands the
        // variable back when it calls it.
        let base = self.detach();
        let erased: PostHook<E, D> = Arc::new(move |v: &Arc<Var<E, D>>| {
            let p = Tensor {
                var: Some(Arc::clone(v)),
                ..base.clone()
            };
            hook(&p);
            Ok(())
        });
        let mut h = var.hooks();
        let id = h.id();
        h.post.push((id, erased));
        Ok(HookHandle::new(var, id))
    }

    /// [`Tensor::try_register_post_accumulate_grad_hook`] that panics when
    /// this tensor is not a leaf that requires a gradient.
    #[track_caller]
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor<S, E, D>) + Send + Sync + 'static,
    ) -> HookHandle {
        crate::tensor::ok(self.try_register_post_accumulate_grad_hook(hook))
    }
}
