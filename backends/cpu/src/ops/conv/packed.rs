//! Convolutions on a weight packed once (eager inference): where an image
//! has few output positions (ResNet-18's last two stages: 14x14 and 7x7),
//! `W @ col` packs the whole `[c_out, c_in * kh * kw]` weight for a few
//! hundred columns, per image: 12% of ResNet-18's b1 inference. Here the
//! product is computed the other way round, `out^T = col^T @ W^T`, with
//! `W^T` the right operand packed by [`PackedB`] once and kept by core
//! while the weight is unchanged; the images are stacked as in
//! [`super::conv2d_stacked`], and each run's `[positions, c_out]` result
//! is written back transposed.

use super::{geometry, stacked_cols, Buffers, Geometry, Scratch, STACK_COLUMNS, STACK_MAX_COL};
use crate::ops::matmul::{dense_acc, same_ref, same_vec};
use crate::ops::sgemm::{self, PackedB, View};
use forma_core::ops::conv::Conv2dParams;
use forma_core::ops::matmul::PackedRhs;
use forma_core::{Error, Float, Layout, Result};
use std::any::TypeId;
use std::mem::MaybeUninit;

/// Output positions per image below which the weight is packed once.
const PACK_BELOW: usize = 256;

/// Whether convolutions of geometry `g` read a packed weight: f32 on a CPU
/// with the sgemm kernels, one group, few positions per image.
fn packs<E: Float>(g: &Geometry) -> bool {
    TypeId::of::<E>() == TypeId::of::<f32>()
        && sgemm::available()
        && g.p.groups == 1
        && g.positions() > 0
        && g.positions() < PACK_BELOW
        && g.patch() > 0
        && g.c_out > 0
}

/// The weight of layout `lw` packed as `W^T` (`[c_in * kh * kw, c_out]`),
/// for inputs of `x_dims`; `None` where [`packs`] says no.
pub(super) fn pack<E: Float>(
    w: &Vec<E>,
    lw: &Layout,
    x_dims: &[usize],
    p: &Conv2dParams,
) -> Result<Option<PackedRhs>> {
    let Some(w) = same_ref::<E, f32>(w) else {
        return Ok(None);
    };
    let Ok(g) = Geometry::new(x_dims, &lw.dims, p) else {
        return Ok(None); // the convolution reports it
    };
    if !packs::<E>(&g) || lw.span() > w.len() {
        return Ok(None);
    }
    let (k, n) = (g.patch(), g.c_out);
    let dense = dense_acc::<f32>(w, lw);
    let wt = View {
        data: &dense,
        off: 0,
        rs: 1,
        cs: k,
    };
    let packed = PackedB::new(wt, k, n, crate::par::threads());
    Ok(Some(PackedRhs {
        k,
        n,
        data: std::sync::Arc::new(packed),
    }))
}

/// The convolution of `x` by the weight packed by [`pack`] (`lw` its
/// layout): `None` where [`packs`] says no or the copy is not such a one.
pub(super) fn conv2d<E: Float>(
    x: &Vec<E>,
    lx: &Layout,
    w: &PackedRhs,
    lw: &Layout,
    p: &Conv2dParams,
) -> Result<Option<Vec<E>>> {
    let (Some(xf), Some(pb)) = (same_ref::<E, f32>(x), w.data.downcast_ref::<PackedB>()) else {
        return Ok(None);
    };
    let g = geometry(lx, lw, p)?;
    if !packs::<E>(&g) || (w.k, w.n) != (g.patch(), g.c_out) {
        return Ok(None);
    }
    if lx.span() > x.len() {
        return Err(Error::invalid(
            "conv2d",
            "the input view reaches past its storage",
        ));
    }
    let xs = dense_acc::<f32>(xf, lx);
    let out = run(&xs, pb, &g);
    Ok(same_vec::<f32, E>(out).ok())
}

/// `[n, c_out, oh, ow]` from a dense `x`, images stacked up to
/// [`STACK_COLUMNS`] columns.
fn run(x: &[f32], pb: &PackedB, g: &Geometry) -> Vec<f32> {
    let (kk, l, co) = (g.patch(), g.positions(), g.c_out);
    let out_img = co * l;
    let mut out = vec![0.0f32; g.n * out_img];
    if out.is_empty() {
        return out;
    }
    let per_run = STACK_COLUMNS
        .div_ceil(l)
        .min(STACK_MAX_COL / (kk * l))
        .clamp(1, g.n);
    let mut scratch = Scratch::<f32>::take();
    let Buffers { col, pad, run, .. } = &mut *scratch;
    for i0 in (0..g.n).step_by(per_run) {
        let b = per_run.min(g.n - i0);
        let cols = b * l;
        stacked_cols(x, g, (i0, b), 0, col, pad);
        let t = Scratch::at_least(run, cols * co);
        let a = View {
            data: &col[..kk * cols],
            off: 0,
            rs: 1,
            cs: cols,
        };
        // SAFETY: `MaybeUninit<f32>` has `f32`'s layout, and `sgemm` only
        // writes through the slice.
        let dst = unsafe { &mut *(t as *mut [f32] as *mut [MaybeUninit<f32>]) };
        pb.sgemm(dst, cols, a, None, true);
        transpose_into(t, &mut out[i0 * out_img..(i0 + b) * out_img], l, co);
    }
    out
}

/// Positions per block of the transposed copy.
const BLOCK: usize = 16;

/// Writes `t` (`[b * l, co]`: a run's positions by channel) to `out`
/// (`[b, co, l]`), a block of positions at a time so both sides move in
/// whole lines.
fn transpose_into(t: &[f32], out: &mut [f32], l: usize, co: usize) {
    for (img, o) in out.chunks_exact_mut(co * l).enumerate() {
        let t = &t[img * l * co..(img + 1) * l * co];
        for p0 in (0..l).step_by(BLOCK) {
            let pn = BLOCK.min(l - p0);
            for c in 0..co {
                let dst = &mut o[c * l + p0..c * l + p0 + pn];
                for (q, d) in dst.iter_mut().enumerate() {
                    *d = t[(p0 + q) * co + c];
                }
            }
        }
    }
}
