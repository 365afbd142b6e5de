//! The graph pass "elementwise fusion": each chain of elementwise nodes
//! (unary and binary table rows, fused expressions) whose intermediate
//! values nothing else reads becomes one [`Op::Fused`] node, which a
//! backend runs in one pass over memory
//! ([`crate::ops::fused::FusedKernel::fused_nodes`]) where the composed
//! ops make one pass each, like the pointwise kernels `torch.compile`
//! generates. A batch norm in eval mode followed by a ReLU (subtract,
//! multiply, add, clamp: four passes) is one.

use super::{Elem, Graph, Op, Source, ValueId};
use crate::dtype::DType;
use std::collections::HashMap;

/// Whether `op` is elementwise over its broadcast inputs.
fn elementwise(op: &Op) -> bool {
    matches!(op, Op::Unary { .. } | Op::Binary { .. } | Op::Fused { .. })
}

/// Rewrites `g` so that each chain of elementwise nodes is one
/// [`Op::Fused`] node, and gives how many such nodes the pass made.
///
/// A node joins the node that reads it when that is its value's only use
/// (not an output of the graph), both are elementwise over one float
/// type, and the two values have the same sizes (so no intermediate is
/// recomputed at positions it was broadcast to). The merged node takes
/// the place of the last node of its chain; its inputs are the chain's
/// other operands, each once.
pub fn fuse_elementwise(g: &mut Graph) -> usize {
    let float = |id: ValueId| {
        matches!(
            g.values[id].dtype,
            DType::F32 | DType::F64 | DType::F16 | DType::BF16
        )
    };
    let mut uses = vec![0usize; g.values.len()];
    for n in &g.nodes {
        for &v in &n.inputs {
            uses[v] += 1;
        }
    }
    for &o in &g.outputs {
        uses[o] += 1;
    }
    let mut producer = vec![None; g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        if let Source::Node(_) = g.values[n.output].source {
            producer[n.output] = Some(i);
        }
    }
    let fusable = |i: usize| {
        let n = &g.nodes[i];
        elementwise(&n.op)
            && float(n.output)
            && n.inputs
                .iter()
                .all(|&v| g.values[v].dtype == g.values[n.output].dtype)
    };
    let mut absorbed = vec![false; g.nodes.len()];
    let mut merged: Vec<(usize, Op, Vec<ValueId>)> = Vec::new();
    for root in (0..g.nodes.len()).rev() {
        if absorbed[root] || !fusable(root) {
            continue;
        }
        let mut b = Builder {
            g,
            nodes: Vec::new(),
            args: Vec::new(),
            arg_of: HashMap::new(),
            absorbed: Vec::new(),
            dims: &g.values[g.nodes[root].output].dims,
            uses: &uses,
            producer: &producer,
            fusable: &fusable,
        };
        b.node(root);
        if b.absorbed.is_empty() || !crate::ops::fused::runnable(&b.nodes, b.args.len()) {
            continue;
        }
        for &a in &b.absorbed {
            absorbed[a] = true;
        }
        merged.push((root, Op::Fused { nodes: b.nodes }, b.args));
    }
    let made = merged.len();
    for (root, op, inputs) in merged {
        g.nodes[root].op = op;
        g.nodes[root].inputs = inputs;
    }
    let mut i = 0;
    g.nodes.retain(|_| {
        i += 1;
        !absorbed[i - 1]
    });
    for (i, n) in g.nodes.iter().enumerate() {
        g.values[n.output].source = Source::Node(i);
    }
    made
}

/// Builds one chain's expression, from its last node back.
struct Builder<'a, F> {
    g: &'a Graph,
    nodes: Vec<Elem>,
    args: Vec<ValueId>,
    arg_of: HashMap<ValueId, usize>,
    absorbed: Vec<usize>,
    dims: &'a [super::Dim],
    uses: &'a [usize],
    producer: &'a [Option<usize>],
    fusable: &'a F,
}

impl<F: Fn(usize) -> bool> Builder<'_, F> {
    /// The expression node computing value `v`: node `p`'s expression when
    /// `v` may join the chain, else an input.
    fn value(&mut self, v: ValueId) -> usize {
        if let Some(p) = self.producer[v] {
            if self.uses[v] == 1 && (self.fusable)(p) && self.g.values[v].dims == self.dims {
                self.absorbed.push(p);
                return self.node(p);
            }
        }
        if let Some(&e) = self.arg_of.get(&v) {
            return e;
        }
        self.nodes.push(Elem::Arg(self.args.len()));
        self.args.push(v);
        let e = self.nodes.len() - 1;
        self.arg_of.insert(v, e);
        e
    }

    /// The expression of node `i` over its operands' expressions.
    fn node(&mut self, i: usize) -> usize {
        let g = self.g;
        let n = &g.nodes[i];
        let ins = &n.inputs;
        match &n.op {
            Op::Unary { name, params } => {
                let x = self.value(ins[0]);
                self.nodes.push(Elem::Unary {
                    name,
                    params: params.clone(),
                    x,
                });
            }
            Op::Binary { name } => {
                let a = self.value(ins[0]);
                let b = self.value(ins[1]);
                self.nodes.push(Elem::Binary { name, a, b });
            }
            Op::Fused { nodes } => {
                let mut at: Vec<usize> = Vec::with_capacity(nodes.len());
                for e in nodes {
                    let k = match e {
                        Elem::Arg(j) => self.value(ins[*j]),
                        Elem::Unary { name, params, x } => {
                            self.nodes.push(Elem::Unary {
                                name,
                                params: params.clone(),
                                x: at[*x],
                            });
                            self.nodes.len() - 1
                        }
                        Elem::Binary { name, a, b } => {
                            self.nodes.push(Elem::Binary {
                                name,
                                a: at[*a],
                                b: at[*b],
                            });
                            self.nodes.len() - 1
                        }
                    };
                    at.push(k);
                }
                return *at.last().expect("a fused node has nodes");
            }
            _ => unreachable!("only elementwise nodes join a chain"),
        }
        self.nodes.len() - 1
    }
}
