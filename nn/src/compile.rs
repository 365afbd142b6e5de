//! `compile`: a model's forward captured once per input signature and
//! replayed from the graph, like `torch.compile` (the first stage: capture,
//! cache and replay; the graph passes that make a plan faster than eager
//! build on it).
//!
//! ```
//! use forma::prelude::*;
//! use forma::nn::layers::{Linear, Relu};
//!
//! #[derive(Module, Sequential)]
//! #[sequential(input = [B, 4], output = [B, 2])]
//! struct Mlp {
//!     fc1: Linear<4, 8>,
//!     act: Relu,
//!     fc2: Linear<8, 2>,
//! }
//!
//! let mut rng = Rng::seed_from(0);
//! let model = Mlp { fc1: Linear::new(&Cpu, &mut rng), act: Relu, fc2: Linear::new(&Cpu, &mut rng) };
//! let eager = model.forward(Tensor::<(Dyn, C<4>)>::ones_on((Dyn(3), C), &Cpu)).to_vec();
//! let compiled = forma::compile(model);
//! let y = compiled.forward(Tensor::<(Dyn, C<4>)>::ones_on((Dyn(3), C), &Cpu));
//! assert_eq!(y.to_vec(), eager);
//! // Another batch size reuses the graph: its sizes are symbolic.
//! let _ = compiled.forward(Tensor::<(Dyn, C<4>)>::ones_on((Dyn(5), C), &Cpu));
//! let s = compiled.stats();
//! assert_eq!((s.compiles, s.cache_hits, s.fallbacks), (1, 1, 0));
//! ```
//!
//! **What a call does.** The signature of a call is the element type and
//! rank of each input, the device and train/eval. The first call with a
//! signature captures the forward ([`crate::capture`]: the `Dyn` sizes stay
//! symbolic, so one graph serves every batch size and sequence length, a
//! first call with a batch of one included),
//! checks that every op has a replay form, and caches the result; later
//! calls replay the graph: each node runs the op the forward ran, on the
//! parameters the model holds at the call (an optimizer step, a
//! `load_state_dict` are seen), so outputs and gradients are the eager
//! ones, bit for bit. The cache holds [`CompileOptions::cache_size`]
//! signatures; the oldest goes first.
//!
//! What replays: the zoo's models (MLP, LeNet, ResNet in eval mode,
//! transformer encoders, BERT, GPT-2, LSTM and GRU stacks from a zero
//! state), each tested against eager, outputs and gradients bit for bit.
//!
//! **Graph breaks.** A forward capture cannot follow (a host read of
//! values computed from the input, an op with no graph or replay form, a
//! model in training mode with dropout, BatchNorm updating its running
//! statistics in training mode) runs eagerly for that signature;
//! [`Compiled::explain`] lists each such signature with the reason and
//! the module path, and [`CompileStats::fallbacks`] counts the calls.
//! `compile` never changes a result: [`Compiled::eager`] is the model
//! itself, and [`Compiled::into_inner`] gives it back.
//!
//! **Passes.** Elementwise fusion: each chain of elementwise nodes whose
//! intermediates nothing else reads (a batch norm in eval mode, a residual
//! add and a ReLU: five ops) is one node, which runs in one pass over
//! memory where no gradient is wanted, each op rounding as it does alone
//! ([`CompileStats::fused_nodes`]; values unchanged, bit for bit; with a
//! gradient wanted the ops run one by one, on the tape). Weights
//! pre-packed: in inference, a `linear` runs on its weight packed once for
//! the GEMM instead of at every call, until an optimizer step or a load
//! writes the weight ([`CompileStats::packed_weights`]; values unchanged,
//! bit for bit).
//!
//! **Not yet.** Matmul epilogues, memory planning and BatchNorm folding;
//! a training step replays the eager ops one by one (one tape node each);
//! a break sends the whole forward to eager rather than only the part
//! around it.

use crate::capture::capture;
use crate::module::{Cx, Forward, Module, ReprNode, Role, Visitor, VisitorMut};
use forma_core::device::Device;
use forma_core::graph::{Replay, Slot, Slots, Traced};
use forma_core::{Backend, DType, Dtype, Error, Float, Result, Shape, Tensor, TensorData};
use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Options of [`compile_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    /// How many input signatures keep their graph (default 8), like
    /// `torch._dynamo.config.cache_size_limit`.
    pub cache_size: usize,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions { cache_size: 8 }
    }
}

/// What a [`Compiled`] model has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Signatures captured (graphs made, or found to break).
    pub compiles: usize,
    /// Calls that replayed a cached graph.
    pub cache_hits: usize,
    /// Calls that ran eagerly because their signature's forward breaks.
    pub fallbacks: usize,
    /// Weights the cached graphs hold packed for the GEMM (the pass
    /// "weights pre-packed", which runs where no gradient is wanted).
    pub packed_weights: usize,
    /// Fused nodes in the cached graphs (the pass "elementwise fusion":
    /// each runs a chain of elementwise ops in one pass where no gradient
    /// is wanted).
    pub fused_nodes: usize,
}

/// A signature whose forward runs eagerly, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphBreak {
    /// The signature, written like `f32[_, _], train`.
    pub signature: String,
    /// Why capture or replay could not follow the forward (with the module
    /// path where the op ran).
    pub reason: String,
}

/// A call's signature: each input's dtype and rank, the device, train/eval.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    inputs: Vec<(DType, usize)>,
    device: String,
    training: bool,
}

impl Key {
    fn describe(&self) -> String {
        let ins: Vec<String> = self
            .inputs
            .iter()
            .map(|(d, r)| {
                let d = format!("{d:?}").to_lowercase();
                format!("{d}[{}]", vec!["_"; *r].join(", "))
            })
            .collect();
        format!(
            "{} on {}, {}",
            ins.join(", "),
            self.device,
            if self.training { "train" } else { "eval" }
        )
    }
}

/// A cached signature: a graph to replay (a `Replay<E, D>`), or a break.
#[derive(Clone)]
enum Entry {
    Plan(Arc<dyn Any + Send + Sync>),
    Break(String),
}

#[derive(Default)]
struct Cache {
    entries: Vec<(Key, Entry)>,
    stats: CompileStats,
}

/// A model whose forward is captured and replayed; see the module docs.
///
/// It is a [`Module`] with the model's parameters and `state_dict` keys
/// (an optimizer built from it trains the model), and a [`Forward`] for
/// every input and output its model has that capture can read.
pub struct Compiled<M> {
    model: M,
    options: CompileOptions,
    cache: Mutex<Cache>,
}

impl<M: std::fmt::Debug> std::fmt::Debug for Compiled<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("model", &self.model)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Compiles `model` with the default options, like `torch.compile(model)`.
pub fn compile<M: Module>(model: M) -> Compiled<M> {
    compile_with(model, CompileOptions::default())
}

/// Compiles `model` with `options`.
pub fn compile_with<M: Module>(model: M, options: CompileOptions) -> Compiled<M> {
    Compiled {
        model,
        options,
        cache: Mutex::new(Cache::default()),
    }
}

impl<M> Compiled<M> {
    /// The model, to run eagerly (the rollback: same parameters, no graph).
    pub fn eager(&self) -> &M {
        &self.model
    }

    /// The model, mutably (the cache stays valid: graphs read the
    /// parameters at each call).
    pub fn eager_mut(&mut self) -> &mut M {
        &mut self.model
    }

    /// The model back, without its graphs.
    pub fn into_inner(self) -> M {
        self.model
    }

    /// The counters so far.
    pub fn stats(&self) -> CompileStats {
        let c = self.lock();
        let mut stats = c.stats;
        let plans = || {
            c.entries.iter().filter_map(|(_, e)| match e {
                Entry::Plan(p) => Some(plan_counts(p.as_ref())),
                Entry::Break(_) => None,
            })
        };
        stats.packed_weights = plans().map(|(packed, _)| packed).sum();
        stats.fused_nodes = plans().map(|(_, fused)| fused).sum();
        stats
    }

    /// Every cached signature whose forward runs eagerly, with the reason.
    pub fn explain(&self) -> Vec<GraphBreak> {
        self.lock()
            .entries
            .iter()
            .filter_map(|(k, e)| match e {
                Entry::Break(reason) => Some(GraphBreak {
                    signature: k.describe(),
                    reason: reason.clone(),
                }),
                Entry::Plan(_) => None,
            })
            .collect()
    }

    /// Drops every cached graph (the next call of each signature captures
    /// again) and zeroes the counters.
    pub fn reset(&self) {
        *self.lock() = Cache::default();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // A panic while the lock was held leaves a cache that is still whole.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<M: Module> Module for Compiled<M> {
    fn visit<V: Visitor>(&self, cx: &mut Cx, v: &mut V) {
        self.model.visit(cx, v);
    }

    fn visit_mut<V: VisitorMut>(&mut self, cx: &mut Cx, v: &mut V) {
        self.model.visit_mut(cx, v);
    }

    fn describe(&self) -> Option<ReprNode> {
        self.model.describe()
    }
}

/// How many weights plan `p` (a `Replay` of f32 or f64 on a device this
/// crate knows) holds packed, and how many fused nodes it runs.
fn plan_counts(p: &(dyn Any + Send + Sync)) -> (usize, usize) {
    macro_rules! on {
        ($($e:ty, $d:ty);*) => {
            $(if let Some(r) = p.downcast_ref::<Replay<$e, $d>>() {
                return (r.packed_weights(), r.fused_nodes_made());
            })*
        };
    }
    on!(f32, forma_cpu::Cpu; f64, forma_cpu::Cpu);
    (0, 0)
}

/// The float type of a graph: that of its first float value.
fn graph_float(g: &forma_core::graph::Graph) -> Option<DType> {
    g.values
        .iter()
        .map(|v| v.dtype)
        .find(|d| matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16))
}

impl<M, X, Y> Forward<X, Y> for Compiled<M>
where
    M: Module + Forward<X, Y>,
    X: Traced + Slots + Clone,
    Y: Traced + Slots<Device = X::Device>,
    X::Device: Device<f32> + Device<f64>,
{
    fn try_forward(&self, x: X) -> Result<Y> {
        let traced = x.traced();
        let key = Key {
            inputs: traced
                .iter()
                .map(|(v, dynamic)| (v.dtype(), dynamic.len()))
                .collect(),
            device: x.device().name(),
            training: self.model.is_training(),
        };
        let found = {
            let mut c = self.lock();
            let hit = c
                .entries
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, e)| e.clone());
            match &hit {
                Some(Entry::Plan(_)) => c.stats.cache_hits += 1,
                Some(Entry::Break(_)) => c.stats.fallbacks += 1,
                None => {}
            }
            hit
        };
        let entry = match found {
            Some(e) => e,
            None => {
                let e = self.compile_signature(x.clone());
                let mut c = self.lock();
                c.stats.compiles += 1;
                if matches!(e, Entry::Break(_)) {
                    c.stats.fallbacks += 1;
                }
                if c.entries.len() >= self.options.cache_size.max(1) {
                    c.entries.remove(0);
                }
                c.entries.push((key, e.clone()));
                e
            }
        };
        match entry {
            Entry::Break(_) => self.model.try_forward(x),
            Entry::Plan(plan) => {
                if let Some(p) = plan.downcast_ref::<Replay<f32, X::Device>>() {
                    self.replay(p, &x)
                } else if let Some(p) = plan.downcast_ref::<Replay<f64, X::Device>>() {
                    self.replay(p, &x)
                } else {
                    self.model.try_forward(x)
                }
            }
        }
    }
}

impl<M: Module> Compiled<M> {
    /// Captures the forward on `x` and prepares its replay, or says why not.
    fn compile_signature<X, Y>(&self, x: X) -> Entry
    where
        M: Forward<X, Y>,
        X: Traced + Slots,
        Y: Traced,
        X::Device: Device<f32> + Device<f64>,
    {
        let device = x.device();
        // Capture runs the forward (twice): a module in training mode may
        // update buffers (BatchNorm's running statistics) as it runs, so
        // they are put back as they were before the call runs for real.
        let buffers = match buffers(&self.model) {
            Ok(b) => b,
            Err(e) => return Entry::Break(e.to_string()),
        };
        let captured = capture(&self.model, x);
        if let Err(e) = restore(&self.model, &buffers) {
            return Entry::Break(e.to_string());
        }
        let made = captured.and_then(|g| match graph_float(&g) {
            Some(DType::F64) => Replay::<f64, X::Device>::new(g, &device)
                .map(|p| Arc::new(p) as Arc<dyn Any + Send + Sync>),
            Some(DType::F32) | None => Replay::<f32, X::Device>::new(g, &device)
                .map(|p| Arc::new(p) as Arc<dyn Any + Send + Sync>),
            Some(d) => Err(Error::invalid(
                "compile",
                format!("a {d} graph (replay runs f32 and f64 graphs)"),
            )),
        });
        match made {
            Ok(p) => Entry::Plan(p),
            Err(e) => Entry::Break(e.to_string()),
        }
    }

    /// Replays `plan` on `x` with the model's parameters as they are now.
    fn replay<E: Float, X, Y>(&self, plan: &Replay<E, X::Device>, x: &X) -> Result<Y>
    where
        X: Slots,
        Y: Slots<Device = X::Device>,
        X::Device: Device<E>,
    {
        let mut inputs = Vec::new();
        x.slots::<E>(&mut inputs)?;
        let wanted: HashSet<&str> = plan.graph().params().map(|(k, _)| k).collect();
        struct Bind<'a, E: Float, D: Backend> {
            wanted: &'a HashSet<&'a str>,
            slots: HashMap<String, Slot<E, D>>,
            error: Option<Error>,
        }
        impl<E: Float, D2: Backend> Visitor for Bind<'_, E, D2> {
            fn tensor<S: Shape, X: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, X, D>) {
                let path = cx.path();
                if !self.wanted.contains(path) {
                    return;
                }
                let any: &dyn Any = t;
                match any.downcast_ref::<Tensor<S, X, D2>>().map(Slot::of) {
                    Some(Ok(s)) => {
                        self.slots.insert(path.to_string(), s);
                    }
                    Some(Err(e)) => self.error = self.error.take().or(Some(e)),
                    None => {}
                }
            }
        }
        let mut bind = Bind::<E, X::Device> {
            wanted: &wanted,
            slots: HashMap::new(),
            error: None,
        };
        self.model.visit(&mut Cx::new(), &mut bind);
        if let Some(e) = bind.error {
            return Err(e);
        }
        let outs = plan.run(inputs, &mut |k| bind.slots.remove(k))?;
        Y::from_slots(&mut outs.into_iter())
    }
}

/// A copy of every buffer of `model`, by path.
fn buffers<M: Module>(model: &M) -> Result<HashMap<String, TensorData>> {
    struct Copy(HashMap<String, TensorData>, Option<Error>);
    impl Visitor for Copy {
        fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, D>) {
            if cx.role() != Role::Parameter && self.1.is_none() {
                match t.try_to_data() {
                    Ok(d) => {
                        self.0.insert(cx.path().to_string(), d);
                    }
                    Err(e) => self.1 = Some(e),
                }
            }
        }
    }
    let mut c = Copy(HashMap::new(), None);
    model.visit(&mut Cx::new(), &mut c);
    c.1.map_or(Ok(c.0), Err)
}

/// Writes the copies [`buffers`] made back into `model`'s buffers.
fn restore<M: Module>(model: &M, saved: &HashMap<String, TensorData>) -> Result<()> {
    struct Put<'a>(&'a HashMap<String, TensorData>, Option<Error>);
    impl Visitor for Put<'_> {
        fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, D>) {
            if let Some(d) = self.0.get(cx.path()) {
                if let Err(e) = t.try_assign_data(d) {
                    self.1.get_or_insert(e);
                }
            }
        }
    }
    let mut p = Put(saved, None);
    model.visit(&mut Cx::new(), &mut p);
    p.1.map_or(Ok(()), Err)
}
