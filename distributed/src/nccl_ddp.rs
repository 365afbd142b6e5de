//! [`NcclDistributedDataParallel`]: data-parallel training of a model on
//! CUDA devices, gradients averaged by NCCL (feature `nccl`).

use crate::ddp::{to_core, DdpOptions};
use crate::error::{DistError, Result};
use crate::nccl::NcclGroup;
use crate::ReduceOp;
use forma_core::tape::{queue_callback, HookHandle};
use forma_core::{Backend, Dtype, Float, Shape, Tensor};
use forma_cuda::Cuda;
use forma_nn::module::{downcast_ref, Cx, ReprNode, Role, Visitor, VisitorMut};
use forma_nn::{Forward, Module};
use std::any::TypeId;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Averages one parameter's gradient over the group, or (`None`: a rank
/// that did not use it) contributes zeros; writes the result back unless
/// `write` is false.
type Reduce = Box<dyn Fn(&NcclGroup, bool) -> Result<()> + Send>;

struct Param {
    name: String,
    ready: bool,
    reduce: Reduce,
}

struct State {
    group: NcclGroup,
    params: Vec<Param>,
    sync: bool,
    find_unused: bool,
    queued: bool,
    error: Option<DistError>,
}

fn lock(s: &Mutex<State>) -> MutexGuard<'_, State> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    /// End of backward: with `find_unused_parameters`, every reduction (in
    /// one order on every rank, zeros for a parameter this rank left out,
    /// none written where no rank used it); otherwise a check that every
    /// parameter was reduced.
    fn finish(&mut self) -> Result<()> {
        let result = self.finish_inner();
        self.reset();
        result
    }

    /// The state before a backward: no parameter ready, no callback queued.
    fn reset(&mut self) {
        self.queued = false;
        for p in &mut self.params {
            p.ready = false;
        }
    }

    fn finish_inner(&mut self) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if self.find_unused {
            let used = Tensor::<(forma_core::Dyn,), f32, Cuda>::from_vec_on(
                self.params
                    .iter()
                    .map(|p| f32::from(u8::from(p.ready)))
                    .collect(),
                (forma_core::Dyn(self.params.len()),),
                self.group.device(),
            )?;
            self.group.all_reduce(&used, ReduceOp::Sum)?;
            let used = used.try_to_vec()?;
            for (p, &n) in self.params.iter().zip(&used).rev() {
                (p.reduce)(&self.group, n > 0.0)?;
            }
            return Ok(());
        }
        let unused: Vec<String> = self
            .params
            .iter()
            .filter(|p| !p.ready)
            .map(|p| p.name.clone())
            .collect();
        if unused.is_empty() {
            Ok(())
        } else {
            Err(DistError::UnusedParameters {
                rank: self.group.rank(),
                params: unused,
            })
        }
    }
}

/// [`crate::DistributedDataParallel`] for a model on CUDA devices, one per
/// process, over an [`NcclGroup`], like PyTorch's DDP with the NCCL
/// backend: parameters and buffers from rank 0 at construction, buffers
/// broadcast at each forward, each parameter's gradient averaged by NCCL
/// on the device stream as soon as backward has produced it (in backward
/// order, the same on every rank; with `find_unused_parameters`, all at
/// the end of backward in one fixed order, zeros for a parameter a rank
/// left out), [`no_sync`](NcclDistributedDataParallel::no_sync) for
/// accumulation. Gradients are reduced one parameter at a time, not in
/// buckets ([`DdpOptions::bucket_cap_mb`] is not used here).
pub struct NcclDistributedDataParallel<M> {
    module: M,
    group: NcclGroup,
    state: Arc<Mutex<State>>,
    hooks: Vec<HookHandle>,
    options: DdpOptions,
}

impl<M> std::fmt::Debug for NcclDistributedDataParallel<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclDistributedDataParallel")
            .field("group", &self.group)
            .field("parameters", &lock(&self.state).params.len())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What the constructor's walk finds.
struct Collect<'a> {
    group: &'a NcclGroup,
    /// Registers the hook of parameter `index` and returns its reduction.
    found: Vec<(
        String,
        Box<dyn FnOnce(Arc<Mutex<State>>, usize) -> Result<(HookHandle, Reduce)>>,
    )>,
    seen: Vec<usize>,
    buffers_only: bool,
    collect: bool,
    err: Option<DistError>,
}

impl Collect<'_> {
    fn add<S: Shape, E: Float>(&mut self, cx: &Cx, t: &Tensor<S, E, Cuda>) {
        let Some(var) = t.tape_var() else { return };
        let key = Arc::as_ptr(&var) as *const () as usize;
        if self.seen.contains(&key) {
            return;
        }
        self.seen.push(key);
        let param = t.clone();
        self.found.push((
            cx.path().to_string(),
            Box::new(move |state: Arc<Mutex<State>>, index: usize| {
                let for_hook = Arc::clone(&state);
                let handle = param.try_register_post_accumulate_grad_hook(
                    move |p: &Tensor<S, E, Cuda>| {
                        on_ready(&for_hook, index, p);
                    },
                )?;
                let reduce: Reduce = Box::new(move |group: &NcclGroup, write: bool| {
                    reduce_one(group, &param, write)
                });
                Ok((handle, reduce))
            }),
        ));
    }
}

/// Averages `p`'s gradient (zeros when it has none) over the group and,
/// when `write`, makes the average its gradient. The gradient is copied
/// first (scaled by 1 / world size, as PyTorch pre-divides): a gradient's
/// storage may be shared with another parameter's.
fn reduce_one<S: Shape, E: Float>(
    group: &NcclGroup,
    p: &Tensor<S, E, Cuda>,
    write: bool,
) -> Result<()> {
    let _no_grad = forma_core::tape::no_grad();
    let scale = 1.0 / group.world_size() as f64;
    let g = match p.grad() {
        Some(g) => g.mul_scalar(scale),
        None => Tensor::<S, E, Cuda>::zeros_on(p.shape(), group.device()),
    };
    group.all_reduce(&g, ReduceOp::Sum)?;
    if write {
        p.try_set_grad(&g)?;
    }
    Ok(())
}

fn on_ready<S: Shape, E: Float>(state: &Arc<Mutex<State>>, index: usize, p: &Tensor<S, E, Cuda>) {
    let mut s = lock(state);
    if !s.sync {
        return;
    }
    if !s.queued {
        let for_callback = Arc::clone(state);
        match queue_callback(move || lock(&for_callback).finish().map_err(to_core)) {
            Ok(()) => s.queued = true,
            Err(e) => {
                s.error.get_or_insert(DistError::Tensor(e));
                return;
            }
        }
    }
    s.params[index].ready = true;
    if s.find_unused || s.error.is_some() {
        return;
    }
    if let Err(e) = reduce_one(&s.group, p, true) {
        s.error.get_or_insert(e);
    }
}

impl Visitor for Collect<'_> {
    fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, D>) {
        if self.err.is_some() || (self.buffers_only && cx.role() == Role::Parameter) {
            return;
        }
        if TypeId::of::<D>() != TypeId::of::<Cuda>() {
            self.err = Some(DistError::invalid(
                "NcclDistributedDataParallel",
                format!(
                    "`{}` is on {}; NCCL reduces CUDA tensors",
                    cx.path(),
                    t.device().name()
                ),
            ));
            return;
        }
        let Some(c) = downcast_ref::<S, E, D, E, Cuda>(t) else {
            return;
        };
        // Rank 0's values, contiguous tensors only (parameters and buffers are).
        if let Err(e) = self.group.broadcast(c, 0) {
            self.err = Some(e);
            return;
        }
        if !self.collect || cx.role() != Role::Parameter {
            return;
        }
        if let Some(t) = downcast_ref::<S, E, D, f32, Cuda>(t) {
            self.add(cx, t);
        } else if let Some(t) = downcast_ref::<S, E, D, f64, Cuda>(t) {
            self.add(cx, t);
        } else if let Some(t) = downcast_ref::<S, E, D, half::f16, Cuda>(t) {
            self.add(cx, t);
        } else if let Some(t) = downcast_ref::<S, E, D, half::bf16, Cuda>(t) {
            self.add(cx, t);
        }
    }
}

impl<M: Module> NcclDistributedDataParallel<M> {
    /// Wraps `module` (on this rank's device of `group`): rank 0's
    /// parameters and buffers are copied to every rank and the gradient
    /// hooks installed. Every rank calls it with the same architecture.
    ///
    /// # Errors
    /// A tensor not on CUDA, NCCL failing.
    pub fn new(module: M, group: &NcclGroup, options: DdpOptions) -> Result<Self> {
        let mut c = Collect {
            group,
            found: Vec::new(),
            seen: Vec::new(),
            buffers_only: false,
            collect: true,
            err: None,
        };
        module.visit(&mut Cx::new(), &mut c);
        if let Some(e) = c.err {
            return Err(e);
        }
        let state = Arc::new(Mutex::new(State {
            group: group.clone(),
            params: Vec::new(),
            sync: true,
            find_unused: options.find_unused_parameters,
            queued: false,
            error: None,
        }));
        let mut hooks = Vec::new();
        let mut params = Vec::new();
        for (i, (name, register)) in c.found.into_iter().enumerate() {
            let (hook, reduce) = register(Arc::clone(&state), i)?;
            hooks.push(hook);
            params.push(Param {
                name,
                ready: false,
                reduce,
            });
        }
        lock(&state).params = params;
        Ok(NcclDistributedDataParallel {
            module,
            group: group.clone(),
            state,
            hooks,
            options,
        })
    }
}

impl<M> NcclDistributedDataParallel<M> {
    /// The wrapped model.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped model, mutably.
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// The group.
    pub fn group(&self) -> &NcclGroup {
        &self.group
    }

    /// Skips the gradient reduction while the guard lives, like
    /// `with ddp.no_sync():`.
    pub fn no_sync(&self) -> NcclNoSync<'_> {
        let mut s = lock(&self.state);
        let prev = s.sync;
        s.sync = false;
        NcclNoSync {
            state: &self.state,
            prev,
        }
    }
}

/// The guard of [`NcclDistributedDataParallel::no_sync`].
pub struct NcclNoSync<'a> {
    state: &'a Arc<Mutex<State>>,
    prev: bool,
}

impl std::fmt::Debug for NcclNoSync<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclNoSync")
    }
}

impl Drop for NcclNoSync<'_> {
    fn drop(&mut self) {
        lock(self.state).sync = self.prev;
    }
}

impl<M> Drop for NcclDistributedDataParallel<M> {
    fn drop(&mut self) {
        for h in self.hooks.drain(..) {
            h.remove();
        }
    }
}

impl<M: Module> Module for NcclDistributedDataParallel<M> {
    fn visit<V: Visitor>(&self, cx: &mut Cx, v: &mut V) {
        self.module.visit(cx, v);
    }

    fn visit_mut<V: VisitorMut>(&mut self, cx: &mut Cx, v: &mut V) {
        self.module.visit_mut(cx, v);
    }

    fn describe(&self) -> Option<ReprNode> {
        self.module.describe()
    }
}

impl<X, Y, M: Module + Forward<X, Y>> Forward<X, Y> for NcclDistributedDataParallel<M> {
    fn try_forward(&self, x: X) -> forma_core::Result<Y> {
        let sync = {
            let mut s = lock(&self.state);
            // A backward that failed part-way dropped its end-of-backward
            // callback: start the next one clean.
            if s.queued {
                s.error = None;
                s.reset();
            }
            s.sync
        };
        if sync && self.options.broadcast_buffers && self.group.world_size() > 1 {
            let mut c = Collect {
                group: &self.group,
                found: Vec::new(),
                seen: Vec::new(),
                buffers_only: true,
                collect: false,
                err: None,
            };
            self.module.visit(&mut Cx::new(), &mut c);
            if let Some(e) = c.err {
                return Err(to_core(e));
            }
        }
        self.module.try_forward(x)
    }
}
