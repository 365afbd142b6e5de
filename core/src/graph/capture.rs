//! The recorder behind [`Capture`]: a per-thread graph under construction,
//! and the hooks core ops call while it is on.

use super::dim::Dim;
use super::op::{reshape_dims, Op};
use super::{Graph, Node, Source, Symbol, Value, ValueId};
use crate::device::Backend;
use crate::dtype::{DType, Dtype};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::shape::Shape;
use crate::tensor::{Tensor, TensorData};
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Weak};

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static REC: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// Whether a capture is running on this thread: the one check an op makes
/// before it notes itself.
#[inline]
pub fn capturing() -> bool {
    ON.with(Cell::get)
}

type Key = (usize, Layout);

/// A tensor as capture sees it: its storage and view (its identity), its
/// dtype, and a way to read its values (for a constant).
#[derive(Clone)]
pub struct Val {
    key: Key,
    dtype: DType,
    keep: Arc<dyn Any + Send + Sync>,
    read: Arc<dyn Fn() -> Result<TensorData> + Send + Sync>,
}

impl fmt::Debug for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Val")
            .field("dtype", &self.dtype)
            .field("dims", &self.key.1.dims)
            .finish()
    }
}

impl Val {
    fn dims(&self) -> &[usize] {
        &self.key.1.dims
    }

    /// The tensor's element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

/// What capture can read a forward's inputs and outputs from: a tensor,
/// or tuples and vectors of them.
pub trait Traced: Sized {
    /// Every tensor, in order, with which of its sizes are `Dyn`.
    fn traced(&self) -> Vec<(Val, Vec<bool>)>;

    /// A copy whose tensor `k` (in [`Traced::traced`] order, counted by
    /// `next`) has axis `a` longer by `extra[k][a]`, the new positions
    /// repeating the last one: the second example a capture checks itself
    /// against.
    ///
    /// # Errors
    /// When a tensor to grow is empty or cannot be read.
    fn grown(&self, extra: &[Vec<usize>], next: &mut usize) -> Result<Self>;
}

/// `d` with axis `a` longer by `extra[a]`, repeating its last position.
fn grow_data(d: &TensorData, extra: &[usize]) -> Result<TensorData> {
    let dims = d.dims();
    if extra.iter().any(|&e| e > 0) && dims.contains(&0) {
        return Err(Error::invalid(
            "capture",
            "an example input is empty: give one with every size at least 1",
        ));
    }
    let size = crate::tensor::dtype_size(d.dtype());
    let new: Vec<usize> = dims.iter().zip(extra).map(|(n, e)| n + e).collect();
    let mut strides = vec![1usize; dims.len()];
    for a in (0..dims.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * dims[a + 1];
    }
    let total: usize = new.iter().product();
    let mut out = Vec::with_capacity(total * size);
    for flat in 0..total {
        let (mut rest, mut src) = (flat, 0);
        for a in (0..new.len()).rev() {
            let i = rest % new[a];
            rest /= new[a];
            src += i.min(dims[a] - 1) * strides[a];
        }
        out.extend_from_slice(&d.bytes()[src * size..(src + 1) * size]);
    }
    TensorData::from_bytes(d.dtype(), new, out)
}

impl<S: Shape, E: Dtype, D: Backend> Tensor<S, E, D> {
    /// This tensor's capture handle.
    pub fn val(&self) -> Val {
        let t = self.detach();
        Val {
            key: (
                Arc::as_ptr(&self.storage) as *const () as usize,
                self.layout,
            ),
            dtype: E::DTYPE,
            keep: self.storage.clone(),
            read: Arc::new(move || t.try_to_data()),
        }
    }
}

impl<E: Dtype, D: Backend> crate::tape::Raw<E, D> {
    /// This view's capture handle.
    pub fn val(&self) -> Val {
        let r = self.clone();
        Val {
            key: (
                Arc::as_ptr(&self.storage) as *const () as usize,
                self.layout,
            ),
            dtype: E::DTYPE,
            keep: self.storage.clone(),
            read: Arc::new(move || {
                let v = r.device.to_vec(&r.storage.read(), &r.layout)?;
                TensorData::from_vec(&v, r.layout.dims.to_vec())
            }),
        }
    }
}

impl<S: Shape, E: Dtype, D: Backend> Traced for Tensor<S, E, D> {
    fn traced(&self) -> Vec<(Val, Vec<bool>)> {
        vec![(
            self.val(),
            S::static_dims().iter().map(Option::is_none).collect(),
        )]
    }

    fn grown(&self, extra: &[Vec<usize>], next: &mut usize) -> Result<Self> {
        let k = *next;
        *next += 1;
        match extra.get(k) {
            Some(e) if e.iter().any(|&n| n > 0) => {
                let data = grow_data(&self.try_to_data()?, e)?;
                Tensor::try_from_data(&data, &self.device)
            }
            _ => Ok(self.clone()),
        }
    }
}

impl<T: Traced> Traced for Vec<T> {
    fn traced(&self) -> Vec<(Val, Vec<bool>)> {
        self.iter().flat_map(Traced::traced).collect()
    }

    fn grown(&self, extra: &[Vec<usize>], next: &mut usize) -> Result<Self> {
        self.iter().map(|t| t.grown(extra, next)).collect()
    }
}

macro_rules! traced_tuple {
    ($($t:ident $i:tt),+) => {
        impl<$($t: Traced),+> Traced for ($($t,)+) {
            fn traced(&self) -> Vec<(Val, Vec<bool>)> {
                let mut v = Vec::new();
                $(v.extend(self.$i.traced());)+
                v
            }

            fn grown(&self, extra: &[Vec<usize>], next: &mut usize) -> Result<Self> {
                Ok(($(self.$i.grown(extra, next)?,)+))
            }
        }
    };
}
traced_tuple!(A 0);
traced_tuple!(A 0, B 1);
traced_tuple!(A 0, B 1, C 2);
traced_tuple!(A 0, B 1, C 2, F 3);

struct Recorder {
    graph: Graph,
    ids: HashMap<Key, ValueId>,
    storages: HashSet<usize>,
    born: HashMap<Key, ()>,
    /// Every storage seen, weakly: a storage's memory goes when the
    /// forward drops its tensor (the capture's peak is the forward's), but
    /// its allocation stays while a weak reference does, so no later
    /// storage takes its address (the key of every value seen).
    keep: Vec<Weak<dyn Any + Send + Sync>>,
    /// Whether each value depends on an input.
    dynamic: Vec<bool>,
    env: HashMap<String, usize>,
    error: Option<Error>,
    path: fn() -> String,
}

impl Recorder {
    fn fail(&mut self, msg: String) {
        if self.error.is_none() {
            let path = (self.path)();
            let at = if path.is_empty() {
                String::new()
            } else {
                format!(" in module `{path}`")
            };
            self.error = Some(Error::invalid("capture", msg.replace("{at}", &at)));
        }
    }

    fn add_value(
        &mut self,
        v: &Val,
        dims: Vec<Dim>,
        source: Source,
        name: Option<String>,
    ) -> ValueId {
        let id = self.graph.values.len();
        self.graph.values.push(Value {
            name: name.unwrap_or_else(|| format!("v{id}")),
            dtype: v.dtype,
            dims,
            source,
        });
        self.ids.insert(v.key, id);
        self.storages.insert(v.key.0);
        self.born.remove(&v.key);
        self.keep.push(Arc::downgrade(&v.keep));
        self.dynamic.push(false);
        id
    }

    /// The value of an op's operand; a tensor from outside the capture
    /// (made before it, not a parameter) becomes a constant.
    fn resolve(&mut self, op: &str, v: &Val) -> Option<ValueId> {
        if let Some(&id) = self.ids.get(&v.key) {
            return Some(id);
        }
        if self.born.contains_key(&v.key) {
            self.fail(format!(
                "`{op}`{{at}} reads a tensor made by an op that has no graph form yet"
            ));
            return None;
        }
        if self.storages.contains(&v.key.0) {
            self.fail(format!(
                "`{op}`{{at}} reads a view (of sizes {:?}) made by a view op that has no graph form yet",
                v.dims()
            ));
            return None;
        }
        None
    }
}

/// Runs `f` on the recorder unless it is busy (a hook reached from inside
/// capture itself, such as the copy a constant's read makes).
fn with<T>(f: impl FnOnce(&mut Recorder) -> T) -> Option<T> {
    REC.with(|r| r.try_borrow_mut().ok()?.as_mut().map(f))
}

/// The operand ids of `ins`, reading outside tensors as constants (their
/// values are read with the recorder released).
fn operands(op: &str, ins: &[Val]) -> Option<Vec<ValueId>> {
    let mut ids = Vec::with_capacity(ins.len());
    for v in ins {
        match with(|r| (r.resolve(op, v), r.error.is_some()))? {
            (Some(id), _) => ids.push(id),
            (None, true) => return None,
            (None, false) => {
                ON.with(|o| o.set(false));
                let data = (v.read)();
                ON.with(|o| o.set(true));
                let id = with(|r| match data {
                    Ok(d) => {
                        let dims = d.dims().iter().map(|&n| Dim::Fixed(n)).collect();
                        let name = format!("const{}", r.graph.values.len());
                        Some(r.add_value(v, dims, Source::Constant(d), Some(name)))
                    }
                    Err(e) => {
                        r.fail(format!("reading a constant operand of `{op}`{{at}}: {e}"));
                        None
                    }
                })??;
                ids.push(id);
            }
        }
    }
    Some(ids)
}

/// Notes that `op` ran on `ins` and produced `out` (a no-op unless a
/// capture is running). Core ops call it beside their kernels; a layer
/// whose whole computation is one graph op (an RNN stack, whose time loop
/// would otherwise be recorded unrolled) calls it on its result, which
/// replaces the ops that made it.
pub fn note(op: Op, ins: &[Val], out: &Val) {
    if !capturing() {
        return;
    }
    let Some(ids) = operands(op.name(), ins) else {
        return;
    };
    with(|r| {
        let in_dims: Vec<&[Dim]> = ids.iter().map(|&i| &r.graph.values[i].dims[..]).collect();
        let Some(dims) = op.out_dims(&in_dims, out.dims()) else {
            r.fail(format!(
                "`{}`{{at}} turns a symbolic size into one capture cannot follow",
                op.name()
            ));
            return;
        };
        let got: Vec<Option<usize>> = dims.iter().map(|d| d.eval(&r.env)).collect();
        if dims.len() != out.dims().len() || got.iter().zip(out.dims()).any(|(g, &n)| *g != Some(n))
        {
            let shown: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
            r.fail(format!(
                "`{}`{{at}} made sizes {:?} but its graph rule says [{}]",
                op.name(),
                out.dims(),
                shown.join(", ")
            ));
            return;
        }
        let dynamic = ids.iter().any(|&i| r.dynamic[i]);
        let node = r.graph.nodes.len();
        let id = r.add_value(out, dims, Source::Node(node), None);
        r.dynamic[id] = dynamic;
        r.graph.nodes.push(Node {
            op,
            inputs: ids,
            output: id,
            path: (r.path)(),
        });
    });
}

/// `n` as a size of the graph: the symbol whose example value it is, when
/// exactly one symbol has that value (and it is not 1), else the number.
/// A wrong guess (a number that only happened to equal a symbol) is caught
/// by the second capture at other sizes ([`Graph::check_same_as`]).
fn size_of(n: usize, env: &HashMap<String, usize>) -> Dim {
    let syms: Vec<&String> = env
        .iter()
        .filter(|(_, &v)| v == n && n > 1)
        .map(|(k, _)| k)
        .collect();
    match syms.as_slice() {
        [one] => Dim::var(one),
        _ => Dim::Fixed(n),
    }
}

/// Notes `arange(start, start + n * step, step)` into `out`, its length
/// symbolic when it is an input's `Dyn` size.
pub(crate) fn note_arange(start: f64, step: f64, n: usize, out: &Val) {
    if !capturing() {
        return;
    }
    let Some(len) = with(|r| size_of(n, &r.env)) else {
        return;
    };
    note(Op::Arange { start, step, len }, &[], out);
}

/// The sizes of `v` as the graph knows them (`None` when `v` is unknown).
fn dims_of(v: &Val) -> Option<(Vec<Dim>, HashMap<String, usize>)> {
    with(|r| {
        let id = *r.ids.get(&v.key)?;
        Some((r.graph.values[id].dims.clone(), r.env.clone()))
    })?
}

/// Notes a reshape of `x` into `out`, writing the target sizes in terms of
/// `x`'s symbolic ones.
pub(crate) fn note_reshape(x: &Val, out: &Val) {
    if !capturing() {
        return;
    }
    let dims = match dims_of(x) {
        Some((from, env)) => match reshape_dims(&from, out.dims(), &|d| d.eval(&env)) {
            // A reshape to the same sizes (a retyping) is the same value.
            Some(d) if d == from => return alias(x, out),
            Some(d) => d,
            None => {
                with(|r| r.fail("`reshape`{at} changes the element count".into()));
                return;
            }
        },
        None => out.dims().iter().map(|&n| Dim::Fixed(n)).collect(),
    };
    note(Op::Reshape { dims }, std::slice::from_ref(x), out);
}

/// Notes an expand of `x` into `out`: an axis `x` already has keeps its
/// size; a broadcast size-1 axis takes the symbol of equal value when
/// exactly one symbol has it, else stays a number.
pub(crate) fn note_expand(x: &Val, out: &Val) {
    if !capturing() {
        return;
    }
    let target = out.dims().to_vec();
    let dims = match dims_of(x) {
        Some((from, env)) => {
            let extra = target.len() - from.len();
            target
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    if let Some(d) = i.checked_sub(extra).map(|j| &from[j]) {
                        if *d != Dim::Fixed(1) {
                            return d.clone();
                        }
                    }
                    let syms: Vec<&String> = env
                        .iter()
                        .filter(|(_, &v)| v == n && n != 1)
                        .map(|(k, _)| k)
                        .collect();
                    match syms.as_slice() {
                        [one] => Dim::var(one),
                        _ => Dim::Fixed(n),
                    }
                })
                .collect()
        }
        None => target.iter().map(|&n| Dim::Fixed(n)).collect(),
    };
    note(Op::Expand { dims }, std::slice::from_ref(x), out);
}

/// Notes `x[start..end:step]` along `axis`: a bound nearer the axis's end
/// than its start is written from the end, so `narrow(seq - 1, 1)` stays
/// the last position at every length.
pub(crate) fn note_slice(x: &Val, axis: usize, start: usize, end: usize, step: usize, out: &Val) {
    if !capturing() {
        return;
    }
    let Some((dims, env)) = dims_of(x) else {
        return note(
            Op::Slice {
                axis,
                start: Dim::Fixed(start),
                end: Dim::Fixed(end),
                step,
            },
            std::slice::from_ref(x),
            out,
        );
    };
    let n = x.dims()[axis];
    // On a symbolic axis a bound nearer the end counts from the end; on a
    // fixed one (a position table) a bound may be an input's size.
    let bound = |b: usize| match &dims[axis] {
        s @ Dim::Sym(_) if n - b < b => s.sub(&Dim::Fixed(n - b)),
        Dim::Sym(_) => Dim::Fixed(b),
        Dim::Fixed(_) => size_of(b, &env),
    };
    let op = Op::Slice {
        axis,
        start: bound(start),
        end: bound(end),
        step,
    };
    note(op, std::slice::from_ref(x), out);
}

/// Notes a tensor a kernel just made: if no op claims it, an op without a
/// graph form made it, and using it stops the capture.
pub(crate) fn born(v: &Val) {
    with(|r| {
        if !r.ids.contains_key(&v.key) {
            r.born.insert(v.key, ());
            r.keep.push(Arc::downgrade(&v.keep));
        }
    });
}

/// Notes that `op` reads `v`'s values on the host: an error when they
/// depend on the inputs (the program would branch on data).
pub(crate) fn host_read(op: &'static str, v: &Val) {
    with(|r| {
        if let Some(&id) = r.ids.get(&v.key) {
            if r.dynamic[id] {
                r.fail(format!(
                    "`{op}`{{at}} reads values computed from the inputs on the host: a \
                     data-dependent step has no graph form (use tensor ops instead)"
                ));
            }
        }
    });
}

/// Notes an in-place write into the storage at `ptr`: an error when a
/// captured value lives there.
pub(crate) fn write(op: &'static str, ptr: usize) {
    with(|r| {
        if r.storages.contains(&ptr) {
            r.fail(format!(
                "`{op}`{{at}} writes in place into a value the graph has captured"
            ));
        }
    });
}

/// Stops a running capture with an error naming `op` and the module path:
/// for a layer whose computation a graph of core ops would record wrongly
/// (a loop over a symbolic size, unrolled at the example's length).
pub fn refuse(op: &str, why: &str) {
    if capturing() {
        with(|r| r.fail(format!("`{op}`{{at}}: {why}")));
    }
}

/// Notes that `out` holds the same values as `x` (a contiguous copy).
pub(crate) fn alias(x: &Val, out: &Val) {
    with(|r| {
        if let Some(&id) = r.ids.get(&x.key) {
            r.ids.insert(out.key, id);
            r.storages.insert(out.key.0);
            r.born.remove(&out.key);
            r.keep.push(Arc::downgrade(&out.keep));
        }
    });
}

/// Capture mode on this thread, from [`Capture::start`] to
/// [`Capture::finish`] (or drop).
#[derive(Debug)]
pub struct Capture {
    _thread: std::marker::PhantomData<*const ()>,
}

impl Capture {
    /// Turns capture on for this thread; `path` names the module running
    /// (for each node and each error).
    ///
    /// # Errors
    /// When a capture is already running on this thread.
    pub fn start(path: fn() -> String) -> Result<Capture> {
        if capturing() {
            return Err(Error::invalid(
                "capture",
                "a capture is already running on this thread",
            ));
        }
        REC.with(|r| {
            *r.borrow_mut() = Some(Recorder {
                graph: Graph::default(),
                ids: HashMap::new(),
                storages: HashSet::new(),
                born: HashMap::new(),
                keep: Vec::new(),
                dynamic: Vec::new(),
                env: HashMap::new(),
                error: None,
                path,
            })
        });
        ON.with(|o| o.set(true));
        Ok(Capture {
            _thread: std::marker::PhantomData,
        })
    }

    /// Registers a graph input named `name`; its `Dyn` sizes (`dynamic`)
    /// become the symbols `names` gives them, in axis order (a name used
    /// twice is one symbol, whose sizes must agree).
    ///
    /// # Errors
    /// When a symbol gets two sizes.
    pub fn input(&self, name: &str, v: &Val, dynamic: &[bool], names: &[String]) -> Result<()> {
        let mut names = names.iter();
        let mut dims = Vec::new();
        let mut err = None;
        with(|r| {
            let input = r.graph.inputs.len();
            for (axis, (&n, &dy)) in v.dims().iter().zip(dynamic).enumerate() {
                if !dy {
                    dims.push(Dim::Fixed(n));
                    continue;
                }
                let sym = names
                    .next()
                    .cloned()
                    .unwrap_or_else(|| format!("{name}_{axis}"));
                match r.env.get(&sym) {
                    Some(&m) if m != n => {
                        err = Some(Error::invalid(
                            "capture",
                            format!("symbol `{sym}` is {m} in one input and {n} in `{name}`"),
                        ));
                    }
                    Some(_) => {}
                    None => {
                        r.env.insert(sym.clone(), n);
                        r.graph.symbols.push(Symbol {
                            name: sym.clone(),
                            input,
                            axis,
                            example: n,
                        });
                    }
                }
                dims.push(Dim::var(&sym));
            }
            let id = r.add_value(v, dims, Source::Input, Some(name.to_string()));
            r.dynamic[id] = true;
            r.graph.inputs.push(id);
        });
        err.map_or(Ok(()), Err)
    }

    /// Registers a parameter or buffer under its `state_dict` key (a tensor
    /// shared by two keys keeps the first).
    ///
    /// # Errors
    /// When its values cannot be read.
    pub fn param(&self, key: &str, v: &Val) -> Result<()> {
        if with(|r| r.ids.contains_key(&v.key)) == Some(true) {
            return Ok(());
        }
        ON.with(|o| o.set(false));
        let data = (v.read)();
        ON.with(|o| o.set(true));
        let data = data?;
        with(|r| {
            let dims = data.dims().iter().map(|&n| Dim::Fixed(n)).collect();
            r.add_value(v, dims, Source::Param(data), Some(key.to_string()));
        });
        Ok(())
    }

    /// Ends the capture with the forward's outputs: the graph, without the
    /// nodes no output depends on.
    ///
    /// # Errors
    /// The first error an op raised during the capture, or an output the
    /// graph does not hold.
    pub fn finish(self, outputs: &[Val]) -> Result<Graph> {
        ON.with(|o| o.set(false));
        let mut rec = REC
            .with(|r| r.borrow_mut().take())
            .expect("capture is running");
        if let Some(e) = rec.error.take() {
            return Err(e);
        }
        for v in outputs {
            match rec.ids.get(&v.key) {
                Some(&id) => rec.graph.outputs.push(id),
                None => {
                    return Err(Error::invalid(
                        "capture",
                        "an output of the forward was not made by a captured op",
                    ))
                }
            }
        }
        Ok(prune(rec.graph))
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        ON.with(|o| o.set(false));
        REC.with(|r| r.borrow_mut().take());
    }
}

/// Drops the nodes and values no output reads, renumbering the rest.
fn prune(g: Graph) -> Graph {
    let mut live = vec![false; g.values.len()];
    for &o in &g.outputs {
        live[o] = true;
    }
    for &i in &g.inputs {
        live[i] = true;
    }
    for n in g.nodes.iter().rev() {
        if live[n.output] {
            for &i in &n.inputs {
                live[i] = true;
            }
        }
    }
    let mut new_id = vec![usize::MAX; g.values.len()];
    let mut values = Vec::new();
    for (i, v) in g.values.into_iter().enumerate() {
        if live[i] {
            new_id[i] = values.len();
            values.push(v);
        }
    }
    let mut nodes = Vec::new();
    for n in g.nodes {
        if live[n.output] {
            let out = new_id[n.output];
            values[out].source = Source::Node(nodes.len());
            if values[out].name.starts_with('v') {
                values[out].name = format!("v{out}");
            }
            nodes.push(Node {
                inputs: n.inputs.iter().map(|&i| new_id[i]).collect(),
                output: out,
                ..n
            });
        }
    }
    Graph {
        values,
        nodes,
        inputs: g.inputs.iter().map(|&i| new_id[i]).collect(),
        outputs: g.outputs.iter().map(|&i| new_id[i]).collect(),
        symbols: g.symbols,
    }
}

impl<S: Shape, E: Dtype, D: Backend> Tensor<S, E, D> {
    /// This new tensor, made from no input (a creation function): when a
    /// capture reads it, it is a constant of the graph.
    #[inline]
    pub(crate) fn constant(self) -> Self {
        if capturing() {
            let key = self.val().key;
            with(|r| r.born.remove(&key));
        }
        self
    }

    /// This tensor, noted as the result of the op and operands `f` gives
    /// when a capture is running (`f` runs only then): the call an op
    /// chains after its kernel.
    #[inline]
    pub(crate) fn noted(self, f: impl FnOnce() -> (Op, Vec<Val>)) -> Self {
        if capturing() {
            let (op, ins) = f();
            note(op, &ins, &self.val());
        }
        self
    }
}
