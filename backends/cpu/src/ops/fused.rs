//! Fused expressions in one pass: the expression's tree is one monomorphised
//! function, run through the same dense, row-wise and strided paths as the
//! table ops, for any number of operands.

use crate::dense::{dense_slices, map_blocks, Elementwise};
use crate::rows::Rows;
use crate::{collect_strided, Cpu};
use forma_core::dtype::Real;
use forma_core::ops::fused::{Expr, FusedKernel};
use forma_core::{Float, Layout, Result};

/// The expression's value, computed in the accumulation type and rounded
/// once.
struct Eval<X>(X);

impl<E: Float, X: Expr, const K: usize> Elementwise<E, K> for Eval<X> {
    type Out = E;
    #[inline(always)]
    fn at(&self, x: [E; K]) -> E {
        E::from_acc(self.0.eval(&x.map(Float::to_acc)))
    }
}

/// The gradient of input `WRT`: the operands are the inputs and then the
/// output gradient, which seeds the reverse sweep. `WRT` is a constant so
/// that the other inputs' partials are dropped from the loop.
struct Grad<X, const WRT: usize>(X);

impl<E: Float, X: Expr, const WRT: usize, const K: usize> Elementwise<E, K> for Grad<X, WRT> {
    type Out = E;
    #[inline(always)]
    fn at(&self, x: [E; K]) -> E {
        let x = x.map(Float::to_acc);
        let mut grad = [E::Acc::c(0.0); K];
        self.0.grad(&x, x[K - 1], &mut grad);
        E::from_acc(grad[WRT])
    }
}

/// `f` over views of one size: dense slices, rows, or the strided walk.
fn run<E: Float, F: Elementwise<E, K, Out = E>, const K: usize>(
    ins: [(&Vec<E>, &Layout); K],
    f: F,
) -> Vec<E> {
    let data = ins.map(|(s, _)| &s[..]);
    let layouts = ins.map(|(_, l)| l);
    if let Some(dense) = dense_slices(data, layouts) {
        return map_blocks(dense, f);
    }
    if let Some(rows) = Rows::plan(layouts) {
        return rows.map_blocks(data, f);
    }
    collect_strided(layouts, |offs| {
        f.at(std::array::from_fn(|k| data[k][offs[k]]))
    })
}

impl<E: Float> FusedKernel<E> for Cpu {
    fn fused<X: Expr, const N: usize>(
        &self,
        expr: X,
        ins: [(&Vec<E>, &Layout); N],
    ) -> Result<Option<Vec<E>>> {
        Ok(Some(run(ins, Eval(expr))))
    }

    fn fused_backward<X: Expr, const M: usize>(
        &self,
        expr: X,
        ins: [(&Vec<E>, &Layout); M],
        wrt: usize,
    ) -> Result<Option<Vec<E>>> {
        Ok(Some(match wrt {
            0 => run(ins, Grad::<X, 0>(expr)),
            1 => run(ins, Grad::<X, 1>(expr)),
            2 => run(ins, Grad::<X, 2>(expr)),
            3 => run(ins, Grad::<X, 3>(expr)),
            _ => return Ok(None),
        }))
    }

    fn fused_nodes(
        &self,
        nodes: &[forma_core::graph::Elem],
        ins: &[(&Vec<E>, &Layout)],
    ) -> Result<Option<Vec<E>>> {
        super::fused_nodes::run(nodes, ins).map(Some)
    }
}
