//! Replaying a captured [`Graph`] on new inputs: every node runs the same
//! public op the forward ran (so the same kernels, the same numerics, and
//! the same tape: gradients flow to the parameters bound at the call), in
//! the order it was captured, at whatever sizes the inputs' symbols take.
//!
//! Values travel as [`Slot`]s: a tensor of the graph's float type, of
//! indices, or a mask, held at rank 6 (the true sizes after leading axes of
//! size 1) with its true rank, so one Rust type carries every value and an
//! op needing a fixed rank (a convolution, attention) views its operands
//! at that rank. Views add or drop only leading size-1 axes, which never
//! copies.
//!
//! [`Replay::new`] checks once that every node has a replay form (the
//! reason, with the module path, when one does not: the caller then runs
//! the forward eagerly) and uploads the constants; [`Replay::run`] binds
//! the inputs and the live parameters and runs the nodes, dropping each
//! value after its last use.
//!
//! **Passes.** Elementwise fusion ([`super::fuse_elementwise`], run by
//! [`Replay::new`]): a fused node runs in one pass
//! ([`crate::ops::fused::FusedKernel::fused_nodes`]) where no gradient is
//! wanted and autocast is off, and as the composed ops (one tape node
//! each) otherwise; the values are the same either way.
//!
//! Weights pre-packed: where no gradient is wanted
//! and autocast is off, a `linear` whose weight is a parameter runs on a
//! copy of the weight packed once for the backend's GEMM
//! ([`crate::ops::matmul::MatmulKernel::pack_rhs`]), kept until the
//! weight's storage is written (its version counter moves: an optimizer
//! step, a load) or replaced. It runs only where the backend's plain
//! product packs the weight the same way, so the values are the plain
//! op's, bit for bit; elsewhere (one row, AVX-512's narrow kernel, CUDA)
//! the plain op runs.

use super::{Elem, Graph, Op, Source, ValueId};
use crate::device::{Backend, Device};
use crate::dtype::{DType, Dtype, Float};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::ops::cmp::CmpOp;
use crate::ops::matmul::PackedRhs;
use crate::shape::{Dyn, Shape};
use crate::tape::Raw;
use crate::tensor::StorageCell;
use crate::tensor::{Tensor, TensorData};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The rank every replayed value is held at.
const RANK: usize = 6;

/// A tensor of rank 6 with every size `Dyn`: how a replayed value travels.
pub type Tensor6<E, D> = Tensor<(Dyn, Dyn, Dyn, Dyn, Dyn, Dyn), E, D>;

/// A value while a graph replays, with its true rank.
#[derive(Debug)]
pub enum Slot<E: Float, D: Backend> {
    /// A tensor of the graph's float type.
    Float(Tensor6<E, D>, usize),
    /// An i64 tensor (indices, class labels).
    Index(Tensor6<i64, D>, usize),
    /// A bool tensor (masks).
    Mask(Tensor6<bool, D>, usize),
}

impl<E: Float, D: Backend> Clone for Slot<E, D> {
    fn clone(&self) -> Self {
        match self {
            Slot::Float(t, r) => Slot::Float(t.clone(), *r),
            Slot::Index(t, r) => Slot::Index(t.clone(), *r),
            Slot::Mask(t, r) => Slot::Mask(t.clone(), *r),
        }
    }
}

/// The rank-6 sizes of true sizes `dims` (leading 1s).
fn six(dims: &[usize]) -> Result<(Dyn, Dyn, Dyn, Dyn, Dyn, Dyn)> {
    if dims.len() > RANK {
        return Err(Error::invalid(
            "compile",
            format!(
                "a value of rank {} (replay holds rank 6 at most)",
                dims.len()
            ),
        ));
    }
    let mut d = [1usize; RANK];
    d[RANK - dims.len()..].copy_from_slice(dims);
    Ok((
        Dyn(d[0]),
        Dyn(d[1]),
        Dyn(d[2]),
        Dyn(d[3]),
        Dyn(d[4]),
        Dyn(d[5]),
    ))
}

/// `t` at rank 6 (a view).
pub fn widen<S: Shape, X: Dtype, D: Backend>(t: &Tensor<S, X, D>) -> Result<Tensor6<X, D>> {
    t.try_reshape_to(six(&t.layout.dims)?)
}

/// The true sizes of `t`, a value of rank `r` held at rank 6.
fn true_dims<X: Dtype, D: Backend>(t: &Tensor6<X, D>, r: usize) -> &[usize] {
    &t.layout.dims[RANK - r..]
}

/// `t` (rank `r`, held at rank 6) as shape `S` (a view).
pub fn narrow_to<S: Shape, X: Dtype, D: Backend>(
    t: &Tensor6<X, D>,
    r: usize,
) -> Result<Tensor<S, X, D>> {
    let dims = true_dims(t, r);
    let shape = S::from_dims(dims).ok_or_else(|| Error::shape("compile", S::describe(), dims))?;
    t.try_reshape_to(shape)
}

impl<E: Float, D: Backend> Slot<E, D> {
    /// The true sizes.
    pub fn dims(&self) -> &[usize] {
        match self {
            Slot::Float(t, r) => true_dims(t, *r),
            Slot::Index(t, r) => true_dims(t, *r),
            Slot::Mask(t, r) => true_dims(t, *r),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Slot::Float(..) => E::DTYPE,
            Slot::Index(..) => DType::I64,
            Slot::Mask(..) => DType::Bool,
        }
    }

    /// A slot holding `t` when its element type is `E`, i64 or bool.
    pub fn of<S: Shape, X: Dtype>(t: &Tensor<S, X, D>) -> Result<Self> {
        let any: &dyn std::any::Any = t;
        let r = S::RANK;
        if let Some(t) = any.downcast_ref::<Tensor<S, E, D>>() {
            Ok(Slot::Float(widen(t)?, r))
        } else if let Some(t) = any.downcast_ref::<Tensor<S, i64, D>>() {
            Ok(Slot::Index(widen(t)?, r))
        } else if let Some(t) = any.downcast_ref::<Tensor<S, bool, D>>() {
            Ok(Slot::Mask(widen(t)?, r))
        } else {
            Err(Error::invalid(
                "compile",
                format!("a {} value in a {} graph", X::DTYPE, E::DTYPE),
            ))
        }
    }

    /// The tensor of type `Tensor<S, X, D>` this slot holds.
    ///
    /// # Errors
    /// When the element type or the sizes differ.
    pub fn to<S: Shape, X: Dtype>(&self) -> Result<Tensor<S, X, D>> {
        fn cast<S: Shape, Y: Dtype, X: Dtype, D: Backend>(
            t: &Tensor6<Y, D>,
            r: usize,
        ) -> Result<Tensor<S, X, D>> {
            let t: Box<dyn std::any::Any> = Box::new(narrow_to::<S, Y, D>(t, r)?);
            t.downcast::<Tensor<S, X, D>>().map(|t| *t).map_err(|_| {
                Error::invalid(
                    "compile",
                    format!(
                        "the graph gives {} where {} is expected",
                        Y::DTYPE,
                        X::DTYPE
                    ),
                )
            })
        }
        match self {
            Slot::Float(t, r) => cast(t, *r),
            Slot::Index(t, r) => cast(t, *r),
            Slot::Mask(t, r) => cast(t, *r),
        }
    }

    fn float(&self) -> Result<&Tensor6<E, D>> {
        match self {
            Slot::Float(t, _) => Ok(t),
            _ => Err(dtype_error(E::DTYPE, self.dtype())),
        }
    }

    fn index(&self) -> Result<&Tensor6<i64, D>> {
        match self {
            Slot::Index(t, _) => Ok(t),
            _ => Err(dtype_error(DType::I64, self.dtype())),
        }
    }

    fn mask(&self) -> Result<&Tensor6<bool, D>> {
        match self {
            Slot::Mask(t, _) => Ok(t),
            _ => Err(dtype_error(DType::Bool, self.dtype())),
        }
    }

    fn rank(&self) -> usize {
        match self {
            Slot::Float(_, r) | Slot::Index(_, r) | Slot::Mask(_, r) => *r,
        }
    }
}

fn dtype_error(want: DType, got: DType) -> Error {
    Error::invalid(
        "compile",
        format!("an operand is {got} where {want} is expected"),
    )
}

/// Runs `$body` with the const `$a` equal to the runtime axis `$ax` (0..6).
macro_rules! at_axis {
    ($ax:expr, $a:ident => $body:expr) => {
        match $ax {
            0 => {
                const $a: isize = 0;
                $body
            }
            1 => {
                const $a: isize = 1;
                $body
            }
            2 => {
                const $a: isize = 2;
                $body
            }
            3 => {
                const $a: isize = 3;
                $body
            }
            4 => {
                const $a: isize = 4;
                $body
            }
            _ => {
                const $a: isize = 5;
                $body
            }
        }
    };
}

/// Runs `$body` on the tensor `$t` a slot holds, whatever its element
/// type, keeping that type and giving the result rank `$rank`.
macro_rules! view {
    ($slot:expr, $rank:expr, |$t:ident| $body:expr) => {
        match $slot {
            Slot::Float($t, _) => Slot::Float($body?, $rank),
            Slot::Index($t, _) => Slot::Index($body?, $rank),
            Slot::Mask($t, _) => Slot::Mask($body?, $rank),
        }
    };
}

/// A captured graph ready to replay.
#[derive(Debug)]
pub struct Replay<E: Float, D: Backend> {
    graph: Graph,
    device: D,
    constants: HashMap<ValueId, Slot<E, D>>,
    /// For each node, the values whose last use it is.
    frees: Vec<Vec<ValueId>>,
    /// Weights packed for the GEMM, by graph value.
    packs: Mutex<HashMap<ValueId, Packed<E, D>>>,
    /// Fused nodes the pass "elementwise fusion" made.
    fused: usize,
}

/// A weight packed once: the storage it was packed from (kept, so its
/// address is not reused), the version it had, and the packed copy.
struct Packed<E: Float, D: Backend> {
    storage: Arc<StorageCell<D::Storage<E>>>,
    version: u64,
    packed: PackedRhs,
}

impl<E: Float, D: Backend> std::fmt::Debug for Packed<E, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed(version {}, {:?})", self.version, self.packed)
    }
}

/// Why node `n` of `g` cannot replay, if it cannot.
fn unsupported(g: &Graph, n: &super::Node, float: DType) -> Option<String> {
    let dtype_ok = |id: ValueId| {
        let d = g.values[id].dtype;
        d == float || d == DType::I64 || d == DType::Bool
    };
    if !dtype_ok(n.output) || !n.inputs.iter().all(|&i| dtype_ok(i)) {
        return Some(format!(
            "`{}` mixes element types ({} graph)",
            n.op.name(),
            float
        ));
    }
    match &n.op {
        Op::Cumsum { .. } | Op::ConvTranspose { .. } => {
            Some(format!("`{}` has no replay form yet", n.op.name()))
        }
        Op::Fused { nodes } => nodes.iter().find_map(|e| match e {
            Elem::Unary { name, .. } if !crate::ops::unary::has_row(name) => {
                Some(format!("unary `{name}` has no replay form"))
            }
            _ => None,
        }),
        Op::Unary { name, .. } if !crate::ops::unary::has_row(name) => {
            Some(format!("unary `{name}` has no replay form"))
        }
        Op::Matmul if n.inputs.iter().any(|&i| g.values[i].dims.len() < 2) => {
            Some("`matmul` of a vector has no replay form yet".into())
        }
        _ => None,
    }
}

impl<E: Float, D: Device<E>> Replay<E, D> {
    /// Prepares `graph` (captured in element type `E`) to replay on `device`.
    ///
    /// # Errors
    /// The first node with no replay form, with its module path; or a
    /// constant that cannot be uploaded.
    pub fn new(mut graph: Graph, device: &D) -> Result<Self> {
        for n in &graph.nodes {
            if let Some(why) = unsupported(&graph, n, E::DTYPE) {
                let at = if n.path.is_empty() {
                    String::new()
                } else {
                    format!(" in module `{}`", n.path)
                };
                return Err(Error::invalid("compile", format!("{why}{at}")));
            }
        }
        let fused = super::fuse_elementwise(&mut graph);
        let mut constants = HashMap::new();
        for (id, v) in graph.values.iter().enumerate() {
            if let Source::Constant(data) = &v.source {
                constants.insert(id, upload::<E, D>(data, device)?);
            }
        }
        let mut last = vec![None; graph.values.len()];
        for (i, n) in graph.nodes.iter().enumerate() {
            for &v in &n.inputs {
                last[v] = Some(i);
            }
        }
        let mut frees = vec![Vec::new(); graph.nodes.len()];
        for (v, l) in last.iter().enumerate() {
            if let Some(i) = l {
                if !graph.outputs.contains(&v) {
                    frees[*i].push(v);
                }
            }
        }
        Ok(Replay {
            graph,
            device: device.clone(),
            constants,
            frees,
            packs: Mutex::new(HashMap::new()),
            fused,
        })
    }

    /// How many fused nodes the pass "elementwise fusion" made (each runs
    /// a chain of elementwise ops in one pass).
    pub fn fused_nodes_made(&self) -> usize {
        self.fused
    }

    /// Fused node `nodes` on `ins` in one pass over memory, or `None` where
    /// the composed ops must run: when a gradient is wanted (the tape
    /// records the ops one by one), under autocast, or on a backend without
    /// the kernel. Each row rounds as the op alone does: the same values,
    /// bit for bit.
    fn fused_nodes(
        &self,
        nodes: &[Elem],
        ins: &[&Slot<E, D>],
        out: &[usize],
    ) -> Result<Option<Tensor6<E, D>>> {
        let mut ts = Vec::with_capacity(ins.len());
        for s in ins {
            match s {
                Slot::Float(t, _) if !t.needs_grad() => ts.push(t),
                _ => return Ok(None),
            }
        }
        if crate::autocast::target::<E, D>(&self.device).is_some()
            || !crate::ops::fused::runnable(nodes, ts.len())
        {
            return Ok(None);
        }
        let dims = six(out)?.dims();
        let layouts: Vec<Layout> = ts.iter().map(|t| t.layout.broadcast_to(&dims)).collect();
        let guards: Vec<_> = ts.iter().map(|t| t.storage()).collect();
        let views: Vec<_> = guards.iter().map(|g| &**g).zip(&layouts).collect();
        Ok(self
            .device
            .fused_nodes(nodes, &views)?
            .map(|y| Tensor6::from_storage(y, &dims, self.device.clone())))
    }

    /// How many weights are held packed for the GEMM (the module docs'
    /// pass).
    pub fn packed_weights(&self) -> usize {
        self.packs.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// `x @ w^T + b` from `w` packed once (the pass "weights pre-packed"),
    /// or `None` where the plain op must run: when a gradient is wanted,
    /// under autocast, or where the backend would not pack `w` itself
    /// (then its values would differ). Graph value `id` (a parameter)
    /// keeps its packed copy while `w`'s storage is the same and unwritten:
    /// an optimizer step or a load bumps its version and packs it again.
    fn packed_linear(
        &self,
        id: ValueId,
        x: &Tensor6<E, D>,
        r: usize,
        w: &Tensor<(Dyn, Dyn), E, D>,
        b: Option<&Tensor<(Dyn,), E, D>>,
    ) -> Result<Option<Tensor6<E, D>>> {
        let param = matches!(self.graph.values[id].source, Source::Param(_));
        if !param
            || x.needs_grad()
            || w.needs_grad()
            || b.is_some_and(|b| b.needs_grad())
            || crate::autocast::target::<E, D>(&self.device).is_some()
        {
            return Ok(None);
        }
        let dims = true_dims(x, r);
        let (n, k) = (w.layout.dims[0], w.layout.dims[1]);
        let m: usize = dims[..r - 1].iter().product();
        let Some(lx) = x.layout.reshape(&[m, k]) else {
            return Ok(None);
        };
        let version = w.storage.version();
        let packed = {
            let mut packs = self.packs.lock().unwrap_or_else(|e| e.into_inner());
            match packs.get(&id) {
                Some(p) if Arc::ptr_eq(&p.storage, &w.storage) && p.version == version => {
                    p.packed.clone()
                }
                _ => {
                    let wt = w.layout.swap(0, 1);
                    let Some(packed) = self.device.pack_rhs(&w.storage(), &wt)? else {
                        return Ok(None);
                    };
                    packs.insert(
                        id,
                        Packed {
                            storage: Arc::clone(&w.storage),
                            version,
                            packed: packed.clone(),
                        },
                    );
                    packed
                }
            }
        };
        let bias = b.map(|b| (b.storage(), b.layout));
        let y = self.device.linear_packed(
            (&x.storage(), &lx),
            &packed,
            bias.as_ref().map(|(s, l)| (&**s, l)),
        )?;
        let Some(y) = y else { return Ok(None) };
        let mut out = dims.to_vec();
        out[r - 1] = n;
        Ok(Some(Tensor6::from_storage(
            y,
            &six(&out)?.dims(),
            self.device.clone(),
        )))
    }

    /// The graph this replays.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Runs the graph on `inputs` (in the graph's input order), reading each
    /// parameter and buffer from `param` by its `state_dict` key, and gives
    /// the outputs in order.
    ///
    /// # Errors
    /// An input of the wrong element type or rank, sizes that disagree with
    /// the graph's (a fixed size, or one symbol given two sizes), a missing
    /// parameter, or what an op returns.
    pub fn run(
        &self,
        inputs: Vec<Slot<E, D>>,
        param: &mut dyn FnMut(&str) -> Option<Slot<E, D>>,
    ) -> Result<Vec<Slot<E, D>>> {
        let g = &self.graph;
        if inputs.len() != g.inputs.len() {
            return Err(Error::invalid(
                "compile",
                format!("{} inputs for a graph of {}", inputs.len(), g.inputs.len()),
            ));
        }
        let mut env: HashMap<String, usize> = HashMap::new();
        for s in &g.symbols {
            let n = inputs[s.input].dims().get(s.axis).copied().unwrap_or(0);
            if *env.entry(s.name.clone()).or_insert(n) != n {
                return Err(Error::invalid(
                    "compile",
                    format!("the size `{}` is given two values", s.name),
                ));
            }
        }
        let mut vals: Vec<Option<Slot<E, D>>> = vec![None; g.values.len()];
        for (&id, x) in g.inputs.iter().zip(inputs) {
            check_value(g, id, &x, &env)?;
            vals[id] = Some(x);
        }
        for (id, v) in g.values.iter().enumerate() {
            match &v.source {
                Source::Param(_) => {
                    let p = param(&v.name).ok_or_else(|| {
                        Error::invalid("compile", format!("the model has no `{}`", v.name))
                    })?;
                    check_value(g, id, &p, &env)?;
                    vals[id] = Some(p);
                }
                Source::Constant(_) => vals[id] = self.constants.get(&id).cloned(),
                _ => {}
            }
        }
        for (i, n) in g.nodes.iter().enumerate() {
            let ins: Vec<&Slot<E, D>> = n
                .inputs
                .iter()
                .map(|&v| vals[v].as_ref().expect("a value is made before its use"))
                .collect();
            let out_dims: Vec<usize> = g.values[n.output]
                .dims
                .iter()
                .map(|d| d.eval(&env))
                .collect::<Option<_>>()
                .ok_or_else(|| Error::invalid("compile", "a size the graph cannot evaluate"))?;
            let y = self
                .node(n, &ins, &out_dims, g.values[n.output].dtype, &env)
                .map_err(|e| {
                    if n.path.is_empty() {
                        e
                    } else {
                        Error::invalid("compile", format!("in module `{}`: {e}", n.path))
                    }
                })?;
            let y = fit(y, &out_dims)?;
            vals[n.output] = Some(y);
            for &v in &self.frees[i] {
                vals[v] = None;
            }
        }
        g.outputs
            .iter()
            .map(|&o| {
                vals[o]
                    .clone()
                    .ok_or_else(|| Error::invalid("compile", "an output was never made"))
            })
            .collect()
    }

    /// One node.
    fn node(
        &self,
        node: &super::Node,
        ins: &[&Slot<E, D>],
        out: &[usize],
        out_dtype: DType,
        env: &HashMap<String, usize>,
    ) -> Result<Slot<E, D>> {
        let op = &node.op;
        if let Op::Arange { start, step, .. } = op {
            let n = out[0];
            let vals = (0..n).map(|i| start + step * i as f64);
            return Ok(match out_dtype {
                DType::I64 => Slot::Index(
                    widen(&Tensor::from_vec_on(
                        vals.map(|v| v as i64).collect(),
                        (Dyn(n),),
                        &self.device,
                    )?)?,
                    1,
                ),
                _ => Slot::Float(
                    widen(&Tensor::from_vec_on(
                        vals.map(E::from_f64).collect(),
                        (Dyn(n),),
                        &self.device,
                    )?)?,
                    1,
                ),
            });
        }
        let x = ins[0];
        let r = x.rank();
        // The rank-6 axis of true axis `a` of the first operand.
        let ax = |a: usize| a + RANK - r;
        let f = |t: Tensor6<E, D>| Slot::Float(t, out.len());
        Ok(match op {
            Op::Unary { name, params } => f(unary(x.float()?, name, params)?),
            Op::Binary { name } => f(binary(x.float()?, ins[1].float()?, name)?),
            Op::Fused { nodes } => {
                if let Some(y) = self.fused_nodes(nodes, ins, out)? {
                    return Ok(f(y));
                }
                let mut vals: Vec<Tensor6<E, D>> = Vec::with_capacity(nodes.len());
                for e in nodes {
                    let v = match e {
                        Elem::Arg(i) => ins[*i].float()?.clone(),
                        Elem::Unary { name, params, x } => unary(&vals[*x], name, params)?,
                        Elem::Binary { name, a, b } => binary(&vals[*a], &vals[*b], name)?,
                    };
                    vals.push(v);
                }
                f(vals
                    .pop()
                    .ok_or_else(|| Error::invalid("compile", "an empty fused op"))?)
            }
            Op::Compare { name } => {
                let op = match *name {
                    "eq" => CmpOp::Eq,
                    "ne" => CmpOp::Ne,
                    "lt" => CmpOp::Lt,
                    "le" => CmpOp::Le,
                    "gt" => CmpOp::Gt,
                    _ => CmpOp::Ge,
                };
                Slot::Mask(x.float()?.try_compare(op, ins[1].float()?)?, out.len())
            }
            Op::Where => f(crate::ops::cmp::try_where_cond(
                x.mask()?,
                ins[1].float()?,
                ins[2].float()?,
            )?),
            Op::MaskedFill { value } => f(x.float()?.try_masked_fill(ins[1].mask()?, *value)?),
            Op::Reduce { op, axis, .. } => match axis {
                None => f(widen(&x.float()?.try_reduce_all(*op)?)?),
                Some(a) => {
                    f(at_axis!(ax(*a), A => widen(&x.float()?.try_reduce_keepdim::<A>(*op)?)?))
                }
            },
            Op::ArgReduce { op, axis, .. } => {
                let t = x.float()?;
                let i = at_axis!(ax(*axis), A => match op {
                    crate::ops::reduce::ArgReduceOp::ArgMax => widen(&t.argmax_keepdim::<A>())?,
                    crate::ops::reduce::ArgReduceOp::ArgMin => widen(&t.argmin_keepdim::<A>())?,
                });
                Slot::Index(i, out.len())
            }
            Op::SoftmaxAxis { axis, log } => f(x.float()?.softmax_impl(ax(*axis), *log)),
            Op::Matmul => f(x.float()?.try_matmul(ins[1].float()?)?),
            Op::Affine => {
                let w: Tensor<(Dyn, Dyn), E, D> = ins[1].to()?;
                let b: Option<Tensor<(Dyn,), E, D>> = ins.get(2).map(|b| b.to()).transpose()?;
                let x = x.float()?;
                match self.packed_linear(node.inputs[1], x, r, &w, b.as_ref())? {
                    Some(y) => f(y),
                    None => f(x.try_linear(&w, b.as_ref())?),
                }
            }
            Op::Conv(p) => {
                let x4: Tensor<(Dyn, Dyn, Dyn, Dyn), E, D> = x.to()?;
                let w: Tensor<(Dyn, Dyn, Dyn, Dyn), E, D> = ins[1].to()?;
                f(widen(&x4.try_conv2d(&w, *p)?)?)
            }
            Op::MaxPool(p) | Op::AvgPool(p) => {
                let x4: Tensor<(Dyn, Dyn, Dyn, Dyn), E, D> = x.to()?;
                let y = if matches!(op, Op::MaxPool(_)) {
                    x4.try_max_pool2d(*p)?
                } else {
                    x4.try_avg_pool2d(*p)?
                };
                f(widen(&y)?)
            }
            Op::LayerNormalization { eps, weight, bias } => {
                let mut rest = ins[1..].iter();
                let mut take = |on: bool| -> Result<Option<Tensor<(Dyn,), E, D>>> {
                    if on {
                        rest.next()
                            .ok_or_else(|| Error::invalid("compile", "a missing operand"))?
                            .to()
                            .map(Some)
                    } else {
                        Ok(None)
                    }
                };
                let (w, b) = (take(*weight)?, take(*bias)?);
                f(x.float()?.try_layer_norm(w.as_ref(), b.as_ref(), *eps)?)
            }
            Op::Attention {
                scale,
                causal,
                mask,
            } => {
                type T4<E, D> = Tensor<(Dyn, Dyn, Dyn, Dyn), E, D>;
                let (q, k, v): (T4<E, D>, T4<E, D>, T4<E, D>) =
                    (x.to()?, ins[1].to()?, ins[2].to()?);
                let m: Option<T4<E, D>> = if *mask {
                    let m = ins[3];
                    let padded = Slot::Float(m.float()?.clone(), 4.max(m.rank()));
                    Some(padded.to()?)
                } else {
                    None
                };
                f(widen(&q.try_scaled_dot_product_attention(
                    &k,
                    &v,
                    m.as_ref(),
                    *causal,
                    Some(*scale),
                )?)?)
            }
            Op::IndexSelect { axis } => {
                let idx: Tensor<(Dyn,), i64, D> = ins[1].to()?;
                f(at_axis!(ax(*axis), A => x.float()?.try_index_select::<A, Dyn>(&idx)?))
            }
            Op::Gather { axis } => {
                let idx = ins[1].index()?;
                f(at_axis!(ax(*axis), A => x.float()?.try_gather::<A, _>(idx)?))
            }
            Op::Cat { axis } => {
                let a = ax(*axis);
                match x {
                    Slot::Float(..) => {
                        let ts: Vec<_> = ins
                            .iter()
                            .map(|s| s.float().cloned())
                            .collect::<Result<_>>()?;
                        f(at_axis!(a, A => crate::ops::cat::try_cat::<A, _, _>(&ts)?))
                    }
                    Slot::Index(..) => {
                        let ts: Vec<_> = ins
                            .iter()
                            .map(|s| s.index().cloned())
                            .collect::<Result<_>>()?;
                        Slot::Index(
                            at_axis!(a, A => crate::ops::cat::try_cat::<A, _, _>(&ts)?),
                            out.len(),
                        )
                    }
                    Slot::Mask(..) => {
                        let ts: Vec<_> = ins
                            .iter()
                            .map(|s| s.mask().cloned())
                            .collect::<Result<_>>()?;
                        Slot::Mask(
                            at_axis!(a, A => crate::ops::cat::try_cat::<A, _, _>(&ts)?),
                            out.len(),
                        )
                    }
                }
            }
            Op::Cast { to } => {
                let n = out.len();
                match (x, *to) {
                    (Slot::Float(t, _), DType::I64) => Slot::Index(t.try_to_dtype()?, n),
                    (Slot::Float(t, _), DType::Bool) => Slot::Mask(t.try_to_dtype()?, n),
                    (Slot::Index(t, _), DType::Bool) => Slot::Mask(t.try_to_dtype()?, n),
                    (Slot::Mask(t, _), DType::I64) => Slot::Index(t.try_to_dtype()?, n),
                    (Slot::Index(t, _), _) if *to == E::DTYPE => f(t.try_to_dtype()?),
                    (Slot::Mask(t, _), _) if *to == E::DTYPE => f(t.try_to_dtype()?),
                    (s, _) => (*s).clone(),
                }
            }
            Op::Transpose { axes } => {
                let (a, b) = (ax(axes[0]), ax(axes[1]));
                let swap = move |l: &Layout| l.swap(a, b);
                view!(x, out.len(), |t| Result::<_>::Ok(t.view_with_grad(
                    swap(&t.layout),
                    "transpose",
                    move |g| Ok(Raw {
                        layout: swap(&g.layout),
                        ..g.clone()
                    })
                )))
            }
            Op::Permute { perm } => {
                let mut p6 = [0usize; RANK];
                let mut inv = [0usize; RANK];
                for (i, p) in p6.iter_mut().enumerate() {
                    *p = if i < RANK - r {
                        i
                    } else {
                        ax(perm[i - (RANK - r)])
                    };
                }
                for (i, &p) in p6.iter().enumerate() {
                    inv[p] = i;
                }
                view!(x, out.len(), |t| Result::<_>::Ok(t.view_with_grad(
                    t.layout.permute(&p6),
                    "permute",
                    move |g| Ok(Raw {
                        layout: g.layout.permute(&inv),
                        ..g.clone()
                    })
                )))
            }
            Op::Unsqueeze { .. } | Op::Squeeze { .. } | Op::Reshape { .. } => {
                view!(x, out.len(), |t| t.try_reshape_to(six(out)?))
            }
            Op::Slice {
                axis, start, step, ..
            } => {
                let start = start.eval(env).ok_or_else(|| {
                    Error::invalid("compile", "a slice start the graph cannot evaluate")
                })?;
                let (a, n) = (ax(*axis), out[*axis]);
                let end = if n == 0 {
                    start
                } else {
                    start + (n - 1) * step + 1
                };
                view!(
                    x,
                    out.len(),
                    |t| at_axis!(a, A => t.try_slice::<A>(start, end, *step))
                )
            }
            Op::Expand { .. } => {
                let d = six(out)?.dims();
                view!(x, out.len(), |t| t.try_expand_dims(&d))
            }
            Op::Rnn {
                cell,
                hidden,
                layers,
                bidirectional,
                bias,
            } => {
                let x: Tensor<(Dyn, Dyn, Dyn), E, D> = x.to()?;
                let shape = RnnShape {
                    lstm: *cell != "GRU",
                    hidden: *hidden,
                    layers: *layers,
                    dirs: if *bidirectional { 2 } else { 1 },
                    bias: *bias,
                };
                f(widen(&rnn(&shape, x, &ins[1..], &self.device)?)?)
            }
            Op::Arange { .. } => unreachable!("arange is made before the operands are read"),
            Op::Cumsum { .. } | Op::ConvTranspose { .. } => {
                return Err(Error::invalid(
                    "compile",
                    format!("`{}` has no replay form yet", op.name()),
                ))
            }
        })
    }
}

/// What an [`Op::Rnn`] node runs.
struct RnnShape {
    lstm: bool,
    hidden: usize,
    layers: usize,
    dirs: usize,
    bias: bool,
}

/// A stack of recurrent layers over `x` `[batch, T, features]` from a zero
/// state, with `weights` in [`Op::Rnn`]'s order: the ops nn's LSTM and GRU
/// run eagerly (all steps' input projections in one product, then the
/// fused time loop), in the same order, so the values and the tape are
/// theirs.
fn rnn<E: Float, D: Device<E>>(
    shape: &RnnShape,
    x: Tensor<(Dyn, Dyn, Dyn), E, D>,
    weights: &[&Slot<E, D>],
    device: &D,
) -> Result<Tensor<(Dyn, Dyn, Dyn), E, D>> {
    use crate::ops::rnn::{RnnLayerWeights, RnnMode};
    let mode = match shape.lstm {
        true => RnnMode::LongShortTermMemory,
        false => RnnMode::GatedRecurrentUnit,
    };
    let h = shape.hidden;
    let per = if shape.bias { 4 } else { 2 };
    if weights.len() != shape.layers * shape.dirs * per {
        return Err(Error::invalid(
            "compile",
            format!("{} weights for a recurrent stack", weights.len()),
        ));
    }
    let b = x.size(0);
    let mut input = x;
    let mut w = weights.chunks(per);
    for _ in 0..shape.layers {
        let mut outs = Vec::with_capacity(shape.dirs);
        for dir in 0..shape.dirs {
            let ws = w.next().expect("counted above");
            let w_ih: Tensor<(Dyn, Dyn), E, D> = ws[0].to()?;
            let w_hh: Tensor<(Dyn, Dyn), E, D> = ws[1].to()?;
            let (b_ih, b_hh): (Option<Tensor<(Dyn,), E, D>>, Option<Tensor<(Dyn,), E, D>>) =
                match shape.bias {
                    true => (Some(ws[2].to()?), Some(ws[3].to()?)),
                    false => (None, None),
                };
            let h0 = Tensor::zeros_on((Dyn(b), Dyn(h)), device);
            let c0 = shape
                .lstm
                .then(|| Tensor::zeros_on((Dyn(b), Dyn(h)), device));
            let weights = RnnLayerWeights {
                weight_ih: &w_ih,
                weight_hh: &w_hh,
                bias_ih: b_ih.as_ref(),
                bias_hh: b_hh.as_ref(),
            };
            let y = input.try_rnn_from_input(mode, weights, &h0, c0.as_ref(), dir == 1)?;
            outs.push(y.try_narrow::<2>(0, h)?);
        }
        input = if shape.dirs == 1 {
            outs.pop().expect("one direction")
        } else {
            crate::ops::cat::try_cat::<2, _, _>(&outs)?
        };
    }
    Ok(input)
}

/// Unary row `name` on `t`.
fn unary<E: Float, D: Device<E>>(
    t: &Tensor6<E, D>,
    name: &str,
    params: &[f64],
) -> Result<Tensor6<E, D>> {
    /// Applies a unary row to the tensor it holds.
    struct Apply<'a, E: Float, D: Device<E>>(&'a Tensor6<E, D>);
    impl<E: Float, D: Device<E>> crate::ops::fused::RowVisitor for Apply<'_, E, D> {
        type Out = Option<Tensor6<E, D>>;
        fn unary<Op: crate::ops::unary::UnaryOp>(self, op: Op) -> Self::Out {
            Some(self.0.map_unary(op))
        }
        fn binary<Op: crate::ops::binary::BinaryOp>(self, _: Op) -> Self::Out {
            None
        }
    }
    crate::ops::unary::visit_row(name, params, Apply(t))
        .flatten()
        .ok_or_else(|| {
            Error::invalid(
                "compile",
                format!("no unary row `{name}` with {} parameters", params.len()),
            )
        })
}

/// Binary row `name` on `a` and `b`.
fn binary<E: Float, D: Device<E>>(
    a: &Tensor6<E, D>,
    b: &Tensor6<E, D>,
    name: &str,
) -> Result<Tensor6<E, D>> {
    crate::ops::binary::zip_row(a, b, name)
        .ok_or_else(|| Error::invalid("compile", format!("no binary row `{name}`")))?
}

/// `y` with sizes `out` (the graph's): a view when only the rank differs
/// (a product with a vector), an error when the sizes do.
fn fit<E: Float, D: Backend>(y: Slot<E, D>, out: &[usize]) -> Result<Slot<E, D>> {
    if y.dims() == out {
        return Ok(y);
    }
    if y.dims().iter().product::<usize>() != out.iter().product::<usize>() {
        return Err(Error::shape("compile", format!("{out:?}"), y.dims()));
    }
    Ok(view!(&y, out.len(), |t| t.try_reshape_to(six(out)?)))
}

/// Checks that input, parameter or buffer `id` of `g` is given `x`: the same
/// element type and rank, and sizes that agree with the graph's.
fn check_value<E: Float, D: Backend>(
    g: &Graph,
    id: ValueId,
    x: &Slot<E, D>,
    env: &HashMap<String, usize>,
) -> Result<()> {
    let v = &g.values[id];
    let want: Option<Vec<usize>> = v.dims.iter().map(|d| d.eval(env)).collect();
    if x.dtype() != v.dtype || want.as_deref() != Some(x.dims()) {
        let want: Vec<String> = v.dims.iter().map(ToString::to_string).collect();
        return Err(Error::invalid(
            "compile",
            format!(
                "`{}` is {}{:?} where the graph has {}[{}]",
                v.name,
                x.dtype(),
                x.dims(),
                v.dtype,
                want.join(", ")
            ),
        ));
    }
    Ok(())
}

/// A constant of the graph on `device`.
fn upload<E: Float, D: Device<E>>(data: &TensorData, device: &D) -> Result<Slot<E, D>> {
    let r = data.dims().len();
    let padded = TensorData::from_bytes(
        data.dtype(),
        six(data.dims())?.dims().to_vec(),
        data.bytes().to_vec(),
    )?;
    Ok(match data.dtype() {
        DType::I64 => Slot::Index(Tensor6::try_from_data(&padded, device)?, r),
        DType::Bool => Slot::Mask(Tensor6::try_from_data(&padded, device)?, r),
        d if d == E::DTYPE => Slot::Float(Tensor6::try_from_data(&padded, device)?, r),
        d => {
            return Err(Error::invalid(
                "compile",
                format!("a {d} constant in a {} graph", E::DTYPE),
            ))
        }
    })
}

/// What a replayed forward takes and gives: a tensor, or a tuple of them
/// (in [`super::Traced`] order).
pub trait Slots: Sized {
    /// The device of its tensors.
    type Device: Backend;

    /// The device of its first tensor.
    fn device(&self) -> Self::Device;

    /// Appends every tensor as a slot of a graph in float type `E`.
    ///
    /// # Errors
    /// A tensor of another float type.
    fn slots<E: Float>(&self, out: &mut Vec<Slot<E, Self::Device>>) -> Result<()>;

    /// The value made of the next slots of `it`.
    ///
    /// # Errors
    /// Too few slots, or one of another element type or sizes.
    fn from_slots<E: Float>(it: &mut dyn Iterator<Item = Slot<E, Self::Device>>) -> Result<Self>;
}

impl<S: Shape, X: Dtype, D: Backend> Slots for Tensor<S, X, D> {
    type Device = D;

    fn device(&self) -> D {
        self.device().clone()
    }

    fn slots<E: Float>(&self, out: &mut Vec<Slot<E, D>>) -> Result<()> {
        out.push(Slot::of(self)?);
        Ok(())
    }

    fn from_slots<E: Float>(it: &mut dyn Iterator<Item = Slot<E, D>>) -> Result<Self> {
        it.next()
            .ok_or_else(|| Error::invalid("compile", "the graph gives too few outputs"))?
            .to()
    }
}

macro_rules! slots_tuple {
    ($a:ident $ai:tt $(, $t:ident $i:tt)*) => {
        impl<$a: Slots $(, $t: Slots<Device = $a::Device>)*> Slots for ($a, $($t,)*) {
            type Device = $a::Device;

            fn device(&self) -> Self::Device {
                self.$ai.device()
            }

            fn slots<E: Float>(&self, out: &mut Vec<Slot<E, Self::Device>>) -> Result<()> {
                self.$ai.slots(out)?;
                $(self.$i.slots(out)?;)*
                Ok(())
            }

            fn from_slots<E: Float>(
                it: &mut dyn Iterator<Item = Slot<E, Self::Device>>,
            ) -> Result<Self> {
                Ok(($a::from_slots(it)?, $($t::from_slots(it)?,)*))
            }
        }
    };
}
slots_tuple!(A 0);
slots_tuple!(A 0, B 1);
slots_tuple!(A 0, B 1, C 2);
slots_tuple!(A 0, B 1, C 2, F 3);
