//! Fused expressions whose ops are known only at run time: the chains of
//! elementwise nodes a compiled graph merges into one
//! [`crate::graph::Op::Fused`] node ([`crate::graph::fuse_elementwise`]).
//!
//! [`super::fused`] monomorphises its expression, which needs the ops at
//! compile time. A graph's expression is a list of [`Elem`]s instead; a
//! backend runs it with [`super::FusedKernel::fused_nodes`], turning each
//! row into its own monomorphised kernel once per call through
//! [`RowVisitor`], and applying the rows block by block, so intermediates
//! stay in cache rather than going to memory between ops.

use crate::graph::Elem;
use crate::ops::binary::BinaryOp;
use crate::ops::unary::UnaryOp;

/// Receives a table row as its op type: how a backend turns a row named at
/// run time into the kernel it compiled for that op.
pub trait RowVisitor {
    /// What the visitor makes of a row.
    type Out;
    /// A unary row.
    fn unary<Op: UnaryOp>(self, op: Op) -> Self::Out;
    /// A binary row.
    fn binary<Op: BinaryOp>(self, op: Op) -> Self::Out;
}

/// Hands the row of expression node `e` to `v`: `None` for an input, or a
/// name (or parameter count) no row has.
pub fn visit_row<V: RowVisitor>(e: &Elem, v: V) -> Option<V::Out> {
    match e {
        Elem::Arg(_) => None,
        Elem::Unary { name, params, .. } => crate::ops::unary::visit_row(name, params, v),
        Elem::Binary { name, .. } => crate::ops::binary::visit_row(name, v),
    }
}

/// Whether every node of `nodes` is an input or a row a backend can run
/// (each operand made before its use, the last node the result).
pub fn runnable(nodes: &[Elem], inputs: usize) -> bool {
    struct Known;
    impl RowVisitor for Known {
        type Out = ();
        fn unary<Op: UnaryOp>(self, _: Op) {}
        fn binary<Op: BinaryOp>(self, _: Op) {}
    }
    !nodes.is_empty()
        && nodes.iter().enumerate().all(|(i, e)| match e {
            Elem::Arg(a) => *a < inputs,
            Elem::Unary { x, .. } => *x < i && visit_row(e, Known).is_some(),
            Elem::Binary { a, b, .. } => *a < i && *b < i && visit_row(e, Known).is_some(),
        })
}
