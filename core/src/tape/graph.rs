//! Graph nodes, the backward pass, grad mode and anomaly mode.

use super::hooks::VarHooks;
use super::{BackwardFn, Raw};
use crate::device::Backend;
use crate::dtype::{DType, Dtype, Float};
use crate::error::{Error, Result};
use crate::ops::binary::Add;
use crate::shape::Dims;
use crate::tensor::{StorageCell, Versioned};
use std::any::Any;
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
    /// An input of another dtype or device (a cast's, a device move's) and
    /// how its gradient is made from this node's output gradient.
    cross: Option<Cross<E, D>>,
}

/// The gradient of an input of another element type or device, made from
/// the output's gradient: its [`Raw`] boxed as `Any` (the input's own
/// `Raw<E2, D2>`).
pub type CrossBackwardFn<E, D> = Box<dyn Fn(&Raw<E, D>) -> Result<Box<dyn Any>> + Send + Sync>;

struct Cross<E: Dtype, D: Backend> {
    input: Arc<dyn AnyVar>,
    backward: CrossBackwardFn<E, D>,
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
            cross: None,
        }
    }

    /// A node whose one input has another element type or device (`input`,
    /// a [`Var<E2, D2>`]): `backward` turns this node's output gradient into
    /// that input's, a `Raw<E2, D2>` boxed as `Any`. How a cast or a device
    /// move records itself.
    pub fn crossing<E2: Dtype, D2: Backend>(
        name: &'static str,
        input: Arc<Var<E2, D2>>,
        backward: impl Fn(&Raw<E, D>) -> Result<Raw<E2, D2>> + Send + Sync + 'static,
    ) -> Self {
        let mut node = Node::new(name, Vec::new(), Vec::new(), Box::new(|_| Ok(Vec::new())));
        node.cross = Some(Cross {
            input,
            backward: Box::new(move |g| Ok(Box::new(backward(g)?) as Box<dyn Any>)),
        });
        node
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

/// [`FloatOps`] for `F` when `F` is one of the four float types, for a
/// backend with every kernel for all of them: what such a backend returns
/// from [`Backend::grad_ops`].
pub fn float_grad_ops<F: Dtype, D>() -> Option<&'static dyn GradOps<F, D>>
where
    D: crate::device::Device<f32>
        + crate::device::Device<f64>
        + crate::device::Device<half::f16>
        + crate::device::Device<half::bf16>,
{
    fn pick<E: Float, F: Dtype, D: crate::device::Device<E>>() -> Option<&'static dyn GradOps<F, D>>
    {
        let ops: &'static dyn GradOps<E, D> = &FloatOps;
        (&ops as &dyn Any)
            .downcast_ref::<&'static dyn GradOps<F, D>>()
            .copied()
    }
    match F::DTYPE {
        DType::F32 => pick::<f32, F, D>(),
        DType::F64 => pick::<f64, F, D>(),
        DType::F16 => pick::<half::f16, F, D>(),
        DType::BF16 => pick::<half::bf16, F, D>(),
        _ => None,
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

/// A tape variable with its element type and device erased: what the
/// backward pass walks, so one pass crosses casts and device moves.
/// Gradients travel as `Box<dyn Any>` holding the variable's own `Raw`.
trait AnyVar: Send + Sync {
    /// The op's name (`None` for a leaf).
    fn op_name(&self) -> Option<&'static str>;
    fn is_leaf_var(&self) -> bool;
    /// The inputs, in the order [`AnyVar::process`] returns their gradients.
    fn inputs(&self) -> Vec<Option<Arc<dyn AnyVar>>>;
    /// Takes this variable's complete gradient: a leaf accumulates it (and
    /// runs its hooks); an op runs its backward and returns its inputs'
    /// gradients.
    fn process(
        self: Arc<Self>,
        g: Option<Box<dyn Any>>,
        retain_graph: bool,
    ) -> Result<Vec<Option<Box<dyn Any>>>>;
    /// `a + b`, two gradients of this variable.
    fn add(&self, a: Box<dyn Any>, b: Box<dyn Any>) -> Result<Box<dyn Any>>;
    /// Whether a gradient of this variable is finite everywhere.
    fn all_finite(&self, g: &dyn Any) -> Result<bool>;
}

fn unbox<E: Dtype, D: Backend>(g: Box<dyn Any>) -> Raw<E, D> {
    *g.downcast::<Raw<E, D>>()
        .expect("a gradient has its variable's dtype and device")
}

impl<E: Dtype, D: Backend> AnyVar for Var<E, D> {
    fn op_name(&self) -> Option<&'static str> {
        self.grad_fn()
    }

    fn is_leaf_var(&self) -> bool {
        self.node.is_none()
    }

    fn inputs(&self) -> Vec<Option<Arc<dyn AnyVar>>> {
        let Some(node) = &self.node else {
            return Vec::new();
        };
        let mut out: Vec<Option<Arc<dyn AnyVar>>> = node
            .inputs
            .iter()
            .map(|i| i.clone().map(|v| v as Arc<dyn AnyVar>))
            .collect();
        if let Some(c) = &node.cross {
            out.push(Some(Arc::clone(&c.input)));
        }
        out
    }

    fn process(
        self: Arc<Self>,
        g: Option<Box<dyn Any>>,
        retain_graph: bool,
    ) -> Result<Vec<Option<Box<dyn Any>>>> {
        let Some(node) = &self.node else {
            let Some(g) = g else { return Ok(Vec::new()) };
            // Every contribution to `g` is in: the tensor's hooks see the total.
            let g = self.run_grad_hooks(unbox(g))?;
            // A gradient handed on unchanged to more than one input (both
            // operands of an add) is one buffer: a leaf keeps a copy of its
            // own, as PyTorch's do, so writing one in place leaves the
            // other alone.
            let g = if Arc::strong_count(&g.storage) > 1 {
                let own = g.device.contiguous(&g.storage(), &g.layout)?;
                Raw::new(own, &g.layout.dims, g.device.clone())
            } else {
                g
            };
            {
                let mut slot = self.grad.lock().unwrap_or_else(|e| e.into_inner());
                *slot = Some(match slot.take() {
                    Some(old) => self.ops.add(&old, &g)?,
                    None => g,
                });
            }
            self.run_post_hooks()?;
            return Ok(Vec::new());
        };
        // No gradient reached this op: its inputs get nothing from it, but
        // they still count it as done.
        let Some(g) = g else { return Ok(Vec::new()) };
        let g = self.run_grad_hooks(unbox(g))?;
        if self.retain.load(Ordering::Relaxed) {
            *self.grad.lock().unwrap_or_else(|e| e.into_inner()) = Some(g.clone());
        }
        let freed = || {
            Error::invalid("backward", format!("the graph through `{}` was already freed by an earlier backward; use `backward_retain` to keep it", node.name))
        };
        node.check_saved()?;
        let typed = if retain_graph {
            let slot = node.backward.lock().unwrap_or_else(|e| e.into_inner());
            let f = slot.as_ref().ok_or_else(freed)?;
            f(&g)?
        } else {
            // Dropping the closure right after it runs frees the activations it saved.
            let f = node.take_backward().ok_or_else(freed)?;
            f(&g)?
        };
        let mut out: Vec<Option<Box<dyn Any>>> = typed
            .into_iter()
            .map(|r| r.map(|r| Box::new(r) as Box<dyn Any>))
            .collect();
        if let Some(c) = &node.cross {
            out.resize_with(node.inputs.len(), || None);
            out.push(Some((c.backward)(&g)?));
        }
        Ok(out)
    }

    fn add(&self, a: Box<dyn Any>, b: Box<dyn Any>) -> Result<Box<dyn Any>> {
        let sum = self.ops.add(&unbox::<E, D>(a), &unbox::<E, D>(b))?;
        Ok(Box::new(sum))
    }

    fn all_finite(&self, g: &dyn Any) -> Result<bool> {
        let g = g
            .downcast_ref::<Raw<E, D>>()
            .expect("a gradient has its variable's dtype and device");
        self.ops.all_finite(g)
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
    let result = backward_pass(
        Arc::clone(root) as Arc<dyn AnyVar>,
        Box::new(grad),
        retain_graph,
    );
    scope.finish(result)
}

fn backward_pass(root: Arc<dyn AnyVar>, grad: Box<dyn Any>, retain_graph: bool) -> Result<()> {
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
    let key = |v: &Arc<dyn AnyVar>| Arc::as_ptr(v) as *const () as usize;
    // How many edges of the graph lead into each var (one per use by an op),
    // by an iterative walk: a var's gradient is complete once every op that
    // used it has run its backward.
    let mut uses: HashMap<usize, usize> = HashMap::new();
    let mut stack: Vec<Arc<dyn AnyVar>> = vec![Arc::clone(&root)];
    uses.insert(key(&root), 0);
    while let Some(v) = stack.pop() {
        for p in v.inputs().into_iter().flatten() {
            let n = uses.entry(key(&p)).or_insert(0);
            *n += 1;
            if *n == 1 {
                stack.push(p);
            }
        }
    }
    // Vars whose gradient is complete. Leaves go first, so a parameter's
    // hooks (and a data-parallel reduction) see its gradient as early as
    // possible; ops depth-first after that.
    let mut ready_leaves: Vec<Arc<dyn AnyVar>> = Vec::new();
    let mut ready: Vec<Arc<dyn AnyVar>> = vec![Arc::clone(&root)];
    let mut grads: HashMap<usize, Box<dyn Any>> = HashMap::new();
    grads.insert(key(&root), grad);
    while let Some(v) = ready_leaves.pop().or_else(|| ready.pop()) {
        let g = grads.remove(&key(&v));
        let inputs = v.inputs();
        let name = v.op_name().unwrap_or("leaf");
        let mut input_grads = Arc::clone(&v).process(g, retain_graph)?.into_iter();
        for input in inputs {
            let ig = input_grads.next().flatten();
            let Some(input) = input else {
                continue;
            };
            let k = key(&input);
            if let Some(ig) = ig {
                if anomaly_detection() && !input.all_finite(&*ig)? {
                    return Err(Error::invalid(
                        "anomaly",
                        format!("the backward of `{name}` produced NaN or Inf"),
                    ));
                }
                let acc = match grads.remove(&k) {
                    Some(old) => input.add(old, ig)?,
                    None => ig,
                };
                grads.insert(k, acc);
            }
            let n = uses.get_mut(&k).expect("counted in the walk");
            *n -= 1;
            if *n == 0 {
                if input.is_leaf_var() {
                    ready_leaves.push(input);
                } else {
                    ready.push(input);
                }
            }
        }
    }
    Ok(())
}
