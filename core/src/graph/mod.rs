//! Graph capture: the ops a forward pass ran, as a small graph that other
//! runtimes can execute (ONNX export) or a compiler can rewrite.
//!
//! **How a graph is made.** [`Capture`] turns capture mode on for this
//! thread; the caller (`forma::nn::capture`) registers the inputs (naming
//! their `Dyn` sizes), the parameters and buffers (by `state_dict` key),
//! runs the forward eagerly, and [`Capture::finish`]es with the outputs.
//! While capture is on, every core op notes itself (one line beside its
//! kernel call: `graph::note(op, inputs, output)`), so the graph holds
//! exactly the ops that ran, in order, each with the module path that ran
//! it. Values are found by storage and layout; an op whose output another
//! op later records as its own (a fused linear over its composed matmul
//! and add) simply replaces it, and [`Capture::finish`] drops nodes no
//! output depends on.
//!
//! **Sizes.** A `Dyn` size of an input is a symbol (`batch`, `seq`) and
//! every value's sizes are [`Dim`]s: numbers, or expressions of the
//! symbols that each op's shape rule ([`Op::out_dims`]) derives and
//! capture checks against the sizes the op really produced. Reshapes,
//! expands and slices hold their target sizes as such expressions, so
//! the graph runs at any size of its symbols.
//!
//! **What stops a capture.** Reading a value computed from the inputs on
//! the host (`to_vec`, `item`: the program would branch on data), writing
//! into a captured value in place, or using a tensor made by an op with no
//! graph form: [`Capture::finish`] returns an error naming the op and the
//! module path, and never a graph that computes something else.

mod capture;
mod dim;
mod fuse;
mod op;
mod replay;

pub(crate) use capture::{
    alias, born, host_read, note_arange, note_expand, note_reshape, note_slice, write,
};
pub use capture::{capturing, note, refuse, Capture, Traced, Val};

/// Notes `$op` with operands `[$x, ..]` and result `$out` when a capture is
/// running: the line each op adds beside its kernel call.
macro_rules! note_op {
    ($op:expr, [$($x:expr),*], $out:expr) => {
        if $crate::graph::capturing() {
            $crate::graph::note($op, &[$($x.val()),*], &$out.val());
        }
    };
}
pub use dim::{product, Dim, Expr};
pub use fuse::fuse_elementwise;
pub(crate) use note_op;
pub use op::{Elem, Op};
pub use replay::{narrow_to, widen, Replay, Slot, Slots, Tensor6};

use crate::dtype::DType;
use crate::tensor::TensorData;
use std::fmt;

/// Index of a value in [`Graph::values`].
pub type ValueId = usize;

/// A captured forward pass.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// Every value: inputs, parameters, constants and node outputs.
    pub values: Vec<Value>,
    /// The ops in the order they ran.
    pub nodes: Vec<Node>,
    /// The graph's inputs, in the forward's argument order.
    pub inputs: Vec<ValueId>,
    /// The forward's outputs.
    pub outputs: Vec<ValueId>,
    /// The symbolic sizes: where each comes from and its value at capture.
    pub symbols: Vec<Symbol>,
}

/// A value of the graph.
#[derive(Clone, Debug)]
pub struct Value {
    /// Its name: the input's name, the parameter's `state_dict` key, or `vN`.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its sizes.
    pub dims: Vec<Dim>,
    /// Where it comes from.
    pub source: Source,
}

/// Where a [`Value`] comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A graph input.
    Input,
    /// A parameter or buffer, with its values at capture.
    Param(TensorData),
    /// A tensor made during the forward from no input (a mask, a table).
    Constant(TensorData),
    /// The output of node `n`.
    Node(usize),
}

/// One op that ran.
#[derive(Clone, Debug)]
pub struct Node {
    /// The op and its attributes.
    pub op: Op,
    /// Its operands.
    pub inputs: Vec<ValueId>,
    /// Its result.
    pub output: ValueId,
    /// The dotted path of the module that ran it (`""` at the top).
    pub path: String,
}

/// A symbolic size: axis `axis` of graph input `input`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Its name.
    pub name: String,
    /// The position of the input in [`Graph::inputs`].
    pub input: usize,
    /// The axis.
    pub axis: usize,
    /// Its size at capture.
    pub example: usize,
}

impl Graph {
    /// The ops that ran, by name, in order (each once): what an exporter
    /// must map.
    pub fn op_names(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        for n in &self.nodes {
            if !names.contains(&n.op.name()) {
                names.push(n.op.name());
            }
        }
        names
    }

    /// The parameters and buffers the graph reads, as `(key, value id)`.
    pub fn params(&self) -> impl Iterator<Item = (&str, ValueId)> {
        self.values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| match v.source {
                Source::Param(_) => Some((v.name.as_str(), i)),
                _ => None,
            })
    }
}

impl Graph {
    /// Checks that `other`, captured from the same forward at other sizes of
    /// the symbols, is this graph: the same ops with the same attributes
    /// and symbolic sizes, and constants of the same sizes. A difference
    /// means the forward depends on its input sizes in a way the graph does
    /// not express (a loop over a `Dyn` size, a table built at the example's
    /// length, a size read on the host): the graph would compute something
    /// else at other sizes.
    ///
    /// # Errors
    /// The first difference, naming the op and its module path.
    pub fn check_same_as(&self, other: &Graph) -> crate::Result<()> {
        let sizes = |g: &Graph| {
            let s: Vec<String> = g
                .symbols
                .iter()
                .map(|s| format!("{}={}", s.name, s.example))
                .collect();
            s.join(", ")
        };
        let err = |what: String| {
            Err(crate::Error::invalid(
                "capture",
                format!(
                    "the forward's graph changes with the input sizes ({what}; captured at {} \
                     and at {}): it depends on a size in a way the graph cannot express, such \
                     as a loop over a `Dyn` size or a tensor built on the host from a size, and \
                     would compute something else at other sizes",
                    sizes(self),
                    sizes(other)
                ),
            ))
        };
        let at = |n: &Node| {
            if n.path.is_empty() {
                format!("`{}`", n.op.name())
            } else {
                format!("`{}` in module `{}`", n.op.name(), n.path)
            }
        };
        for (a, b) in self.nodes.iter().zip(&other.nodes) {
            let same_values = a.inputs.len() == b.inputs.len()
                && a.inputs.iter().zip(&b.inputs).all(|(&i, &j)| {
                    let (x, y) = (&self.values[i], &other.values[j]);
                    x.dims == y.dims && x.dtype == y.dtype
                });
            if a.op != b.op || a.path != b.path || !same_values {
                return err(format!("{} differs", at(a)));
            }
        }
        if self.nodes.len() != other.nodes.len() {
            let (longer, n) = if self.nodes.len() > other.nodes.len() {
                (&self.nodes, other.nodes.len())
            } else {
                (&other.nodes, self.nodes.len())
            };
            return err(format!(
                "{} and {} ops; the first extra is {}",
                self.nodes.len(),
                other.nodes.len(),
                at(&longer[n])
            ));
        }
        let outs = |g: &Graph| {
            g.outputs
                .iter()
                .map(|&o| g.values[o].dims.clone())
                .collect::<Vec<_>>()
        };
        if outs(self) != outs(other) {
            return err("the outputs' sizes differ".into());
        }
        Ok(())
    }
}

fn type_str(v: &Value) -> String {
    let dims: Vec<String> = v.dims.iter().map(|d| d.to_string()).collect();
    format!(
        "{}[{}]",
        format!("{:?}", v.dtype).to_lowercase(),
        dims.join(", ")
    )
}

/// One node per line, like `torch.fx`'s graph printing:
/// `%v7: f32[batch, 128] = linear(%x, %fc1.weight, %fc1.bias)  # fc1`.
impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args: Vec<String> = self
            .inputs
            .iter()
            .map(|&i| format!("%{}: {}", self.values[i].name, type_str(&self.values[i])))
            .collect();
        writeln!(f, "graph({}):", args.join(", "))?;
        for v in &self.values {
            match &v.source {
                Source::Param(_) => writeln!(f, "    %{}: {} = param", v.name, type_str(v))?,
                Source::Constant(_) => writeln!(f, "    %{}: {} = constant", v.name, type_str(v))?,
                _ => {}
            }
        }
        for n in &self.nodes {
            let out = &self.values[n.output];
            let ins: Vec<String> = n
                .inputs
                .iter()
                .map(|&i| format!("%{}", self.values[i].name))
                .collect();
            write!(
                f,
                "    %{}: {} = {}({})",
                out.name,
                type_str(out),
                n.op,
                ins.join(", ")
            )?;
            if n.path.is_empty() {
                writeln!(f)?;
            } else {
                writeln!(f, "  # {}", n.path)?;
            }
        }
        let outs: Vec<String> = self
            .outputs
            .iter()
            .map(|&i| format!("%{}", self.values[i].name))
            .collect();
        writeln!(f, "    return ({})", outs.join(", "))
    }
}
