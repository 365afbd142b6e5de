//! Comparisons and `where`.

use super::binary::zip_strided;
use crate::{map_strided, Cpu};
use forma_core::ops::cmp::{CmpKernel, CmpOp};
use forma_core::{Float, Layout, Result};

impl<E: Float> CmpKernel<E> for Cpu {
    fn cmp(
        &self,
        op: CmpOp,
        a: &Vec<E>,
        la: &Layout,
        b: &Vec<E>,
        lb: &Layout,
    ) -> Result<Vec<bool>> {
        let mut out = vec![false; la.numel()];
        // One monomorphic loop per comparison: the match runs once, not per element.
        match op {
            CmpOp::Eq => zip_strided(&mut out, a, la, b, lb, |x: E, y: E| x == y),
            CmpOp::Ne => zip_strided(&mut out, a, la, b, lb, |x: E, y: E| x != y),
            CmpOp::Lt => zip_strided(&mut out, a, la, b, lb, |x: E, y: E| x < y),
            CmpOp::Le => zip_strided(&mut out, a, la, b, lb, |x: E, y: E| x <= y),
            CmpOp::Gt => zip_strided(&mut out, a, la, b, lb, |x: E, y: E| x > y),
            CmpOp::Ge => zip_strided(&mut out, a, la, b, lb, |x: E, y: E| x >= y),
        }
        Ok(out)
    }

    fn where_cond(
        &self,
        cond: &Vec<bool>,
        lc: &Layout,
        a: &Vec<E>,
        la: &Layout,
        b: &Vec<E>,
        lb: &Layout,
    ) -> Result<Vec<E>> {
        let mut out = vec![E::default(); la.numel()];
        map_strided(
            &mut out,
            [lc, la, lb],
            |[i, j, k]| if cond[i] { a[j] } else { b[k] },
        );
        Ok(out)
    }
}
