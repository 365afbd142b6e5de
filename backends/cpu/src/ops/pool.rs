//! Max and average pooling over `[n, c, h, w]`, one `h x w` plane at a time,
//! planes in parallel (`crate::par`). Both follow PyTorch's CPU kernels, including
//! their order of evaluation: max pooling skips padding and lets NaN win;
//! average pooling sums in the accumulation type and divides by PyTorch's
//! count (see [`avg_plane`]).
//!
//! Max pooling whose windows tile the input (kernel == stride, no padding or
//! dilation, e.g. the usual 2x2) takes a fast path, forward and backward,
//! that works on whole output rows so it vectorises, with the same
//! results bit for bit (see [`tiles`]).

use super::conv::tap_range;
use crate::{gather_vec, Cpu, PAR_CHUNK};
use forma_core::dtype::Real;
use forma_core::ops::pool::{check_pool, Pool2dParams, PoolKernel};
use forma_core::{Dtype, Error, Float, Layout, Result};
use std::borrow::Cow;

/// Where one output position's window lies along one dim.
#[derive(Clone, Copy, Debug)]
struct Span {
    /// Position of the first tap (negative inside the leading padding).
    start: isize,
    /// Taps `lo..hi` of the window fall inside the input.
    lo: usize,
    hi: usize,
}

/// The window of every output position along one dim.
fn spans(
    out: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    dil: usize,
    size: usize,
) -> Vec<Span> {
    (0..out)
        .map(|o| {
            let start = (o * stride) as isize - pad as isize;
            let (lo, hi) = tap_range(start, dil, kernel, size);
            Span { start, lo, hi }
        })
        .collect()
}

/// The windows of every output row and column of an `h x w` plane.
fn window_spans(p: &Pool2dParams, out: [usize; 2], h: usize, w: usize) -> (Vec<Span>, Vec<Span>) {
    let along = |i: usize, size: usize| {
        spans(
            out[i],
            p.kernel[i],
            p.stride[i],
            p.padding[i],
            p.dilation[i],
            size,
        )
    };
    (along(0, h), along(1, w))
}

/// The maximum of one window of a dense plane of width `w`, PyTorch's way:
/// taps in row-major order, a larger value or a NaN replaces the running
/// maximum (so a NaN, once taken, is never replaced by a number); a window
/// of only padding gives -inf.
#[inline(always)]
fn max_window<E: Float>(x: &[E], w: usize, r: &Span, c: &Span, [dh, dw]: [usize; 2]) -> E {
    let mut m = E::neg_infinity();
    for i in r.lo..r.hi {
        let y = (r.start + (i * dh) as isize) as usize;
        let xrow = &x[y * w..(y + 1) * w];
        for j in c.lo..c.hi {
            let v = xrow[(c.start + (j * dw) as isize) as usize];
            if take_max(m, v) {
                m = v;
            }
        }
    }
    m
}

/// Max pooling of one dense `h x w` plane with windows `kw` taps wide:
/// each output is [`max_window`]'s. The columns whose whole window lies
/// inside the row (all but a padded edge) take their taps one at a time
/// across the output row, in the same order per output, so the loop runs
/// over contiguous outputs and vectorises; the same values, bit for bit.
fn max_plane<E: Float>(
    x: &[E],
    w: usize,
    out: &mut [E],
    rows: &[Span],
    cols: &[Span],
    dil: [usize; 2],
    kw: usize,
) {
    crate::simd::run(MaxPlane {
        x,
        w,
        out,
        rows,
        cols,
        dil,
        kw,
    })
}

/// [`max_plane`]'s loops, compiled for the widest vectors the CPU has.
struct MaxPlane<'a, E> {
    x: &'a [E],
    w: usize,
    out: &'a mut [E],
    rows: &'a [Span],
    cols: &'a [Span],
    dil: [usize; 2],
    kw: usize,
}

impl<E: Float> crate::simd::Vectorized for MaxPlane<'_, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let MaxPlane {
            x,
            w,
            out,
            rows,
            cols,
            dil,
            kw,
        } = self;
        let [dh, dw] = dil;
        let ow = cols.len();
        let full = |c: &Span| c.lo == 0 && c.hi == kw;
        let (a, b) = match (cols.iter().position(full), cols.iter().rposition(full)) {
            (Some(a), Some(b)) => (a, b + 1),
            _ => (0, 0),
        };
        let stride = if b > a + 1 {
            (cols[a + 1].start - cols[a].start) as usize
        } else {
            1
        };
        for (r, orow) in rows.iter().zip(out.chunks_exact_mut(ow)) {
            for (c, o) in cols[..a].iter().zip(&mut orow[..a]) {
                *o = max_window(x, w, r, c, dil);
            }
            for (c, o) in cols[b..].iter().zip(&mut orow[b..]) {
                *o = max_window(x, w, r, c, dil);
            }
            let mid = &mut orow[a..b];
            if mid.is_empty() {
                continue;
            }
            mid.fill(E::neg_infinity());
            for i in r.lo..r.hi {
                let y = (r.start + (i * dh) as isize) as usize;
                let xrow = &x[y * w..(y + 1) * w];
                for j in 0..kw {
                    let first = (cols[a].start + (j * dw) as isize) as usize;
                    let taps = &xrow[first..first + (mid.len() - 1) * stride + 1];
                    match stride {
                        1 => tap_row::<E, 1>(mid, taps, 1),
                        2 => tap_row::<E, 2>(mid, taps, 2),
                        _ => tap_row::<E, 0>(mid, taps, stride),
                    }
                }
            }
        }
    }
}

/// One tap of every window of an output row: `out[k]` takes `taps[k *
/// stride]` where [`take_max`] says so. `S` is the stride when it is known
/// at compile time (1 or 2, so the loads vectorise), else 0.
#[inline(always)]
fn tap_row<E: Float, const S: usize>(out: &mut [E], taps: &[E], stride: usize) {
    let s = if S == 0 { stride } else { S };
    for (k, o) in out.iter_mut().enumerate() {
        let v = taps[k * s];
        *o = if take_max(*o, v) { v } else { *o };
    }
}

/// `if on { a } else { b }`.
#[inline(always)]
fn pick<E: Float>(on: bool, a: E, b: E) -> E {
    if on {
        a
    } else {
        b
    }
}

/// Max pooling's step, PyTorch's test: whether `v` replaces the running
/// maximum `m` (it is larger, or NaN; a NaN taken is never replaced by a
/// number, but a later NaN does replace it).
#[inline(always)]
fn take_max<E: Float>(m: E, v: E) -> bool {
    v > m || v.is_nan()
}

/// Whether pooling windows tile the input without overlap or padding
/// (`kernel == stride`, no padding, dilation 1, every window inside), so
/// [`max_plane_tiled`] and [`max_plane_tiled_backward`] apply.
fn tiles(p: &Pool2dParams, out: [usize; 2], h: usize, w: usize) -> bool {
    p.kernel == p.stride
        && p.padding == [0, 0]
        && p.dilation == [1, 1]
        && p.kernel[0] > 0
        && p.kernel[1] > 0
        && out[0] * p.kernel[0] <= h
        && out[1] * p.kernel[1] <= w
}

/// [`max_plane`] for tiling windows (see [`tiles`]): taps in the same
/// row-major order per window, but each tap applied across a whole output
/// row, so the loops run over contiguous outputs and vectorise.
#[inline(always)]
fn max_plane_tiled<E: Float>(x: &[E], w: usize, out: &mut [E], ow: usize, kh: usize, kw: usize) {
    for (oy, orow) in out.chunks_exact_mut(ow).enumerate() {
        for i in 0..kh {
            let xrow = &x[(oy * kh + i) * w..][..ow * kw];
            if kw == 2 {
                // The common 2-wide window: both taps of a row at once.
                let pairs = xrow.chunks_exact(2);
                if i == 0 {
                    for (o, pr) in orow.iter_mut().zip(pairs) {
                        *o = if take_max(pr[0], pr[1]) { pr[1] } else { pr[0] };
                    }
                } else {
                    for (o, pr) in orow.iter_mut().zip(pairs) {
                        let m = if take_max(*o, pr[0]) { pr[0] } else { *o };
                        *o = if take_max(m, pr[1]) { pr[1] } else { m };
                    }
                }
                continue;
            }
            for j in 0..kw {
                let taps = xrow[j..].iter().step_by(kw);
                if i == 0 && j == 0 {
                    // The first tap is the window's start (`-inf` never wins over it).
                    for (o, &v) in orow.iter_mut().zip(taps) {
                        *o = v;
                    }
                } else {
                    for (o, &v) in orow.iter_mut().zip(taps) {
                        if take_max(*o, v) {
                            *o = v;
                        }
                    }
                }
            }
        }
    }
}

/// Average pooling of one dense `h x w` plane, as PyTorch computes it: the
/// window `[start, start + k)` is first clipped to the padded input `[-pad,
/// size + pad)` (so in ceil mode the overhang past the padding is not
/// counted), that size is the divisor with `count_include_pad`; then it is
/// clipped to the input, which gives the summed elements and the divisor
/// without it. A window with no input element gives 0.
fn avg_plane<E: Float>(x: &[E], h: usize, w: usize, out: &mut [E], ow: usize, p: &Pool2dParams) {
    let [kh, kw] = p.kernel.map(|k| k as isize);
    let [sh, sw] = p.stride;
    let [ph, pw] = p.padding.map(|v| v as isize);
    let (hi, wi) = (h as isize, w as isize);
    for (oy, orow) in out.chunks_exact_mut(ow).enumerate() {
        let y0 = (oy * sh) as isize - ph;
        let y1 = (y0 + kh).min(hi + ph);
        let (ys, ye) = (y0.max(0), y1.min(hi));
        for (ox, o) in orow.iter_mut().enumerate() {
            let x0 = (ox * sw) as isize - pw;
            let x1 = (x0 + kw).min(wi + pw);
            let (xs, xe) = (x0.max(0), x1.min(wi));
            if ys >= ye || xs >= xe {
                *o = E::zero();
                continue;
            }
            let mut sum = <E::Acc as num_traits::Zero>::zero();
            for y in ys..ye {
                let row = &x[y as usize * w..(y as usize + 1) * w];
                for &v in &row[xs as usize..xe as usize] {
                    sum = sum + v.to_acc();
                }
            }
            let count = if p.count_include_pad {
                (y1 - y0) * (x1 - x0)
            } else {
                (ye - ys) * (xe - xs)
            };
            *o = E::from_acc(sum / <E::Acc as Real>::c(count as f64));
        }
    }
}

/// Validates a pooling call (core's checks, and that the view fits its
/// storage) and returns the dense input with its sizes.
fn prepare<'a, E: Dtype>(
    op: &'static str,
    x: &'a [E],
    lx: &Layout,
    p: &Pool2dParams,
) -> Result<(Cow<'a, [E]>, [usize; 4])> {
    check_pool(op, &lx.dims, p)?;
    if lx.span() > x.len() {
        return Err(Error::invalid(
            op,
            "the input view reaches past its storage",
        ));
    }
    let dense = match lx.contiguous_range() {
        Some(r) => Cow::Borrowed(&x[r]),
        None => Cow::Owned(gather_vec(x, lx)),
    };
    let d = &lx.dims;
    Ok((dense, [d[0], d[1], d[2], d[3]]))
}

/// Runs `f(input_plane, output_plane)` over every `[n, c]` plane, in parallel
/// when there is enough work; `empty` fills planes of an empty input.
fn per_plane<E: Float>(
    x: &[E],
    dims: [usize; 4],
    out_hw: [usize; 2],
    window: usize,
    empty: E,
    f: impl Fn(&[E], &mut [E]) + Sync,
) -> Vec<E> {
    let [n, c, h, w] = dims;
    let plane_out = out_hw[0] * out_hw[1];
    let mut out = vec![empty; n * c * plane_out];
    if out.is_empty() || h * w == 0 {
        return out;
    }
    let work = plane_out * window.max(1);
    if out.len() * window.max(1) >= 2 * PAR_CHUNK {
        let planes = (PAR_CHUNK / work).max(1);
        crate::par::chunks_mut(&mut out, planes * plane_out, |c, o| {
            let xs = x[c * planes * h * w..].chunks_exact(h * w);
            for (o, xp) in o.chunks_exact_mut(plane_out).zip(xs) {
                f(xp, o);
            }
        });
    } else {
        for (o, xp) in out.chunks_exact_mut(plane_out).zip(x.chunks_exact(h * w)) {
            f(xp, o);
        }
    }
    out
}

/// The gradient of [`max_plane`]: each output's gradient goes to the first
/// maximum of its window (where the forward took its value, NaN included).
fn max_plane_backward<E: Float>(
    x: &[E],
    w: usize,
    g: &[E],
    gx: &mut [E],
    rows: &[Span],
    cols: &[Span],
    dil: [usize; 2],
) {
    let [dh, dw] = dil;
    let ow = cols.len();
    for (r, grow) in rows.iter().zip(g.chunks_exact(ow)) {
        for (c, &gv) in cols.iter().zip(grow) {
            // PyTorch's rule: start at the first tap, move on `v > m || v is NaN`.
            let mut best: Option<usize> = None;
            let mut m = E::neg_infinity();
            for i in r.lo..r.hi {
                let y = (r.start + (i * dh) as isize) as usize;
                for j in c.lo..c.hi {
                    let at = y * w + (c.start + (j * dw) as isize) as usize;
                    let v = x[at];
                    if best.is_none() {
                        best = Some(at);
                    }
                    if v > m || v.is_nan() {
                        m = v;
                        best = Some(at);
                    }
                }
            }
            if let Some(at) = best {
                gx[at] = E::from_acc(gx[at].to_acc() + gv.to_acc());
            }
        }
    }
}

/// One row of 2x2 windows for [`max_plane_tiled_backward`]: input rows
/// `r0`, `r1`, their gradient rows `d0`, `d1`. A function of its own so the
/// compiler knows the four rows apart, and indexed over bounded slices: the
/// form it vectorises (as selects; branches would mispredict on random data).
#[inline(never)]
fn max_row2x2_backward<E: Float>(r0: &[E], r1: &[E], g: &[E], d0: &mut [E], d1: &mut [E]) {
    let n = g.len();
    let (r0, r1) = (&r0[..2 * n], &r1[..2 * n]);
    let (d0, d1) = (&mut d0[..2 * n], &mut d1[..2 * n]);
    let zero = E::zero();
    for k in 0..n {
        let (a0, a1, b0, b1) = (r0[2 * k], r0[2 * k + 1], r1[2 * k], r1[2 * k + 1]);
        // Which later tap replaced the running maximum.
        let t1 = take_max(a0, a1);
        let m = pick(t1, a1, a0);
        let t2 = take_max(m, b0);
        let m = pick(t2, b0, m);
        let t3 = take_max(m, b1);
        let s = E::from_acc(zero.to_acc() + g[k].to_acc());
        d0[2 * k] = pick(!(t1 | t2 | t3), s, zero);
        d0[2 * k + 1] = pick(t1 & !(t2 | t3), s, zero);
        d1[2 * k] = pick(t2 & !t3, s, zero);
        d1[2 * k + 1] = pick(t3, s, zero);
    }
}

/// [`max_plane_backward`] for tiling windows (see [`tiles`]): each window's
/// first maximum is found as in the forward, and since windows do not
/// overlap, every input element gets either its window's gradient (added to
/// zero, as the general path does, so `-0.0` becomes `0.0` alike) or zero.
/// `best` is scratch space for one output row.
#[inline(always)]
fn max_plane_tiled_backward<E: Float>(
    x: &[E],
    w: usize,
    g: &[E],
    gx: &mut [E],
    ow: usize,
    kh: usize,
    kw: usize,
    best: &mut Vec<(E, u32)>,
) {
    let zero = E::zero();
    let share = |gv: E| E::from_acc(zero.to_acc() + gv.to_acc());
    for (oy, grow) in g.chunks_exact(ow).enumerate() {
        let rows = &x[oy * kh * w..(oy + 1) * kh * w];
        let gxrows = &mut gx[oy * kh * w..(oy + 1) * kh * w];
        if kh == 2 && kw == 2 {
            let (r0, r1) = rows.split_at(w);
            let (d0, d1) = gxrows.split_at_mut(w);
            max_row2x2_backward(r0, r1, grow, d0, d1);
            continue;
        }
        // Running maximum and its tap per output, taps in the forward's order.
        best.clear();
        best.extend(rows[..ow * kw].iter().step_by(kw).map(|&v| (v, 0u32)));
        for i in 0..kh {
            let xrow = &rows[i * w..i * w + ow * kw];
            for j in 0..kw {
                if i == 0 && j == 0 {
                    continue;
                }
                let tap = (i * kw + j) as u32;
                for (b, &v) in best.iter_mut().zip(xrow[j..].iter().step_by(kw)) {
                    if take_max(b.0, v) {
                        *b = (v, tap);
                    }
                }
            }
        }
        for (ox, (&gv, &(_, tap))) in grow.iter().zip(best.iter()).enumerate() {
            let (i, j) = (tap as usize / kw, tap as usize % kw);
            gxrows[i * w + ox * kw + j] = share(gv);
        }
    }
}

/// The gradient of [`avg_plane`]: each output's gradient, divided by the
/// same count, spread over the input elements of its window.
fn avg_plane_backward<E: Float>(
    h: usize,
    w: usize,
    g: &[E],
    gx: &mut [E],
    ow: usize,
    p: &Pool2dParams,
) {
    let [kh, kw] = p.kernel.map(|k| k as isize);
    let [sh, sw] = p.stride;
    let [ph, pw] = p.padding.map(|v| v as isize);
    let (hi, wi) = (h as isize, w as isize);
    let mut acc = vec![<E::Acc as num_traits::Zero>::zero(); gx.len()];
    for (oy, grow) in g.chunks_exact(ow).enumerate() {
        let y0 = (oy * sh) as isize - ph;
        let y1 = (y0 + kh).min(hi + ph);
        let (ys, ye) = (y0.max(0), y1.min(hi));
        for (ox, &gv) in grow.iter().enumerate() {
            let x0 = (ox * sw) as isize - pw;
            let x1 = (x0 + kw).min(wi + pw);
            let (xs, xe) = (x0.max(0), x1.min(wi));
            if ys >= ye || xs >= xe {
                continue;
            }
            let count = if p.count_include_pad {
                (y1 - y0) * (x1 - x0)
            } else {
                (ye - ys) * (xe - xs)
            };
            let share = gv.to_acc() / <E::Acc as Real>::c(count as f64);
            for y in ys..ye {
                for a in &mut acc[y as usize * w + xs as usize..y as usize * w + xe as usize] {
                    *a = *a + share;
                }
            }
        }
    }
    for (o, a) in gx.iter_mut().zip(acc) {
        *o = E::from_acc(a);
    }
}

/// Runs `f(input_plane, gradient_plane, input_gradient_plane)` over every
/// `[n, c]` plane in parallel; returns the input's gradient.
fn per_plane_backward<E: Float>(
    x: &[E],
    dims: [usize; 4],
    g: &[E],
    out_hw: [usize; 2],
    f: impl Fn(&[E], &[E], &mut [E]) + Sync,
) -> Vec<E> {
    let [n, c, h, w] = dims;
    let mut gx = vec![E::zero(); n * c * h * w];
    let plane_out = out_hw[0] * out_hw[1];
    if gx.is_empty() || plane_out == 0 {
        return gx;
    }
    crate::par::chunks_mut(&mut gx, h * w, |i, gp| {
        let xp = if x.is_empty() {
            x
        } else {
            &x[i * h * w..(i + 1) * h * w]
        };
        f(xp, &g[i * plane_out..(i + 1) * plane_out], gp)
    });
    gx
}

impl<E: Float> PoolKernel<E> for Cpu {
    fn max_pool2d(
        &self,
        x: &Vec<E>,
        lx: &Layout,
        p: &Pool2dParams,
        out: [usize; 2],
    ) -> Result<Vec<E>> {
        let (xs, dims) = prepare("max_pool2d", x, lx, p)?;
        let [_, _, h, w] = dims;
        let window = p.kernel[0] * p.kernel[1];
        if tiles(p, out, h, w) {
            let [kh, kw] = p.kernel;
            let ow = out[1];
            return Ok(per_plane(&xs, dims, out, window, E::zero(), |xp, o| {
                if [kh, kw] == [2, 2] {
                    max_plane_tiled(xp, w, o, ow, 2, 2)
                } else {
                    max_plane_tiled(xp, w, o, ow, kh, kw)
                }
            }));
        }
        let (rows, cols) = window_spans(p, out, h, w);
        Ok(per_plane(
            &xs,
            dims,
            out,
            window,
            E::neg_infinity(),
            |xp, o| max_plane(xp, w, o, &rows, &cols, p.dilation, p.kernel[1]),
        ))
    }

    fn avg_pool2d(
        &self,
        x: &Vec<E>,
        lx: &Layout,
        p: &Pool2dParams,
        out: [usize; 2],
    ) -> Result<Vec<E>> {
        let (xs, dims) = prepare("avg_pool2d", x, lx, p)?;
        let [_, _, h, w] = dims;
        let window = p.kernel[0] * p.kernel[1];
        Ok(per_plane(&xs, dims, out, window, E::zero(), |xp, o| {
            avg_plane(xp, h, w, o, out[1], p)
        }))
    }

    fn max_pool2d_backward(
        &self,
        x: &Vec<E>,
        lx: &Layout,
        g: &Vec<E>,
        lg: &Layout,
        p: &Pool2dParams,
    ) -> Result<Vec<E>> {
        let (xs, dims) = prepare("max_pool2d_backward", x, lx, p)?;
        let [_, _, h, w] = dims;
        let out = [lg.dims[2], lg.dims[3]];
        let gs = match lg.contiguous_range() {
            Some(r) => Cow::Borrowed(&g[r]),
            None => Cow::Owned(gather_vec(g, lg)),
        };
        if tiles(p, out, h, w) {
            let [kh, kw] = p.kernel;
            let ow = out[1];
            return Ok(per_plane_backward(&xs, dims, &gs, out, |xp, gp, gxp| {
                let mut best = Vec::new();
                if [kh, kw] == [2, 2] {
                    max_plane_tiled_backward(xp, w, gp, gxp, ow, 2, 2, &mut best)
                } else {
                    max_plane_tiled_backward(xp, w, gp, gxp, ow, kh, kw, &mut best)
                }
            }));
        }
        let (rows, cols) = window_spans(p, out, h, w);
        Ok(per_plane_backward(&xs, dims, &gs, out, |xp, gp, gxp| {
            max_plane_backward(xp, w, gp, gxp, &rows, &cols, p.dilation)
        }))
    }

    fn avg_pool2d_backward(
        &self,
        lx: &Layout,
        g: &Vec<E>,
        lg: &Layout,
        p: &Pool2dParams,
    ) -> Result<Vec<E>> {
        let d = &lx.dims;
        let dims = [d[0], d[1], d[2], d[3]];
        let out = [lg.dims[2], lg.dims[3]];
        let gs = gather_vec(g, lg);
        Ok(per_plane_backward(&[], dims, &gs, out, |_, gp, gxp| {
            avg_plane_backward(dims[2], dims[3], gp, gxp, out[1], p)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forma_core::shape::window::pool_window_out;
    use forma_core::Rng;
    use half::{bf16, f16};

    fn rand_vec(n: usize, rng: &mut Rng) -> Vec<f64> {
        (0..n).map(|_| rng.uniform() * 2.0 - 1.0).collect()
    }

    fn out_size(d: [usize; 4], p: &Pool2dParams) -> [usize; 2] {
        let o = |i: usize| {
            pool_window_out(
                d[2 + i],
                p.kernel[i],
                p.stride[i],
                p.padding[i],
                p.dilation[i],
                p.ceil_mode,
            )
            .unwrap()
        };
        [o(0), o(1)]
    }

    /// Pooling by definition, tap by tap over the whole window.
    fn naive(x: &[f64], d: [usize; 4], p: &Pool2dParams, max: bool) -> Vec<f64> {
        let [n, c, h, w] = d;
        let [oh, ow] = out_size(d, p);
        let dil = if max { p.dilation } else { [1, 1] };
        let mut out = Vec::new();
        for plane in 0..n * c {
            for oy in 0..oh {
                for ox in 0..ow {
                    let (mut best, mut sum, mut inside, mut padded) =
                        (f64::NEG_INFINITY, 0.0, 0, 0);
                    for i in 0..p.kernel[0] {
                        for j in 0..p.kernel[1] {
                            let y =
                                (oy * p.stride[0] + i * dil[0]) as isize - p.padding[0] as isize;
                            let xx =
                                (ox * p.stride[1] + j * dil[1]) as isize - p.padding[1] as isize;
                            let in_padded = |v: isize, size: usize, pad: usize| {
                                v >= -(pad as isize) && v < (size + pad) as isize
                            };
                            if in_padded(y, h, p.padding[0]) && in_padded(xx, w, p.padding[1]) {
                                padded += 1;
                            }
                            if y < 0 || xx < 0 || y >= h as isize || xx >= w as isize {
                                continue;
                            }
                            let v = x[(plane * h + y as usize) * w + xx as usize];
                            inside += 1;
                            sum += v;
                            if v > best || v.is_nan() {
                                best = v;
                            }
                        }
                    }
                    out.push(if max {
                        best
                    } else if inside == 0 {
                        0.0
                    } else if p.count_include_pad {
                        sum / padded as f64
                    } else {
                        sum / inside as f64
                    });
                }
            }
        }
        out
    }

    fn run<E: Float>(x: &[E], lx: &Layout, p: &Pool2dParams, max: bool) -> Vec<E> {
        let d = [lx.dims[0], lx.dims[1], lx.dims[2], lx.dims[3]];
        let out = out_size(d, p);
        let x = x.to_vec();
        if max {
            Cpu.max_pool2d(&x, lx, p, out).unwrap()
        } else {
            Cpu.avg_pool2d(&x, lx, p, out).unwrap()
        }
    }

    fn check<E: Float>(d: [usize; 4], p: &Pool2dParams, max: bool, rtol: f64, seed: u64) {
        let mut rng = Rng::seed_from(seed);
        let x: Vec<E> = rand_vec(d.iter().product(), &mut rng)
            .into_iter()
            .map(<E as Dtype>::from_f64)
            .collect();
        let xr: Vec<f64> = x.iter().map(|&v| Dtype::to_f64(v)).collect();
        let want = naive(&xr, d, p, max);
        let got = run(&x, &Layout::contiguous(&d), p, max);
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let g = Dtype::to_f64(*g);
            assert!(
                g == *w || (g - w).abs() <= rtol * (w.abs() + 1.0),
                "{d:?} {p:?} max={max} element {i}: got {g}, want {w}"
            );
        }
    }

    fn check_all(d: [usize; 4], p: &Pool2dParams, seed: u64) {
        for max in [true, false] {
            check::<f32>(d, p, max, 1e-6, seed);
            check::<f64>(d, p, max, 1e-14, seed);
            check::<f16>(d, p, max, 1e-3, seed);
            check::<bf16>(d, p, max, 8e-3, seed);
        }
    }

    fn params(
        k: [usize; 2],
        s: [usize; 2],
        pad: [usize; 2],
        ceil: bool,
        incl: bool,
    ) -> Pool2dParams {
        Pool2dParams {
            stride: s,
            padding: pad,
            ceil_mode: ceil,
            count_include_pad: incl,
            ..Pool2dParams::new(k)
        }
    }

    #[test]
    fn random_inputs_against_the_definition() {
        for incl in [true, false] {
            for ceil in [false, true] {
                check_all([2, 3, 7, 8], &params([3, 2], [2, 3], [1, 1], ceil, incl), 1);
                check_all([1, 2, 9, 6], &params([3, 3], [2, 2], [1, 0], ceil, incl), 2);
                check_all([2, 2, 5, 5], &params([2, 2], [2, 2], [1, 1], ceil, incl), 3);
                check_all([1, 1, 6, 7], &params([4, 2], [3, 1], [2, 1], ceil, incl), 4);
            }
        }
        check_all([2, 3, 8, 8], &Pool2dParams::new([2, 2]), 5);
        // Dilated max pooling (average pooling ignores dilation).
        let p = Pool2dParams {
            dilation: [2, 3],
            ..params([3, 2], [1, 2], [1, 1], true, true)
        };
        check_all([2, 2, 9, 10], &p, 6);
        // Enough planes for the parallel path.
        check_all(
            [8, 16, 24, 24],
            &params([3, 3], [2, 2], [1, 1], true, false),
            7,
        );
    }

    #[test]
    fn hand_computed_averages() {
        let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        let l = Layout::contiguous(&[1, 1, 3, 3]);
        let p = params([2, 2], [2, 2], [1, 1], false, true);
        assert_eq!(run(&x, &l, &p, false), vec![0.25, 1.25, 2.75, 7.0]);
        let p = params([2, 2], [2, 2], [1, 1], false, false);
        assert_eq!(run(&x, &l, &p, false), vec![1.0, 2.5, 5.5, 7.0]);
        // Ceil mode: the last window hangs past the input; the overhang is
        // not counted even with count_include_pad (PyTorch: [[6, 7.5], [12, 13.5]]).
        let x: Vec<f32> = (1..=16).map(|v| v as f32).collect();
        let l = Layout::contiguous(&[1, 1, 4, 4]);
        let p = params([3, 3], [2, 2], [0, 0], true, true);
        assert_eq!(run(&x, &l, &p, false), vec![6.0, 7.5, 12.0, 13.5]);
        // With padding 1 the last window covers one padded row and column and
        // hangs one further past them.
        let p = params([3, 3], [2, 2], [1, 1], true, true);
        let got = run(&x, &l, &p, false);
        assert_eq!(got.len(), 9);
        assert_eq!(got[0], 14.0 / 9.0);
        assert_eq!(got[8], 16.0 / 4.0);
        let p = params([3, 3], [2, 2], [1, 1], true, false);
        let got = run(&x, &l, &p, false);
        assert_eq!((got[0], got[8]), (14.0 / 4.0, 16.0));
    }

    #[test]
    fn max_ignores_padding_and_propagates_nan() {
        // All negative: padding must not act as a 0.
        let x: Vec<f32> = (1..=9).map(|v| -(v as f32)).collect();
        let l = Layout::contiguous(&[1, 1, 3, 3]);
        let p = params([2, 2], [2, 2], [1, 1], false, true);
        assert_eq!(run(&x, &l, &p, true), vec![-1.0, -2.0, -4.0, -5.0]);
        // A NaN wins its windows, wherever it sits in them.
        let mut x: Vec<f64> = (0..16).map(|v| v as f64).collect();
        x[5] = f64::NAN;
        let l = Layout::contiguous(&[1, 1, 4, 4]);
        let p = params([2, 2], [1, 1], [0, 0], false, true);
        let got = run(&x, &l, &p, true);
        // Windows (row, col) at (0|1, 0|1) contain element (1, 1).
        for (i, v) in got.iter().enumerate() {
            let (r, c) = (i / 3, i % 3);
            assert_eq!(v.is_nan(), r <= 1 && c <= 1, "window {i}: {v}");
        }
        assert_eq!(got[8], 15.0);
        let xh: Vec<bf16> = x.iter().map(|&v| bf16::from_f64(v)).collect();
        assert!(run(&xh, &l, &p, true)[0].is_nan());
        // Average pooling propagates it through the sum.
        assert!(run(&x, &l, &p, false)[0].is_nan());
    }

    #[test]
    fn strided_view_input() {
        let mut rng = Rng::seed_from(8);
        let store: Vec<f32> = rand_vec(2 * 6 * 7 * 3, &mut rng)
            .iter()
            .map(|&v| v as f32)
            .collect();
        // Stored [n, h, w, c], viewed [n, c, h, w].
        let lx = Layout::contiguous(&[2, 6, 7, 3]).permute(&[0, 3, 1, 2]);
        let dense = gather_vec(&store, &lx);
        let ld = Layout::contiguous(&[2, 3, 6, 7]);
        let p = params([3, 2], [2, 2], [1, 1], true, false);
        for max in [true, false] {
            assert_eq!(run(&store, &lx, &p, max), run(&dense, &ld, &p, max));
        }
    }

    /// Max pooling and its gradient through the general (span) path, which
    /// the tiled fast path must match bit for bit.
    fn general_max<E: Float>(x: &[E], lx: &Layout, g: &[E], p: &Pool2dParams) -> (Vec<E>, Vec<E>) {
        let (xs, dims) = prepare("test", x, lx, p).unwrap();
        let [_, _, h, w] = dims;
        let out = out_size(dims, p);
        let (rows, cols) = window_spans(p, out, h, w);
        let y = per_plane(&xs, dims, out, 1, E::neg_infinity(), |xp, o| {
            max_plane(xp, w, o, &rows, &cols, p.dilation, p.kernel[1])
        });
        let gx = per_plane_backward(&xs, dims, g, out, |xp, gp, gxp| {
            max_plane_backward(xp, w, gp, gxp, &rows, &cols, p.dilation)
        });
        (y, gx)
    }

    /// The kernel's max pooling and gradient for a view `lx` of `x`.
    fn kernel_max<E: Float>(x: &[E], lx: &Layout, g: &[E], p: &Pool2dParams) -> (Vec<E>, Vec<E>) {
        let d = [lx.dims[0], lx.dims[1], lx.dims[2], lx.dims[3]];
        let out = out_size(d, p);
        let x = x.to_vec();
        let y = Cpu.max_pool2d(&x, lx, p, out).unwrap();
        let lg = Layout::contiguous(&[d[0], d[1], out[0], out[1]]);
        let gx = Cpu
            .max_pool2d_backward(&x, lx, &g.to_vec(), &lg, p)
            .unwrap();
        (y, gx)
    }

    /// Bitwise equality (NaN payloads and the sign of zero included).
    fn same_bits<E: Float>(a: &[E], b: &[E]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| Dtype::to_f64(*x).to_bits() == Dtype::to_f64(*y).to_bits())
    }

    /// Values drawn from a few levels (so windows have ties), with NaNs,
    /// infinities and signed zeros mixed in.
    fn tricky<E: Float>(n: usize, rng: &mut Rng) -> Vec<E> {
        (0..n)
            .map(|_| {
                let u = rng.uniform();
                let v = if u < 0.04 {
                    f64::NAN
                } else if u < 0.06 {
                    f64::NEG_INFINITY
                } else if u < 0.08 {
                    f64::INFINITY
                } else if u < 0.12 {
                    -0.0
                } else if u < 0.16 {
                    0.0
                } else {
                    (rng.uniform() * 6.0).floor() - 3.0
                };
                <E as Dtype>::from_f64(v)
            })
            .collect()
    }

    fn check_tiled<E: Float>(d: [usize; 4], p: &Pool2dParams, seed: u64) {
        let mut rng = Rng::seed_from(seed);
        let out = out_size(d, p);
        assert!(
            tiles(p, out, d[2], d[3]),
            "{d:?} {p:?} should take the fast path"
        );
        let lx = Layout::contiguous(&d);
        let g: Vec<E> = rand_vec(d[0] * d[1] * out[0] * out[1], &mut rng)
            .into_iter()
            .map(|v| <E as Dtype>::from_f64(if v < -0.9 { -0.0 } else { v }))
            .collect();
        for x in [
            rand_vec(d.iter().product(), &mut rng)
                .into_iter()
                .map(<E as Dtype>::from_f64)
                .collect(),
            tricky::<E>(d.iter().product(), &mut rng),
        ] {
            let (y, gx) = kernel_max(&x, &lx, &g, p);
            let (want_y, want_gx) = general_max(&x, &lx, &g, p);
            assert!(same_bits(&y, &want_y), "{d:?} {p:?} forward");
            assert!(same_bits(&gx, &want_gx), "{d:?} {p:?} backward");
            // And against the definition.
            let xr: Vec<f64> = x.iter().map(|&v| Dtype::to_f64(v)).collect();
            let naive_y = naive(&xr, d, p, true);
            for (a, b) in y.iter().zip(&naive_y) {
                let a = Dtype::to_f64(*a);
                assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
            }
        }
    }

    #[test]
    fn tiled_max_matches_the_general_path() {
        for (d, k, seed) in [
            ([2, 3, 8, 8], [2, 2], 20),
            // Odd sizes: the last row and column belong to no window.
            ([3, 2, 7, 9], [2, 2], 21),
            ([1, 5, 28, 28], [2, 2], 22),
            ([2, 2, 9, 10], [3, 3], 23),
            ([2, 3, 7, 11], [2, 3], 24),
            ([1, 2, 10, 7], [3, 1], 25),
            ([2, 2, 5, 6], [1, 1], 26),
            // Enough planes for the parallel path.
            ([16, 16, 12, 12], [2, 2], 27),
        ] {
            let p = Pool2dParams::new(k);
            check_tiled::<f32>(d, &p, seed);
            check_tiled::<f64>(d, &p, seed);
            check_tiled::<f16>(d, &p, seed);
            check_tiled::<bf16>(d, &p, seed);
        }
        // Ceil mode where every window still fits takes the fast path too.
        let p = Pool2dParams {
            ceil_mode: true,
            ..Pool2dParams::new([2, 2])
        };
        check_tiled::<f32>([2, 2, 8, 6], &p, 28);
        // Where the last window would hang over, it does not.
        assert!(!tiles(&p, out_size([1, 1, 7, 7], &p), 7, 7));
    }

    /// Max pooling window by window through [`max_window`]: what the
    /// vectorised interior of [`max_plane`] must give, bit for bit.
    fn each_window<E: Float>(x: &[E], d: [usize; 4], p: &Pool2dParams) -> Vec<E> {
        let [n, c, h, w] = d;
        let out = out_size(d, p);
        let (rows, cols) = window_spans(p, out, h, w);
        let mut y = Vec::new();
        for xp in x.chunks_exact(h * w).take(n * c) {
            for r in &rows {
                for col in &cols {
                    y.push(max_window(xp, w, r, col, p.dilation));
                }
            }
        }
        y
    }

    #[test]
    fn vectorised_interior_matches_each_window_bit_for_bit() {
        let dilated = Pool2dParams {
            dilation: [2, 2],
            ..params([3, 3], [1, 2], [1, 1], false, false)
        };
        for (d, p, seed) in [
            // ResNet's stem pooling: 3x3, stride 2, padding 1.
            (
                [2, 3, 12, 13],
                params([3, 3], [2, 2], [1, 1], false, false),
                40,
            ),
            (
                [1, 2, 9, 17],
                params([3, 2], [1, 1], [1, 0], true, false),
                41,
            ),
            (
                [2, 2, 11, 16],
                params([2, 3], [3, 3], [0, 1], true, false),
                42,
            ),
            (
                [1, 1, 3, 2],
                params([3, 3], [2, 2], [1, 1], false, false),
                43,
            ),
            ([2, 2, 13, 15], dilated, 44),
            // Enough planes for the parallel path.
            (
                [16, 8, 14, 14],
                params([3, 3], [2, 2], [1, 1], false, false),
                45,
            ),
        ] {
            let mut rng = Rng::seed_from(seed);
            let l = Layout::contiguous(&d);
            let x = tricky::<f32>(d.iter().product(), &mut rng);
            assert!(
                same_bits(&run(&x, &l, &p, true), &each_window(&x, d, &p)),
                "{d:?} {p:?}"
            );
            let x = tricky::<bf16>(d.iter().product(), &mut rng);
            assert!(
                same_bits(&run(&x, &l, &p, true), &each_window(&x, d, &p)),
                "{d:?} {p:?}"
            );
        }
    }

    #[test]
    fn tiled_max_hand_computed() {
        // One 2x2 window per case, taps in order (0,0) (0,1) (1,0) (1,1).
        let nan = f32::NAN;
        let cases: [([f32; 4], f32, usize); 6] = [
            ([1.0, 3.0, 3.0, 2.0], 3.0, 1), // tie: the first maximum
            ([5.0, 5.0, 5.0, 5.0], 5.0, 0),
            ([1.0, nan, 7.0, 2.0], nan, 1), // NaN wins and stays
            ([nan, 1.0, nan, 2.0], nan, 2), // a later NaN replaces an earlier one
            ([f32::NEG_INFINITY; 4], f32::NEG_INFINITY, 0),
            ([-0.0, 0.0, -1.0, -0.0], -0.0, 0), // 0.0 is not above -0.0
        ];
        let l = Layout::contiguous(&[1, 1, 2, 2]);
        let p = Pool2dParams::new([2, 2]);
        for (x, want, at) in cases {
            let (y, gx) = kernel_max(&x, &l, &[2.5], &p);
            assert_eq!(y[0].to_bits(), want.to_bits(), "{x:?}");
            let mut want_gx = [0.0f32; 4];
            want_gx[at] = 2.5;
            assert_eq!(gx, want_gx, "{x:?}");
        }
        // A -0.0 gradient arrives as 0.0 (added to zero), as on the general path.
        let (_, gx) = kernel_max(&[1.0f32, 0.0, 0.0, 0.0], &l, &[-0.0], &p);
        assert_eq!(gx.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), [0; 4]);
    }

    #[test]
    fn tiled_max_on_strided_views() {
        let mut rng = Rng::seed_from(29);
        let store: Vec<f32> = tricky(2 * 8 * 6 * 3, &mut rng);
        // Stored [n, h, w, c], viewed [n, c, h, w].
        let lx = Layout::contiguous(&[2, 8, 6, 3]).permute(&[0, 3, 1, 2]);
        let dense = gather_vec(&store, &lx);
        let ld = Layout::contiguous(&[2, 3, 8, 6]);
        let p = Pool2dParams::new([2, 2]);
        let g: Vec<f32> = rand_vec(2 * 3 * 4 * 3, &mut rng)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let (y, gx) = kernel_max(&store, &lx, &g, &p);
        let (want_y, want_gx) = general_max(&dense, &ld, &g, &p);
        assert!(same_bits(&y, &want_y) && same_bits(&gx, &want_gx));
        // A gradient given as a strided view.
        let gstore: Vec<f32> = (0..2 * 4 * 3 * 3).map(|v| v as f32 - 30.0).collect();
        let lg = Layout::contiguous(&[2, 4, 3, 3]).permute(&[0, 3, 1, 2]);
        let gdense = gather_vec(&gstore, &lg);
        let got = Cpu
            .max_pool2d_backward(&dense, &ld, &gstore, &lg, &p)
            .unwrap();
        let want = Cpu
            .max_pool2d_backward(&dense, &ld, &gdense, &Layout::contiguous(&[2, 3, 4, 3]), &p)
            .unwrap();
        assert!(same_bits(&got, &want));
    }

    #[test]
    fn invalid_calls_are_errors() {
        let x = vec![0.0f32; 8];
        let p = Pool2dParams::new([2, 2]);
        assert!(Cpu
            .max_pool2d(&x, &Layout::contiguous(&[2, 4]), &p, [1, 1])
            .is_err());
        assert!(Cpu
            .avg_pool2d(&x, &Layout::contiguous(&[1, 1, 3, 3]), &p, [1, 1])
            .is_err());
        let p0 = Pool2dParams {
            dilation: [0, 1],
            ..p
        };
        assert!(Cpu
            .max_pool2d(&x, &Layout::contiguous(&[1, 2, 2, 2]), &p0, [1, 1])
            .is_err());
    }
}
