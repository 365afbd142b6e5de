//! The tape: reverse-mode automatic differentiation with PyTorch's semantics.
//!
//! **Where the tape lives.** There is no global tape. A tensor that requires a
//! gradient carries a [`Var`]: a leaf (a parameter, made with
//! [`Tensor::requires_grad`]) or the output of a recorded op, whose [`Node`]
//! points at the `Var`s of the op's inputs and owns the op's backward closure
//! (with the activations it saved). The graph is therefore exactly the ops that
//! ran on tensors requiring gradients, and it is freed by reference counting
//! when the last tensor of a step is dropped — nothing grows across steps.
//!
//! **How a parameter finds its gradient.** Clones and views of a leaf share its
//! `Var`, so the tensor held by a module and the one used in `forward` are the
//! same variable: after `loss.backward()`, `param.grad()` returns the
//! accumulated gradient until `param.zero_grad()`.
//!
//! `backward()` runs each node's closure once and drops it, freeing the saved
//! activations; a second backward through the same graph is an error unless
//! the first used [`Tensor::backward_retain`]. Recording stops under a
//! [`no_grad`] guard. [`set_anomaly_detection`] makes backward (and recording
//! ops on this thread) name the first op that produced a NaN or an infinity.

mod gradcheck;
mod graph;
pub mod hooks;
mod raw;
pub mod util;

pub use gradcheck::{gradcheck, GradcheckOptions};
pub use graph::{
    anomaly_detection, backward_raw, float_grad_ops, is_grad_enabled, live_nodes, live_saved,
    no_grad, queue_callback, set_anomaly_detection, FloatOps, GradOps, NoGradGuard, Node, Saved,
    Var,
};
pub use hooks::HookHandle;
pub use raw::Raw;

use crate::device::Backend;
use crate::device::Device;
use crate::dtype::{Dtype, Float};
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::{ok, Tensor};
use std::sync::Arc;

/// The closure a recorded op leaves on the tape: from the gradient of its
/// output, the gradients of its inputs (`None` for an input that needs none).
pub type BackwardFn<E, D> = Box<dyn Fn(&Raw<E, D>) -> Result<Vec<Option<Raw<E, D>>>> + Send>;

impl<S: Shape, E: Float, D: Device<E>> Tensor<S, E, D> {
    /// Marks this tensor as a leaf that accumulates a gradient, like
    /// `tensor.requires_grad_()`. Clones share the leaf.
    pub fn requires_grad(mut self) -> Self {
        if self.var.as_ref().is_none_or(|v| !v.is_leaf()) {
            self.var = Some(Arc::new(Var::leaf(&FloatOps)));
        }
        self
    }
}

impl<S: Shape, E: Dtype, D: Backend> Tensor<S, E, D> {
    /// Whether gradients flow to (or through) this tensor.
    pub fn needs_grad(&self) -> bool {
        self.var.is_some()
    }

    /// This tensor's autograd variable (`None` when it needs no gradient): an
    /// input to pass to [`Tensor::record`] when an op outside this crate
    /// records its own backward (e.g. a loss with PyTorch's fused gradient).
    pub fn tape_var(&self) -> Option<Arc<Var<E, D>>> {
        self.var.clone()
    }

    /// Whether this tensor is a leaf of the graph (a parameter or a constant).
    pub fn is_leaf(&self) -> bool {
        self.var.as_ref().is_none_or(|v| v.is_leaf())
    }

    /// The same values cut from the graph, like `tensor.detach()` (shares storage).
    pub fn detach(&self) -> Self {
        Tensor {
            var: None,
            ..self.clone()
        }
    }

    /// The accumulated gradient of a leaf (or of a tensor that called
    /// [`Tensor::retain_grad`]), like `tensor.grad`.
    pub fn grad(&self) -> Option<Self> {
        let raw = self.var.as_ref()?.grad()?;
        Some(Tensor::from_raw(raw).expect("a gradient has its tensor's sizes"))
    }

    /// Clears the accumulated gradient, like `tensor.grad = None`.
    pub fn zero_grad(&self) {
        if let Some(v) = &self.var {
            v.clear_grad();
        }
    }

    /// Replaces the accumulated gradient, like `tensor.grad = grad` under
    /// no-grad: how gradient clipping (`forma::nn::optim::clip_grad_norm_`)
    /// rewrites a gradient between `backward` and the optimizer's step.
    /// Write a changed gradient back with this rather than assigning into the
    /// tensor [`Tensor::grad`] returns: backward may share that storage with
    /// other tensors' gradients. The next backward accumulates onto the new
    /// gradient.
    ///
    /// # Errors
    /// When this tensor does not require a gradient, or when `grad`'s sizes
    /// differ from this tensor's (a `Dyn` size).
    pub fn try_set_grad(&self, grad: &Self) -> Result<()> {
        let var = self.var.as_ref().ok_or_else(|| {
            Error::invalid(
                "set_grad",
                "this tensor does not require a gradient (mark it with `requires_grad`)",
            )
        })?;
        if grad.layout.dims != self.layout.dims {
            return Err(Error::shape(
                "set_grad",
                crate::error::fmt_dims(&self.layout.dims),
                &grad.layout.dims,
            ));
        }
        var.set_grad(grad.raw());
        Ok(())
    }

    /// Keeps this non-leaf tensor's gradient after backward, like `retain_grad()`.
    pub fn retain_grad(&self) {
        if let Some(v) = &self.var {
            v.set_retain();
        }
    }

    /// The erased view the tape passes between nodes.
    pub fn raw(&self) -> Raw<E, D> {
        Raw {
            storage: Arc::clone(&self.storage),
            layout: self.layout,
            device: self.device.clone(),
        }
    }

    /// Rebuilds a typed tensor from an erased one, checking the sizes.
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when the sizes do not fit `S`.
    pub fn from_raw(raw: Raw<E, D>) -> Result<Self> {
        if S::from_dims(&raw.layout.dims).is_none() {
            return Err(Error::shape("from_raw", S::describe(), &raw.layout.dims));
        }
        Ok(Tensor {
            storage: raw.storage,
            layout: raw.layout,
            device: raw.device,
            var: None,
            _shape: std::marker::PhantomData,
        })
    }

    /// Records this tensor (the output of op `name`) on the tape when grad mode
    /// is on and an input needs a gradient; `backward` maps the output's
    /// gradient to the inputs' (in the order of `inputs`). The closure runs
    /// only when a backward pass reaches it.
    ///
    /// `saved` lists every tensor the closure reads ([`Tensor::saved`], an
    /// input or the output itself): backward checks that none was written in
    /// place since, and fails naming this op otherwise, as PyTorch does.
    pub fn record(
        mut self,
        name: &'static str,
        inputs: &[Option<Arc<Var<E, D>>>],
        saved: Vec<Saved>,
        backward: impl Fn(&Raw<E, D>) -> Result<Vec<Option<Raw<E, D>>>> + Send + 'static,
    ) -> Self {
        if !is_grad_enabled() {
            return self;
        }
        let Some(ops) = inputs.iter().flatten().next().map(|v| v.ops()) else {
            return self;
        };
        if anomaly_detection() && !ops.all_finite(&self.raw()).unwrap_or(true) {
            graph::note_forward_anomaly(name);
        }
        self.var = Some(Arc::new(Var::from_node(
            Node::new(name, inputs.to_vec(), saved, Box::new(backward)),
            ops,
        )));
        self
    }
}

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    /// Backpropagates `grad` (the gradient of some scalar with respect to this
    /// tensor) through the graph and frees it, like `tensor.backward(grad)`.
    ///
    /// # Errors
    /// When this tensor needs no gradient, when the graph was already freed by
    /// an earlier backward, or (in anomaly mode) when a backward produced NaN/Inf.
    pub fn try_backward_with(&self, grad: &Self) -> Result<()> {
        self.backward_impl(grad, false)
    }

    fn backward_impl(&self, grad: &Self, retain: bool) -> Result<()> {
        let var = self.var.as_ref().ok_or_else(|| Error::invalid("backward", "this tensor does not require a gradient (no input was marked with `requires_grad`)"))?;
        if grad.layout.dims != self.layout.dims {
            return Err(Error::shape(
                "backward",
                crate::error::fmt_dims(&self.layout.dims),
                &grad.layout.dims,
            ));
        }
        backward_raw(var, grad.raw(), retain)
    }
}

impl<E: Float, D: crate::device::Device<E>> Tensor<(), E, D> {
    /// Backpropagates from this scalar (usually a loss), like `loss.backward()`:
    /// gradients accumulate into the leaves and the graph is freed.
    ///
    /// # Panics
    /// When no input requires a gradient or the graph was already freed; see
    /// [`Tensor::try_backward`].
    #[track_caller]
    pub fn backward(&self) {
        ok(self.try_backward());
    }

    /// Fallible [`Tensor::backward`].
    ///
    /// # Errors
    /// As [`Tensor::try_backward_with`].
    pub fn try_backward(&self) -> Result<()> {
        self.backward_impl(&self.ones_like(), false)
    }

    /// Backpropagates and keeps the graph for another backward, like
    /// `loss.backward(retain_graph=True)`.
    ///
    /// # Errors
    /// As [`Tensor::try_backward_with`].
    pub fn backward_retain(&self) -> Result<()> {
        self.backward_impl(&self.ones_like(), true)
    }
}
