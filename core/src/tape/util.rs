//! Helpers backward closures share: summing a broadcast gradient back to an
//! input's sizes, reshaping and making zeros, all on erased [`Raw`] tensors.

use super::Raw;
use crate::device::{Backend, Device};
use crate::dtype::{Dtype, Float};
use crate::error::Result;
use crate::layout::Layout;
use crate::ops::reduce::ReduceOp;

/// Sums `g` over the dims that broadcasting stretched, so it has `dims`
/// (aligned from the right, as in broadcasting).
///
/// # Errors
/// A backend failure.
pub fn sum_to<E: Float, D: Device<E>>(g: &Raw<E, D>, dims: &[usize]) -> Result<Raw<E, D>> {
    if &*g.layout.dims == dims {
        return Ok(g.clone());
    }
    let mut cur = g.clone();
    let extra = cur.layout.rank() - dims.len();
    // Leading dims that broadcasting added: sum them away one at a time.
    for _ in 0..extra {
        let s = cur
            .device
            .reduce(ReduceOp::Sum, &cur.storage(), &cur.layout, 0)?;
        let rest: Vec<usize> = cur.layout.dims[1..].to_vec();
        cur = Raw::new(s, &rest, cur.device.clone());
    }
    for (i, &d) in dims.iter().enumerate() {
        if d == 1 && cur.layout.dims[i] != 1 {
            let s = cur
                .device
                .reduce(ReduceOp::Sum, &cur.storage(), &cur.layout, i)?;
            let mut kept = cur.layout.dims;
            kept[i] = 1;
            cur = Raw::new(s, &kept, cur.device.clone());
        }
    }
    Ok(cur)
}

/// `g` with new sizes (a view when contiguous, else a copy).
///
/// # Errors
/// A backend failure.
pub fn reshape<E: Dtype, D: Backend>(g: &Raw<E, D>, dims: &[usize]) -> Result<Raw<E, D>> {
    if &*g.layout.dims == dims {
        // The identity: a strided view stays a view.
        return Ok(g.clone());
    }
    match g.layout.reshape(dims) {
        Some(layout) => Ok(Raw {
            layout,
            ..g.clone()
        }),
        None => {
            let s = g.device.contiguous(&g.storage(), &g.layout)?;
            Ok(Raw::new(s, dims, g.device.clone()))
        }
    }
}

/// Zeros of `dims` with `g` copied into the view `place` of them (the backward
/// of narrow, slice and cat).
///
/// # Errors
/// A backend failure.
pub fn embed<E: Dtype, D: Backend>(
    g: &Raw<E, D>,
    dims: &[usize],
    place: &Layout,
) -> Result<Raw<E, D>> {
    let numel = dims.iter().product();
    let mut s = g.device.full(numel, E::from_f64(0.0))?;
    g.device
        .copy_strided(&g.storage(), &g.layout, &mut s, place)?;
    Ok(Raw::new(s, dims, g.device.clone()))
}
