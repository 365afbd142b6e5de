//! Every unary table row through one kernel, monomorphised per op; a
//! vectorisable slice loop when the operands are dense.

use crate::dense::{dense_slices, map1, map3};
use crate::rows::{zip2, zip3, Rows};
use crate::{collect_strided, Cpu};
use forma_core::ops::unary::{UnaryKernel, UnaryOp};
use forma_core::{Float, Layout, Result};

impl<E: Float> UnaryKernel<E> for Cpu {
    fn unary<Op: UnaryOp>(&self, op: Op, x: &Vec<E>, layout: &Layout) -> Result<Vec<E>> {
        if let Some([x]) = dense_slices([x], [layout]) {
            return Ok(map1(x, |v: E| E::from_acc(op.f(v.to_acc()))));
        }
        if let Some(rows) = Rows::plan([layout]) {
            let f = |v: E, _: ()| E::from_acc(op.f(v.to_acc()));
            return Ok(rows.build(|[ix], out| zip2(out, (x, ix), (&[()], (0, false)), f)));
        }
        Ok(collect_strided([layout], |[o]| {
            E::from_acc(op.f(x[o].to_acc()))
        }))
    }

    fn unary_backward<Op: UnaryOp>(
        &self,
        op: Op,
        x: &Vec<E>,
        lx: &Layout,
        y: &Vec<E>,
        ly: &Layout,
        g: &Vec<E>,
        lg: &Layout,
    ) -> Result<Vec<E>> {
        if let Some([x, y, g]) = dense_slices([x, y, g], [lx, ly, lg]) {
            return Ok(map3(x, y, g, |x: E, y: E, g: E| {
                E::from_acc(g.to_acc() * op.df(x.to_acc(), y.to_acc()))
            }));
        }
        if let Some(rows) = Rows::plan([lx, ly, lg]) {
            let f = |x: E, y: E, g: E| E::from_acc(g.to_acc() * op.df(x.to_acc(), y.to_acc()));
            return Ok(rows.build(|[ix, iy, ig], out| zip3(out, (x, ix), (y, iy), (g, ig), f)));
        }
        Ok(collect_strided([lx, ly, lg], |[i, j, k]| {
            E::from_acc(g[k].to_acc() * op.df(x[i].to_acc(), y[j].to_acc()))
        }))
    }
}
