//! [`DistributedDataParallel`]: one model replica per process, gradients
//! averaged across processes during backward, like PyTorch's
//! `torch.nn.parallel.DistributedDataParallel`.

use crate::comm::{Comm, Pending};
use crate::error::{DistError, Result};
use crate::group::ProcessGroup;
use crate::wire::Wire;
use forma_core::tape::{queue_callback, HookHandle};
use forma_core::{Backend, DType, Dtype, Float, Shape, Tensor};
use forma_cpu::Cpu;
use forma_nn::module::{downcast_ref, Cx, ReprNode, Role, Visitor, VisitorMut};
use forma_nn::state::{LoadError, LoadReport, StateDict};
use forma_nn::{Forward, Module};
use std::any::TypeId;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Options of [`DistributedDataParallel`], PyTorch's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DdpOptions {
    /// The size of a gradient bucket in megabytes (PyTorch's
    /// `bucket_cap_mb`, default 25). A parameter larger than this gets a
    /// bucket of its own.
    pub bucket_cap_mb: f64,
    /// Broadcast rank 0's buffers at every forward (default `true`).
    pub broadcast_buffers: bool,
    /// Allow a forward that leaves some parameters out of the loss (default
    /// `false`): their share of the reduction is zeros, and a parameter no
    /// rank used keeps no gradient. Without it such a backward is an error
    /// naming the parameters.
    pub find_unused_parameters: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_cap_mb: 25.0,
            broadcast_buffers: true,
            find_unused_parameters: false,
        }
    }
}

/// Writes a bucket's reduced values back into one parameter's gradient,
/// divided by the world size.
type WriteBack = Box<dyn Fn(&BucketData, usize, f64) -> Result<()> + Send>;

/// One parameter's place in the buckets.
struct Slot {
    name: String,
    bucket: usize,
    offset: usize,
    numel: usize,
    ready: bool,
    write: WriteBack,
}

#[derive(Debug)]
enum BucketData {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

struct Bucket {
    data: BucketData,
    slots: Vec<usize>,
    remaining: usize,
}

/// The per-backward state shared by the hooks and the final callback.
struct Reducer {
    comm: Arc<dyn Comm>,
    timeout: std::time::Duration,
    slots: Vec<Slot>,
    buckets: Vec<Bucket>,
    /// `false` inside [`DistributedDataParallel::no_sync`].
    sync: bool,
    find_unused: bool,
    /// The final callback is queued for the running backward.
    queued: bool,
    /// The next bucket to start (buckets start in order on every rank).
    next: usize,
    pending: Vec<Box<dyn Pending>>,
    error: Option<DistError>,
}

impl Reducer {
    /// Starts every full bucket from `next` on, in order.
    fn launch_ready(&mut self) -> Result<()> {
        while self.next < self.buckets.len() && self.buckets[self.next].remaining == 0 {
            let b = &mut self.buckets[self.next];
            let (ptr, len, wire) = match &mut b.data {
                BucketData::F32(v) => (v.as_mut_ptr().cast::<u8>(), v.len(), Wire::F32),
                BucketData::F64(v) => (v.as_mut_ptr().cast::<u8>(), v.len(), Wire::F64),
            };
            // SAFETY: the bucket's buffer is neither resized nor touched until
            // `finish` has waited for this request; the reducer (and so the
            // buffer) outlives it, and a timed-out request makes MPI unusable
            // (the job aborts before the buffer could be freed).
            let p = unsafe { self.comm.start_sum(ptr, len, wire)? };
            self.pending.push(p);
            self.next += 1;
        }
        Ok(())
    }

    /// A parameter's gradient is final for this backward: copies it into
    /// its bucket and starts the buckets that are now full.
    fn ready<S: Shape, E: Float>(&mut self, index: usize, param: &Tensor<S, E, Cpu>) -> Result<()> {
        let slot = &mut self.slots[index];
        if slot.ready {
            return Err(DistError::invalid(
                "DistributedDataParallel",
                format!("parameter `{}` got its gradient twice in one backward (a backward with retain_graph run twice without a sync?)", slot.name),
            ));
        }
        slot.ready = true;
        let (b, off, n) = (slot.bucket, slot.offset, slot.numel);
        let grad = param.grad().map(|g| g.try_to_vec()).transpose()?;
        let bucket = &mut self.buckets[b];
        match (&mut bucket.data, grad) {
            (BucketData::F32(v), Some(g)) => {
                for (d, s) in v[off..off + n].iter_mut().zip(g) {
                    *d = s.to_f64() as f32;
                }
            }
            (BucketData::F64(v), Some(g)) => {
                for (d, s) in v[off..off + n].iter_mut().zip(g) {
                    *d = s.to_f64();
                }
            }
            (BucketData::F32(v), None) => v[off..off + n].fill(0.0),
            (BucketData::F64(v), None) => v[off..off + n].fill(0.0),
        }
        bucket.remaining -= 1;
        self.launch_ready()?;
        // Give the reductions in flight a turn while backward goes on.
        for p in &mut self.pending {
            p.progress()?;
        }
        Ok(())
    }

    /// Clears what a backward that failed part-way left (its end-of-backward
    /// callback is dropped unrun then): the next backward starts clean.
    fn recover(&mut self) {
        if !self.queued {
            return;
        }
        for p in self.pending.drain(..) {
            let _ = p.wait(self.timeout);
        }
        self.error = None;
        self.reset();
    }

    /// The state before a backward: no parameter ready, no bucket started,
    /// no callback queued.
    fn reset(&mut self) {
        self.queued = false;
        for s in &mut self.slots {
            s.ready = false;
        }
        for b in &mut self.buckets {
            b.remaining = b.slots.len();
        }
        self.next = 0;
    }

    /// End of backward: waits for every bucket and writes the averaged
    /// gradients back.
    fn finish(&mut self) -> Result<()> {
        let result = self.finish_inner();
        self.pending.clear();
        self.reset();
        result
    }

    fn finish_inner(&mut self) -> Result<()> {
        if let Some(e) = self.error.take() {
            // Complete what was started, so no request outlives its bucket
            // and the other ranks are not left inside a collective.
            for p in self.pending.drain(..) {
                let _ = p.wait(self.timeout);
            }
            return Err(e);
        }
        let unused: Vec<usize> = (0..self.slots.len())
            .filter(|&i| !self.slots[i].ready)
            .collect();
        let mut used_by = None;
        if !unused.is_empty() {
            if !self.find_unused {
                // Wait for what was started, so that the other ranks are not
                // left in a collective; then report.
                for p in self.pending.drain(..) {
                    p.wait(self.timeout)?;
                }
                return Err(DistError::UnusedParameters {
                    rank: self.comm.rank(),
                    params: unused.iter().map(|&i| self.slots[i].name.clone()).collect(),
                });
            }
            for &i in &unused {
                let (b, off, n) = (
                    self.slots[i].bucket,
                    self.slots[i].offset,
                    self.slots[i].numel,
                );
                match &mut self.buckets[b].data {
                    BucketData::F32(v) => v[off..off + n].fill(0.0),
                    BucketData::F64(v) => v[off..off + n].fill(0.0),
                }
                self.buckets[b].remaining -= 1;
            }
            self.launch_ready()?;
        }
        if self.find_unused {
            // Which parameters some rank used: one small reduction, as
            // PyTorch's `local_used_map`.
            let mut used: Vec<i64> = self.slots.iter().map(|s| i64::from(s.ready)).collect();
            for &i in &unused {
                used[i] = 0;
            }
            let pending = std::mem::take(&mut self.pending);
            for p in pending {
                p.wait(self.timeout)?;
            }
            self.comm.all_reduce(
                crate::wire::BufMut::I64(&mut used),
                crate::ReduceOp::Sum,
                self.timeout,
            )?;
            used_by = Some(used);
        }
        for p in self.pending.drain(..) {
            p.wait(self.timeout)?;
        }
        let world = self.comm.size() as f64;
        for (i, s) in self.slots.iter().enumerate() {
            if used_by.as_ref().is_some_and(|u| u[i] == 0) {
                continue;
            }
            (s.write)(&self.buckets[s.bucket].data, s.offset, world)?;
        }
        Ok(())
    }
}

fn lock(r: &Mutex<Reducer>) -> MutexGuard<'_, Reducer> {
    r.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Wraps a model for data-parallel training, like PyTorch's
/// `DistributedDataParallel`.
///
/// How it works, as in PyTorch's reducer:
///
/// - At construction every rank checks that the others hold the same
///   parameters (names, sizes, dtypes), then takes rank 0's parameters and
///   buffers, so every replica starts equal.
/// - Parameters are grouped into buckets of about
///   [`DdpOptions::bucket_cap_mb`] megabytes, in reverse order (the order in
///   which backward usually produces their gradients).
/// - A post-accumulate-grad hook on each parameter copies its gradient into
///   its bucket; when a bucket is full it starts a non-blocking sum across
///   the ranks, while backward goes on computing the next gradients.
///   Buckets start in one fixed order on every rank, as MPI requires.
/// - When backward ends, a callback waits for every bucket and writes each
///   parameter's averaged gradient (sum / world size) back, so the
///   optimizer step that follows sees the same gradient on every rank.
/// - Each forward first broadcasts rank 0's buffers (BatchNorm's running
///   statistics), PyTorch's `broadcast_buffers=True`.
///
/// One difference from PyTorch: every backward that reaches the parameters
/// reduces their gradients (outside [`DistributedDataParallel::no_sync`]),
/// whether the loss came from the wrapper's forward or from the module's
/// own; PyTorch reduces only after a forward through the wrapper.
///
/// ```
/// use forma::prelude::*;
/// use forma_distributed::{DistributedDataParallel, ProcessGroup};
/// use forma::nn::layers::Linear;
///
/// // Under `mpirun -np N`, `forma_distributed::init()` gives the N-process
/// // group; run alone it is this single process, and DDP changes nothing.
/// let world = ProcessGroup::single();
/// let net = Linear::<4, 2>::new(&Cpu, &mut Rng::seed_from(0));
/// let ddp = DistributedDataParallel::new(net, &world)?;
/// let x = Tensor::<(Dyn, C<4>)>::ones_on((Dyn(8), C), &Cpu);
/// let loss = ddp.forward(x).square().mean_all();
/// loss.backward(); // gradients averaged over the ranks here
/// assert!(ddp.module().weight.grad().is_some());
/// # Ok::<(), forma_distributed::DistError>(())
/// ```
pub struct DistributedDataParallel<M> {
    module: M,
    group: ProcessGroup,
    /// `group` without the per-call size check, for the buffer broadcasts.
    quiet: ProcessGroup,
    reducer: Arc<Mutex<Reducer>>,
    hooks: Vec<HookHandle>,
    options: DdpOptions,
}

impl<M> std::fmt::Debug for DistributedDataParallel<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = lock(&self.reducer);
        f.debug_struct("DistributedDataParallel")
            .field("rank", &self.group.rank())
            .field("world_size", &self.group.world_size())
            .field("parameters", &r.slots.len())
            .field("buckets", &r.buckets.len())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A parameter found by the constructor's walk.
struct Found {
    name: String,
    numel: usize,
    wire: Wire,
    register: Box<dyn FnOnce(Arc<Mutex<Reducer>>, usize) -> Result<(HookHandle, WriteBack)>>,
}

/// Collects the parameters that require a gradient, once each.
struct Collect {
    found: Vec<Found>,
    seen: Vec<usize>,
    layout: String,
    err: Option<DistError>,
}

impl Collect {
    fn add<S: Shape, E: Float>(&mut self, cx: &Cx, t: &Tensor<S, E, Cpu>) {
        let Some(var) = t.tape_var() else { return };
        let key = Arc::as_ptr(&var) as *const () as usize;
        if self.seen.contains(&key) {
            return;
        }
        self.seen.push(key);
        let wire = if E::DTYPE == DType::F64 {
            Wire::F64
        } else {
            Wire::F32
        };
        let param = t.clone();
        self.found.push(Found {
            name: cx.path().to_string(),
            numel: t.numel(),
            wire,
            register: Box::new(move |reducer: Arc<Mutex<Reducer>>, index: usize| {
                let hook_reducer = Arc::clone(&reducer);
                let handle = param.try_register_post_accumulate_grad_hook(
                    move |p: &Tensor<S, E, Cpu>| {
                        on_ready(&hook_reducer, index, p);
                    },
                )?;
                let write: WriteBack =
                    Box::new(move |data: &BucketData, off: usize, world: f64| {
                        let n = param.numel();
                        let values: Vec<E> = match data {
                            BucketData::F32(v) => v[off..off + n]
                                .iter()
                                .map(|&x| E::from_f64(x as f64 / world))
                                .collect(),
                            BucketData::F64(v) => v[off..off + n]
                                .iter()
                                .map(|&x| E::from_f64(x / world))
                                .collect(),
                        };
                        let g = Tensor::<S, E, Cpu>::from_vec_on(values, param.shape(), &Cpu)?;
                        param.try_set_grad(&g)?;
                        Ok(())
                    });
                Ok((handle, write))
            }),
        });
    }
}

/// The hook body: errors are kept for the final callback, which returns them
/// from `backward`.
fn on_ready<S: Shape, E: Float>(
    reducer: &Arc<Mutex<Reducer>>,
    index: usize,
    p: &Tensor<S, E, Cpu>,
) {
    let mut r = lock(reducer);
    if !r.sync {
        return;
    }
    if !r.queued {
        let for_callback = Arc::clone(reducer);
        match queue_callback(move || lock(&for_callback).finish().map_err(to_core)) {
            Ok(()) => r.queued = true,
            Err(e) => {
                r.error.get_or_insert(DistError::Tensor(e));
                return;
            }
        }
    }
    if let Err(e) = r.ready(index, p) {
        r.error.get_or_insert(e);
    }
}

/// A distributed error as the tensor library's error (what `backward` and
/// `forward` return).
pub(crate) fn to_core(e: DistError) -> forma_core::Error {
    match e {
        DistError::Tensor(e) => e,
        other => forma_core::Error::invalid("distributed", other.to_string()),
    }
}

impl Visitor for Collect {
    fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, D>) {
        self.layout += &format!(
            "{}:{:?}:{};",
            cx.path(),
            &t.dims()[..],
            E::DTYPE.torch_name()
        );
        if cx.role() != Role::Parameter || self.err.is_some() {
            return;
        }
        if TypeId::of::<D>() != TypeId::of::<Cpu>() {
            self.err = Some(DistError::invalid(
                "DistributedDataParallel",
                format!(
                    "parameter `{}` is on {}; the MPI backend reduces CPU tensors",
                    cx.path(),
                    t.device().name()
                ),
            ));
        } else if let Some(t) = downcast_ref::<S, E, D, f32, Cpu>(t) {
            self.add(cx, t);
        } else if let Some(t) = downcast_ref::<S, E, D, f64, Cpu>(t) {
            self.add(cx, t);
        } else if let Some(t) = downcast_ref::<S, E, D, half::f16, Cpu>(t) {
            self.add(cx, t);
        } else if let Some(t) = downcast_ref::<S, E, D, half::bf16, Cpu>(t) {
            self.add(cx, t);
        }
    }
}

/// Broadcasts every tensor (parameters and buffers, or buffers only) from rank 0.
struct Broadcast<'a> {
    group: &'a ProcessGroup,
    buffers_only: bool,
    err: Option<DistError>,
}

impl Visitor for Broadcast<'_> {
    fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, D>) {
        if self.err.is_some() || (self.buffers_only && cx.role() == Role::Parameter) {
            return;
        }
        let Some(t) = downcast_ref::<S, E, D, E, Cpu>(t) else {
            self.err = Some(DistError::invalid(
                "DistributedDataParallel",
                format!(
                    "`{}` is on {}; the MPI backend broadcasts CPU tensors",
                    cx.path(),
                    t.device().name()
                ),
            ));
            return;
        };
        if let Err(e) = self.group.broadcast(t, 0) {
            self.err = Some(e);
        }
    }
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wraps `module` with the default [`DdpOptions`]. Every rank of `group`
    /// calls it with the same architecture.
    ///
    /// # Errors
    /// As [`DistributedDataParallel::with_options`].
    pub fn new(module: M, group: &ProcessGroup) -> Result<Self> {
        Self::with_options(module, group, DdpOptions::default())
    }

    /// Wraps `module`: checks that every rank holds the same parameters,
    /// copies rank 0's parameters and buffers to the others, and installs
    /// the gradient hooks.
    ///
    /// # Errors
    /// Ranks whose models differ ([`DistError::Mismatch`], each rank's
    /// parameter count), a parameter that is not on the CPU, a bucket size
    /// that is not positive, a communication failure.
    pub fn with_options(module: M, group: &ProcessGroup, options: DdpOptions) -> Result<Self> {
        if options.bucket_cap_mb.is_nan() || options.bucket_cap_mb <= 0.0 {
            return Err(DistError::invalid(
                "DistributedDataParallel",
                format!(
                    "bucket_cap_mb must be positive, not {}",
                    options.bucket_cap_mb
                ),
            ));
        }
        let mut collect = Collect {
            found: Vec::new(),
            seen: Vec::new(),
            layout: String::new(),
            err: None,
        };
        module.visit(&mut Cx::new(), &mut collect);
        if let Some(e) = collect.err {
            return Err(e);
        }
        verify_same_model(group, &collect.layout, collect.found.len())?;
        let mut bc = Broadcast {
            group,
            buffers_only: false,
            err: None,
        };
        module.visit(&mut Cx::new(), &mut bc);
        if let Some(e) = bc.err {
            return Err(e);
        }
        // Buckets in reverse parameter order, one wire type each, closed once
        // they reach the cap (PyTorch's `compute_bucket_assignment_by_size`).
        let cap = (options.bucket_cap_mb * 1024.0 * 1024.0) as usize;
        let mut plan: Vec<(Wire, Vec<usize>, usize)> = Vec::new(); // (wire, slots, elements)
        let mut open: Vec<(Wire, Vec<usize>, usize)> = Vec::new();
        for i in (0..collect.found.len()).rev() {
            let f = &collect.found[i];
            let at = match open.iter().position(|(w, _, _)| *w == f.wire) {
                Some(at) => at,
                None => {
                    open.push((f.wire, Vec::new(), 0));
                    open.len() - 1
                }
            };
            open[at].1.push(i);
            open[at].2 += f.numel;
            if open[at].2 * f.wire.size() >= cap {
                plan.push(open.remove(at));
            }
        }
        plan.extend(open);
        // Reduced in the order their first gradient usually arrives.
        plan.sort_by_key(|(_, slots, _)| std::cmp::Reverse(slots[0]));
        let mut place = vec![(0usize, 0usize); collect.found.len()];
        for (b, (_, slots, _)) in plan.iter().enumerate() {
            let mut off = 0;
            for &i in slots {
                place[i] = (b, off);
                off += collect.found[i].numel;
            }
        }
        let buckets = plan
            .into_iter()
            .map(|(wire, slots, n)| Bucket {
                data: match wire {
                    Wire::F64 => BucketData::F64(vec![0.0; n]),
                    _ => BucketData::F32(vec![0.0; n]),
                },
                remaining: slots.len(),
                slots,
            })
            .collect();
        let reducer = Arc::new(Mutex::new(Reducer {
            comm: Arc::clone(group.comm()),
            timeout: group.timeout(),
            slots: Vec::new(),
            buckets,
            sync: true,
            find_unused: options.find_unused_parameters,
            queued: false,
            next: 0,
            pending: Vec::new(),
            error: None,
        }));
        let mut hooks = Vec::new();
        let mut slots = Vec::new();
        for (i, f) in collect.found.into_iter().enumerate() {
            let (handle, write) = (f.register)(Arc::clone(&reducer), i)?;
            hooks.push(handle);
            slots.push(Slot {
                name: f.name,
                bucket: place[i].0,
                offset: place[i].1,
                numel: f.numel,
                ready: false,
                write,
            });
        }
        lock(&reducer).slots = slots;
        Ok(DistributedDataParallel {
            module,
            group: group.clone(),
            // Sizes were compared once above; per-step broadcasts skip it.
            quiet: group.clone().check_sizes(false),
            reducer,
            hooks,
            options,
        })
    }
}

/// Compares the ranks' parameter layouts (names, sizes, dtypes) by hash.
fn verify_same_model(group: &ProcessGroup, layout: &str, params: usize) -> Result<()> {
    if group.world_size() == 1 {
        return Ok(());
    }
    let mut h = DefaultHasher::new();
    layout.hash(&mut h);
    let mut mine = [h.finish() as i64, params as i64];
    let mut all = vec![0i64; 2 * group.world_size()];
    group.comm().all_gather(
        crate::wire::BufMut::I64(&mut mine),
        crate::wire::BufMut::I64(&mut all),
        group.timeout(),
    )?;
    if all.chunks(2).all(|c| c == mine) {
        return Ok(());
    }
    Err(DistError::Mismatch {
        collective: "DistributedDataParallel (the ranks' models differ)",
        per_rank: all
            .chunks(2)
            .map(|c| format!("{} parameters, layout hash {:016x}", c[1], c[0] as u64))
            .collect(),
    })
}

impl<M> DistributedDataParallel<M> {
    /// The wrapped model, like `ddp.module`.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped model, mutably.
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// The process group.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// The options it was built with.
    pub fn options(&self) -> DdpOptions {
        self.options
    }

    /// How many gradient buckets there are, and the parameters (by
    /// state_dict name) in each, in the order they are reduced.
    pub fn buckets(&self) -> Vec<Vec<String>> {
        let r = lock(&self.reducer);
        r.buckets
            .iter()
            .map(|b| b.slots.iter().map(|&i| r.slots[i].name.clone()).collect())
            .collect()
    }

    /// Skips the gradient reduction while the guard lives, like
    /// `with ddp.no_sync():`, for gradient accumulation: backwards inside
    /// only accumulate locally; the first backward after it reduces the
    /// accumulated gradients. The forwards inside skip the buffer broadcast.
    pub fn no_sync(&self) -> NoSync<'_> {
        let mut r = lock(&self.reducer);
        let prev = r.sync;
        r.sync = false;
        NoSync {
            reducer: &self.reducer,
            prev,
        }
    }

    /// Unwraps the model (the hooks are removed).
    pub fn into_inner(mut self) -> M
    where
        M: Default,
    {
        std::mem::take(&mut self.module)
    }
}

impl<M: Module> DistributedDataParallel<M> {
    /// Loads a state_dict strictly, accepting PyTorch DDP checkpoints whose
    /// keys all start with `module.` (the prefix is stripped), like
    /// `ddp.module.load_state_dict(consume_prefix(sd, "module."))`.
    ///
    /// # Errors
    /// As [`Module::load_state_dict`].
    pub fn load_state_dict(
        &mut self,
        sd: &StateDict,
    ) -> std::result::Result<LoadReport, LoadError> {
        self.module.load_state_dict(&strip_module_prefix(sd))
    }
}

/// `sd` without the `module.` prefix that PyTorch's DDP puts on every key,
/// when every key has it; otherwise `sd` unchanged.
pub fn strip_module_prefix(sd: &StateDict) -> StateDict {
    const PREFIX: &str = "module.";
    if sd.is_empty() || !sd.keys().all(|k| k.starts_with(PREFIX)) {
        return sd.clone();
    }
    let mut out = StateDict::new();
    for (k, v) in sd.iter() {
        out.insert(k[PREFIX.len()..].to_string(), v.clone());
    }
    out
}

/// The guard of [`DistributedDataParallel::no_sync`].
#[derive(Debug)]
pub struct NoSync<'a> {
    reducer: &'a Arc<Mutex<Reducer>>,
    prev: bool,
}

impl Drop for NoSync<'_> {
    fn drop(&mut self) {
        lock(self.reducer).sync = self.prev;
    }
}

impl std::fmt::Debug for Reducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reducer")
            .field("buckets", &self.buckets.len())
            .finish_non_exhaustive()
    }
}

impl<M> Drop for DistributedDataParallel<M> {
    fn drop(&mut self) {
        for h in self.hooks.drain(..) {
            h.remove();
        }
    }
}

impl<M: Module> Module for DistributedDataParallel<M> {
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

impl<X, Y, M: Module + Forward<X, Y>> Forward<X, Y> for DistributedDataParallel<M> {
    fn try_forward(&self, x: X) -> forma_core::Result<Y> {
        let sync = {
            let mut r = lock(&self.reducer);
            r.recover();
            r.sync
        };
        if sync && self.options.broadcast_buffers && self.group.world_size() > 1 {
            let mut bc = Broadcast {
                group: &self.quiet,
                buffers_only: true,
                err: None,
            };
            self.module.visit(&mut Cx::new(), &mut bc);
            if let Some(e) = bc.err {
                return Err(to_core(e));
            }
        }
        self.module.try_forward(x)
    }
}
