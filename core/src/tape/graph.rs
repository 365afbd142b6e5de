//! Graph nodes, the backward pass, grad mode and anomaly mode.

use super::hooks::VarHooks;
use super::{BackwardFn, Raw};
use crate::device::Backend;
use crate::dtype::{DType, Dtype, Float};
use crate::error::{Error, Result};
use crate::ops::binary::Add;
use crate::shape::Dims;
use crate::tensor::{StorageCell, Versioned};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

static LIVE_NODES: AtomicUsize = AtomicUsize::new(0);
static LIVE_SAVED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    static ANOMALY: Cell<bool> = const { Cell::new(false) };
    static FIRST_ANOMALY: RefCell<Option<&'static str>> = const { RefCell::new(None) };
    /// How many backward passes are running on this thread (a hook may start one).
    static BACKWARD_DEPTH: Cell<usize> = const { Cell::new(0) };
    /// Callbacks queued by [`queue_callback`] for the end of the outermost backward.
    static FINAL_CALLBACKS: RefCell<Vec<FinalCallback>> = const { RefCell::new(Vec::new()) };
}

type FinalCallback = Box<dyn FnOnce() -> Result<()>>;

/// Queues `callback` to run once the backward pass now running on this
/// thread has finished (every gradient accumulated, every hook run), like
/// PyTorch's `Variable._execution_engine.queue_callback`: how a hook that
/// started work (a data-parallel gradient reduction) waits for it before
/// `backward` returns. Callbacks run in the order queued; an error one
/// returns is `backward`'s error (the later callbacks still run). When the
/// backward itself fails, the queued callbacks are dropped unrun.
///
/// # Errors
/// When no backward is running on this thread.
pub fn queue_callback(callback: impl FnOnce() -> Result<()> + 'static) -> Result<()> {
    if BACKWARD_DEPTH.with(Cell::get) == 0 {
        return Err(Error::invalid(
            "queue_callback",
            "callbacks can only be queued while a backward runs (from a hook)",
        ));
    }
    FINAL_CALLBACKS.with(|c| c.borrow_mut().push(Box::new(callback)));
    Ok(())
}

/// Counts a running backward; the outermost one runs the queued callbacks.
struct BackwardScope;

impl BackwardScope {
    fn enter() -> Self {
        BACKWARD_DEPTH.with(|d| d.set(d.get() + 1));
        BackwardScope
    }

    /// Leaves the scope: for the outermost backward, runs the callbacks after
    /// a success and drops them after a failure.
    fn finish(self, result: Result<()>) -> Result<()> {
        drop(self);
        if BACKWARD_DEPTH.with(Cell::get) > 0 {
            return result;
        }
        let callbacks = FINAL_CALLBACKS.with(|c| std::mem::take(&mut *c.borrow_mut()));
        result?;
        let mut first = Ok(());
        for cb in callbacks {
            let r = cb();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for BackwardScope {
    fn drop(&mut self) {
        BACKWARD_DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Number of tape nodes alive in the process (for leak tests).
pub fn live_nodes() -> usize {
    LIVE_NODES.load(Ordering::SeqCst)
}

/// Number of backward closures (with their saved activations) alive.
pub fn live_saved() -> usize {
    LIVE_SAVED.load(Ordering::SeqCst)
}

/// Whether ops on this thread are recorded.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Restores the previous grad mode when dropped.
#[derive(Debug)]
pub struct NoGradGuard {
    prev: bool,
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.prev));
    }
}

/// Stops recording on this thread until the guard drops, like `torch.no_grad()`:
/// no node is created and no activation is kept.
pub fn no_grad() -> NoGradGuard {
    let prev = GRAD_ENABLED.with(|g| g.replace(false));
    NoGradGuard { prev }
}

/// Turns anomaly detection on or off for this thread (like grad mode), like
/// `torch.autograd.set_detect_anomaly`. When on, every op checks its output,
/// and backward fails naming the first op whose forward or backward produced
/// NaN or Inf.
pub fn set_anomaly_detection(on: bool) {
    ANOMALY.with(|a| a.set(on));
    FIRST_ANOMALY.with(|a| *a.borrow_mut() = None);
}

/// Whether anomaly detection is on.
pub fn anomaly_detection() -> bool {
    ANOMALY.with(Cell::get)
}

/// Notes that op `name`'s forward produced NaN or Inf (the first one is kept).
pub(crate) fn note_forward_anomaly(name: &'static str) {
    FIRST_ANOMALY.with(|a| {
        a.borrow_mut().get_or_insert(name);
    });
}

/// A tensor a backward closure reads, as it was when the op ran: its
/// storage's version counter and the version then, like PyTorch's
/// `SavedVariable`. Made by [`crate::Tensor::saved`] or [`Raw::saved`].
///
/// It holds the counter weakly: the closure that reads the tensor keeps its
/// storage alive, and once backward has run and dropped the closure, the
/// activation is freed even while the node itself lives on.
#[derive(Clone)]
pub struct Saved {
    counter: Weak<dyn Versioned>,
    at: u64,
    dims: Dims,
    dtype: DType,
}

impl Saved {
    pub(crate) fn new<T: Send + Sync + 'static>(
        cell: &Arc<StorageCell<T>>,
        dims: &[usize],
        dtype: DType,
    ) -> Self {
        let counter: Weak<StorageCell<T>> = Arc::downgrade(cell);
        Saved {
            at: cell.version(),
            counter: counter as Weak<dyn Versioned>,
            dims: Dims::from_slice(dims),
            dtype,
        }
    }

    /// The error when the tensor was written in place since it was saved.
    fn check(&self, op: &'static str, index: usize) -> Result<()> {
        // A storage that is gone was not held by the closure: it reads nothing.
        let Some(counter) = self.counter.upgrade() else {
            return Ok(());
        };
        let now = counter.version();
        if now == self.at {
            return Ok(());
        }
        Err(Error::ModifiedInPlace {
            op,
            index,
            tensor: format!("{} {}", crate::error::fmt_dims(&self.dims), self.dtype),
            expected: self.at,
            actual: now,
        })
    }
}

impl std::fmt::Debug for Saved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Saved({:?} {} at version {})",
            &self.dims[..],
            self.dtype,
            self.at
        )
    }
}

/// A recorded op: its inputs' variables, the tensors its backward reads and
/// its backward closure.
pub struct Node<E: Dtype, D: Backend> {
    name: &'static str,
    inputs: Vec<Option<Arc<Var<E, D>>>>,
    saved: Vec<Saved>,
    backward: Mutex<Option<BackwardFn<E, D>>>,
}

impl<E: Dtype, D: Backend> Node<E, D> {
    /// A node for op `name`, whose backward reads the tensors `saved`.
    pub fn new(
        name: &'static str,
        inputs: Vec<Option<Arc<Var<E, D>>>>,
        saved: Vec<Saved>,
        backward: BackwardFn<E, D>,
    ) -> Self {
        LIVE_NODES.fetch_add(1, Ordering::SeqCst);
        LIVE_SAVED.fetch_add(1, Ordering::SeqCst);
        Node {
            name,
            inputs,
            saved,
            backward: Mutex::new(Some(backward)),
        }
    }

    /// Fails when a tensor this node saved was written in place since.
    fn check_saved(&self) -> Result<()> {
        for (i, s) in self.saved.iter().enumerate() {
            s.check(self.name, i)?;
        }
        Ok(())
    }

    /// The op's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    fn take_backward(&self) -> Option<BackwardFn<E, D>> {
        let f = self
            .backward
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if f.is_some() {
            LIVE_SAVED.fetch_sub(1, Ordering::SeqCst);
        }
        f
    }
}

impl<E: Dtype, D: Backend> std::fmt::Debug for Node<E, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node({}, {} inputs)", self.name, self.inputs.len())
    }
}

impl<E: Dtype, D: Backend> Drop for Node<E, D> {
    fn drop(&mut self) {
        LIVE_NODES.fetch_sub(1, Ordering::SeqCst);
        if self
            .backward
            .get_mut()
            .map(|b| b.is_some())
            .unwrap_or(false)
        {
            LIVE_SAVED.fetch_sub(1, Ordering::SeqCst);
        }
        // Dropping the inputs one by one would recurse once per op of a chain
        // (`Var` -> `Node` -> inputs -> `Var` ...) and overflow the stack on a
        // long graph. Instead, each input this node held the last reference
        // to gives up its own inputs to a local stack before it is dropped,
        // so every node drops with no inputs left: no recursion at all.
        let mut stack: Vec<Arc<Var<E, D>>> = self.inputs.drain(..).flatten().collect();
        while let Some(v) = stack.pop() {
            if let Some(mut var) = Arc::into_inner(v) {
                if let Some(node) = var.node.as_mut() {
                    stack.extend(node.inputs.drain(..).flatten());
                }
            }
        }
    }
}

/// The arithmetic the tape itself needs on gradients (accumulate, sum over
/// broadcast dims, finiteness checks). A leaf gets it when it is created
/// (only float tensors on a full backend can require a gradient) and every
/// node inherits it, so ops generic over any dtype (views) can record.
pub trait GradOps<E: Dtype, D: Backend>: Send + Sync {
    /// `a + b` (same sizes).
    fn add(&self, a: &Raw<E, D>, b: &Raw<E, D>) -> Result<Raw<E, D>>;
    /// [`super::util::sum_to`].
    fn sum_to(&self, g: &Raw<E, D>, dims: &[usize]) -> Result<Raw<E, D>>;
    /// Whether every element is finite.
    fn all_finite(&self, r: &Raw<E, D>) -> Result<bool>;
}

/// [`GradOps`] for float dtypes on a backend with every kernel.
#[derive(Debug)]
pub struct FloatOps;

impl<E: Float, D: crate::device::Device<E>> GradOps<E, D> for FloatOps {
    fn add(&self, a: &Raw<E, D>, b: &Raw<E, D>) -> Result<Raw<E, D>> {
        if a.layout.dims != b.layout.dims {
            return Err(Error::shape(
                "backward (accumulate)",
                crate::error::fmt_dims(&a.layout.dims),
                &b.layout.dims,
            ));
        }
        let s = a
            .device
            .binary(Add, &a.storage(), &a.layout, &b.storage(), &b.layout)?;
        Ok(Raw::new(s, &a.layout.dims, a.device.clone()))
    }

    fn sum_to(&self, g: &Raw<E, D>, dims: &[usize]) -> Result<Raw<E, D>> {
        super::util::sum_to(g, dims)
    }

    fn all_finite(&self, r: &Raw<E, D>) -> Result<bool> {
        Ok(r.device
            .to_vec(&r.storage(), &r.layout)?
            .iter()
            .all(|v| v.is_finite()))
    }
}

/// The autograd state of a tensor that requires a gradient.
pub struct Var<E: Dtype, D: Backend> {
    node: Option<Node<E, D>>,
    grad: Mutex<Option<Raw<E, D>>>,
    retain: AtomicBool,
    ops: &'static dyn GradOps<E, D>,
    /// Set once a hook is registered, so a backward without hooks never locks `hooks`.
    hooked: AtomicBool,
    hooks: Mutex<VarHooks<E, D>>,
}

impl<E: Dtype, D: Backend> std::fmt::Debug for Var<E, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.node {
            Some(n) => write!(f, "Var(grad_fn={})", n.name),
            None => f.write_str("Var(leaf)"),
        }
    }
}

impl<E: Dtype, D: Backend> Var<E, D> {
    /// A leaf.
    pub fn leaf(ops: &'static dyn GradOps<E, D>) -> Self {
        Var {
            node: None,
            grad: Mutex::new(None),
            retain: AtomicBool::new(false),
            ops,
            hooked: AtomicBool::new(false),
            hooks: Mutex::new(VarHooks::default()),
        }
    }

    /// The output of a recorded op.
    pub fn from_node(node: Node<E, D>, ops: &'static dyn GradOps<E, D>) -> Self {
        Var {
            node: Some(node),
            grad: Mutex::new(None),
            retain: AtomicBool::new(false),
            ops,
            hooked: AtomicBool::new(false),
            hooks: Mutex::new(VarHooks::default()),
        }
    }

    /// The gradient arithmetic of this graph.
    pub fn ops(&self) -> &'static dyn GradOps<E, D> {
        self.ops
    }

    /// Whether this is a leaf.
    pub fn is_leaf(&self) -> bool {
        self.node.is_none()
    }

    /// The name of the op that produced it (`None` for a leaf).
    pub fn grad_fn(&self) -> Option<&'static str> {
        self.node.as_ref().map(|n| n.name)
    }

    pub(crate) fn grad(&self) -> Option<Raw<E, D>> {
        self.grad.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn set_grad(&self, grad: Raw<E, D>) {
        *self.grad.lock().unwrap_or_else(|e| e.into_inner()) = Some(grad);
    }

    pub(crate) fn clear_grad(&self) {
        *self.grad.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The hook lists, for registering or removing (marks the var hooked).
    pub(super) fn hooks(&self) -> std::sync::MutexGuard<'_, VarHooks<E, D>> {
        self.hooked.store(true, Ordering::SeqCst);
        self.hooks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `g` through this var's gradient hooks, in registration order. The
    /// list is copied out first, so a hook may register or remove hooks.
    fn run_grad_hooks(&self, mut g: Raw<E, D>) -> Result<Raw<E, D>> {
        if !self.hooked.load(Ordering::SeqCst) {
            return Ok(g);
        }
        let hooks: Vec<_> = self.hooks().grad.iter().map(|(_, h)| h.clone()).collect();
        for h in hooks {
            if let Some(new) = h(&g)? {
                g = new;
            }
        }
        Ok(g)
    }

    /// Runs the post-accumulate-grad hooks of this leaf.
    fn run_post_hooks(self: &Arc<Self>) -> Result<()> {
        if !self.hooked.load(Ordering::SeqCst) {
            return Ok(());
        }
        let hooks: Vec<_> = self.hooks().post.iter().map(|(_, h)| h.clone()).collect();
        for h in hooks {
            h(self)?;
        }
        Ok(())
    }

    pub(crate) fn set_retain(&self) {
        self.retain.store(true, Ordering::Relaxed);
    }
}

/// Runs the backward pass from `root` with upstream gradient `grad`.
///
/// # Errors
/// When a node's graph was freed by an earlier backward, when a backward
/// closure fails, or (anomaly mode) when an op produced NaN/Inf.
pub fn backward_raw<E: Dtype, D: Backend>(
    root: &Arc<Var<E, D>>,
    grad: Raw<E, D>,
    retain_graph: bool,
) -> Result<()> {
    let scope = BackwardScope::enter();
    let result = backward_pass(root, grad, retain_graph);
    scope.finish(result)
}

fn backward_pass<E: Dtype, D: Backend>(
    root: &Arc<Var<E, D>>,
    grad: Raw<E, D>,
    retain_graph: bool,
) -> Result<()> {
    if anomaly_detection() {
        if let Some(name) = FIRST_ANOMALY.with(|a| *a.borrow()) {
            return Err(Error::invalid(
                "anomaly",
                format!("the forward of `{name}` produced NaN or Inf"),
            ));
        }
    }
    let _guard = no_grad();
    // A backward computes as its forward did, whatever autocast says now.
    let _autocast = crate::autocast::suspend();
    let ops = root.ops;
    let key = |v: &Arc<Var<E, D>>| Arc::as_ptr(v) as usize;
    // How many edges of the graph lead into each var (one per use by an op),
    // by an iterative walk: a var's gradient is complete once every op that
    // used it has run its backward.
    let mut uses: HashMap<usize, usize> = HashMap::new();
    let mut stack: Vec<&Arc<Var<E, D>>> = vec![root];
    uses.insert(key(root), 0);
    while let Some(v) = stack.pop() {
        for p in v.node.iter().flat_map(|n| n.inputs.iter().flatten()) {
            let n = uses.entry(key(p)).or_insert(0);
            *n += 1;
            if *n == 1 {
                stack.push(p);
            }
        }
    }
    // Vars whose gradient is complete. Leaves go first, so a parameter's
    // hooks (and a data-parallel reduction) see its gradient as early as
    // possible; ops depth-first after that.
    let mut ready_leaves: Vec<&Arc<Var<E, D>>> = Vec::new();
    let mut ready: Vec<&Arc<Var<E, D>>> = vec![root];
    let mut grads: HashMap<usize, Raw<E, D>> = HashMap::new();
    grads.insert(key(root), grad);
    while let Some(v) = ready_leaves.pop().or_else(|| ready.pop()) {
        let g = grads.remove(&key(v));
        let Some(node) = &v.node else {
            let Some(g) = g else { continue };
            // Every contribution to `g` is in: the tensor's hooks see the total.
            let g = v.run_grad_hooks(g)?;
            {
                let mut slot = v.grad.lock().unwrap_or_else(|e| e.into_inner());
                *slot = Some(match slot.take() {
                    Some(old) => ops.add(&old, &g)?,
                    None => g,
                });
            }
            v.run_post_hooks()?;
            continue;
        };
        let input_grads = match g {
            Some(g) => {
                let g = v.run_grad_hooks(g)?;
                if v.retain.load(Ordering::Relaxed) {
                    *v.grad.lock().unwrap_or_else(|e| e.into_inner()) = Some(g.clone());
                }
                let freed = || {
                    Error::invalid("backward", format!("the graph through `{}` was already freed by an earlier backward; use `backward_retain` to keep it", node.name))
                };
                node.check_saved()?;
                if retain_graph {
                    let slot = node.backward.lock().unwrap_or_else(|e| e.into_inner());
                    let f = slot.as_ref().ok_or_else(freed)?;
                    f(&g)?
                } else {
                    // Dropping the closure right after it runs frees the activations it saved.
                    let f = node.take_backward().ok_or_else(freed)?;
                    f(&g)?
                }
            }
            // No gradient reached this op: its inputs get nothing from it,
            // but they still count it as done.
            None => Vec::new(),
        };
        let mut input_grads = input_grads.into_iter();
        for input in &node.inputs {
            let ig = input_grads.next().flatten();
            let Some(input) = input else {
                continue;
            };
            if let Some(ig) = ig {
                if anomaly_detection() && !ops.all_finite(&ig)? {
                    return Err(Error::invalid(
                        "anomaly",
                        format!("the backward of `{}` produced NaN or Inf", node.name),
                    ));
                }
                let k = key(input);
                let acc = match grads.remove(&k) {
                    Some(old) => ops.add(&old, &ig)?,
                    None => ig,
                };
                grads.insert(k, acc);
            }
            let n = uses.get_mut(&key(input)).expect("counted in the walk");
            *n -= 1;
            if *n == 0 {
                if input.is_leaf() {
                    ready_leaves.push(input);
                } else {
                    ready.push(input);
                }
            }
        }
    }
    Ok(())
}
