//! 2-d convolution as im2col + GEMM, per image and group.
//!
//! Input and weight are made dense in the accumulation type first (borrowed
//! for dense f32/f64, widened to f32 for f16/bf16). For each image and group,
//! the input patches are unrolled into a `[c_in/groups * kh * kw, oh * ow]`
//! column matrix and multiplied by the group's `[c_out/groups, c_in/groups *
//! kh * kw]` weight rows straight into the output. A 1x1 kernel with stride 1
//! and no padding skips the unrolling (the input plane is the column matrix).
//! With stride 1 the input is padded explicitly first, so the unrolling (and
//! its transpose, folding the column gradient back) moves whole runs without
//! per-run bounds (see [`im2col`], [`col2im`]).
//!
//! Parallelism: over the images (`crate::par`) when there are enough of them
//! (see [`batch_parallel`]), else image by image with the unrolling and gemm
//! each parallel inside.
//!
//! Where an image has few output positions (a ResNet's deeper layers at
//! 64x64: 64, 16 and 4 per image), a gemm per image is a skinny product
//! that re-packs the whole weight for a handful of columns (the backward's
//! `W^T @ dY`, a 4608 x 512 weight for 4 columns, re-packed 16 times per
//! batch). There the images are stacked ([`stacked_images`]): the column
//! matrices of a run of images side by side, `[c_in/groups * kh * kw,
//! images * oh * ow]`, so each group takes one wide gemm per run (threaded
//! inside), below 1024 positions backward and below 64 forward.

#[cfg(target_arch = "x86_64")]
mod packed;

use super::matmul::{
    batch_parallel, dense_acc, from_acc_vec, gemm_into, solo_parallelism, Operand, Parallelism,
};
use crate::{Cpu, PAR_CHUNK};
use forma_core::dtype::Real;
use forma_core::error::fmt_dims;
use forma_core::ops::conv::{Conv2dGeometry, Conv2dParams, ConvKernel};
use forma_core::ops::matmul::{MatmulKernel, PackedRhs};
use forma_core::{DType, Error, Float, Layout, Result};

/// The sizes of a convolution, validated by core's one set of checks.
type Geometry = Conv2dGeometry;

/// The products a convolution runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Products {
    /// The accumulation type's gemm.
    Plain,
    /// Autocast's bf16 products on f32 operands: each value rounded to
    /// bf16 as the AMX product packs it, the sums in f32 (only where
    /// `has_conv_low` said so).
    Bf16,
}

/// `dst = lhs @ rhs` (`m x k` by `k x n`) on the products `prod`.
#[allow(clippy::too_many_arguments)] // a gemm's sizes and operands, and the products
fn product_into<A: Real>(
    dst: &mut [A],
    m: usize,
    n: usize,
    k: usize,
    lhs: Operand<'_, A>,
    rhs: Operand<'_, A>,
    parallelism: Parallelism,
    prod: Products,
) {
    match prod {
        Products::Plain => gemm_into(dst, m, n, k, lhs, rhs, parallelism),
        Products::Bf16 => bf16_product(dst, m, n, k, lhs, rhs, parallelism),
    }
}

/// [`product_into`] on bf16 products (see [`Products::Bf16`]).
///
/// # Panics
/// If `A` is not f32 or the CPU has no AMX tiles.
#[cfg(target_arch = "x86_64")]
fn bf16_product<A: Real>(
    dst: &mut [A],
    m: usize,
    n: usize,
    k: usize,
    lhs: Operand<'_, A>,
    rhs: Operand<'_, A>,
    parallelism: Parallelism,
) {
    use std::any::TypeId;
    use std::mem::MaybeUninit;
    assert_eq!(
        TypeId::of::<A>(),
        TypeId::of::<f32>(),
        "bf16 products take f32 operands"
    );
    /// # Safety
    /// `A` is f32.
    unsafe fn f32s<A>(o: Operand<'_, A>) -> Operand<'_, f32> {
        Operand {
            // SAFETY: `A` is f32, so the slice is one of f32 values.
            data: unsafe { std::slice::from_raw_parts(o.data.as_ptr().cast(), o.data.len()) },
            off: o.off,
            rs: o.rs,
            cs: o.cs,
        }
    }
    // SAFETY: `A` is f32; `MaybeUninit<f32>` has its layout, and bgemm
    // stores f32 values in every element, so `dst` stays initialised.
    let out = unsafe {
        std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<MaybeUninit<f32>>(), dst.len())
    };
    let par = !matches!(parallelism, Parallelism::None);
    // SAFETY: `A` is f32 (asserted above).
    let (lhs, rhs) = unsafe { (f32s(lhs), f32s(rhs)) };
    super::bgemm::bgemm(out, m, n, k, lhs, rhs, None, false, par);
}

#[cfg(not(target_arch = "x86_64"))]
fn bf16_product<A: Real>(
    _: &mut [A],
    _: usize,
    _: usize,
    _: usize,
    _: Operand<'_, A>,
    _: Operand<'_, A>,
    _: Parallelism,
) {
    unreachable!("has_conv_low holds only on x86_64")
}

/// Whether the input plane already is the column matrix.
fn is_pointwise(g: &Geometry) -> bool {
    g.kh == 1 && g.kw == 1 && g.p.stride == [1, 1] && g.p.padding == [0, 0]
}

/// The taps `t` of `0..count` with `0 <= start + t * step < size`, as a range
/// `lo..hi` (empty when none); `step > 0`.
pub(crate) fn tap_range(start: isize, step: usize, count: usize, size: usize) -> (usize, usize) {
    let step = step as isize;
    let lo = if start >= 0 {
        0
    } else {
        ((-start + step - 1) / step) as usize
    };
    let room = size as isize - start;
    let hi = if room <= 0 {
        0
    } else {
        ((room + step - 1) / step) as usize
    };
    let hi = hi.min(count);
    (lo.min(hi), hi)
}

/// `dst.copy_from_slice(src)` for the short runs of im2col and col2im (an
/// output row, often under 32 elements): fixed-size pieces the compiler
/// copies inline, where `copy_from_slice` calls `memmove` per run.
#[inline(always)]
fn copy_short<A: Copy>(dst: &mut [A], src: &[A]) {
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d8, s8) in (&mut d).zip(&mut s) {
        let d8: &mut [A; 8] = d8.try_into().expect("8 elements");
        *d8 = s8.try_into().expect("8 elements");
    }
    // The rest in pieces of 4, 2 and 1: a plain loop would become `memmove`.
    let (mut d, mut s) = (d.into_remainder(), s.remainder());
    if d.len() >= 4 {
        let (d4, dr) = d.split_at_mut(4);
        let (s4, sr) = s.split_at(4);
        d4.copy_from_slice(s4);
        (d, s) = (dr, sr);
    }
    if d.len() >= 2 {
        let (d2, dr) = d.split_at_mut(2);
        let (s2, sr) = s.split_at(2);
        d2.copy_from_slice(s2);
        (d, s) = (dr, sr);
    }
    if let (Some(a), Some(&b)) = (d.first_mut(), s.first()) {
        *a = b;
    }
}

/// Where kernel column `j` reads along an input row: output columns
/// `lo..hi` read inside it, starting at input column `first`.
#[derive(Clone, Copy, Debug)]
struct ColSpan {
    lo: usize,
    hi: usize,
    first: usize,
}

/// The [`ColSpan`] of each kernel column.
fn col_spans(g: &Geometry) -> Vec<ColSpan> {
    let [sw, pw, dw] = [g.p.stride[1], g.p.padding[1], g.p.dilation[1]];
    (0..g.kw)
        .map(|j| {
            let x0 = (j * dw) as isize - pw as isize;
            let (lo, hi) = tap_range(x0, sw, g.ow, g.w);
            // First input column read: x0 + lo * sw >= 0 (when lo < hi).
            let first = (x0 + (lo * sw) as isize).max(0) as usize;
            ColSpan { lo, hi, first }
        })
        .collect()
}

/// The sizes of one input plane with its padding, `[h + 2 ph, w + 2 pw]`.
fn padded_size(g: &Geometry) -> [usize; 2] {
    [g.h + 2 * g.p.padding[0], g.w + 2 * g.p.padding[1]]
}

/// One group's input `[cg, h, w]` with the padding made explicit, `[cg,
/// h + 2 ph, w + 2 pw]` with zeros around: `x` itself without padding, else
/// written into `buf`.
fn padded<'a, A: Real>(x: &'a [A], g: &Geometry, buf: &'a mut Vec<A>) -> &'a [A] {
    let [ph, pw] = g.p.padding;
    if ph == 0 && pw == 0 {
        return x;
    }
    let (h, w) = (g.h, g.w);
    let [hp, wp] = padded_size(g);
    buf.clear();
    buf.resize(g.cg * hp * wp, A::zero());
    for (src, dst) in x.chunks_exact(h * w).zip(buf.chunks_exact_mut(hp * wp)) {
        for (srow, drow) in src.chunks_exact(w).zip(dst[ph * wp..].chunks_exact_mut(wp)) {
            drow[pw..pw + w].copy_from_slice(srow);
        }
    }
    buf
}

/// Runs `fill_row(r, row)` over the `l`-long rows of `col`, in parallel when
/// `par` and there is enough work.
fn per_row<A: Real>(
    col: &mut [A],
    (l, ld): (usize, usize),
    par: bool,
    fill_row: impl Fn(usize, &mut [A]) + Sync,
) {
    if par && col.len() >= 2 * PAR_CHUNK {
        let per = (PAR_CHUNK / l).max(1);
        crate::par::chunks_mut(col, per * ld, |c, rows| {
            for (r, row) in rows.chunks_mut(ld).enumerate() {
                fill_row(c * per + r, &mut row[..l]);
            }
        });
    } else {
        for (r, row) in col.chunks_mut(ld).enumerate() {
            fill_row(r, &mut row[..l]);
        }
    }
}

/// Unrolls one group's input `[cg, h, w]` into `col`, `[cg * kh * kw, oh * ow]`
/// row-major; taps in the padding are zeros. Rows in parallel when `par`;
/// `buf` is scratch space.
///
/// With stride 1 (the common case) the input is padded explicitly first, so
/// every output row of a tap is one whole run of the padded row: a short
/// copy without bounds to work out.
fn im2col<A: Real>(x: &[A], col: &mut [A], g: &Geometry, par: bool, buf: &mut Vec<A>) {
    im2col_ld(x, col, g.positions(), g, par, buf);
}

/// [`im2col`] with row `r` of the column matrix at `col[r * ld..]` (`ld`
/// at least `oh * ow`): one image's columns among a stacked run's, written
/// in place. `col` ends with the last row.
fn im2col_ld<A: Real>(
    x: &[A],
    col: &mut [A],
    ld: usize,
    g: &Geometry,
    par: bool,
    buf: &mut Vec<A>,
) {
    if g.p.stride == [1, 1] {
        im2col_unit(x, col, ld, g, par, buf);
    } else {
        im2col_general(x, col, ld, g, par);
    }
}

/// [`im2col`] with stride 1.
fn im2col_unit<A: Real>(
    x: &[A],
    col: &mut [A],
    ld: usize,
    g: &Geometry,
    par: bool,
    buf: &mut Vec<A>,
) {
    let (kh, kw, oh, ow) = (g.kh, g.kw, g.oh, g.ow);
    let xp = padded(x, g, buf);
    let [hp, wp] = padded_size(g);
    let [dh, dw] = g.p.dilation;
    per_row(col, (oh * ow, ld), par, |r, row| {
        let (c, i, j) = (r / (kh * kw), (r / kw) % kh, r % kw);
        let plane = &xp[c * hp * wp..(c + 1) * hp * wp];
        let base = i * dh * wp + j * dw;
        for (oy, dst) in row.chunks_exact_mut(ow).enumerate() {
            copy_short(dst, &plane[base + oy * wp..][..ow]);
        }
    });
}

/// [`im2col`] for any stride, bounds worked out per output row.
fn im2col_general<A: Real>(x: &[A], col: &mut [A], ld: usize, g: &Geometry, par: bool) {
    let (kh, kw, h, w, oh, ow) = (g.kh, g.kw, g.h, g.w, g.oh, g.ow);
    let [sh, sw] = g.p.stride;
    let ph = g.p.padding[0];
    let dh = g.p.dilation[0];
    let spans = col_spans(g);
    let fill_row = |r: usize, row: &mut [A]| {
        let (c, i, j) = (r / (kh * kw), (r / kw) % kh, r % kw);
        let plane = &x[c * h * w..(c + 1) * h * w];
        let ColSpan { lo, hi, first } = spans[j];
        for (oy, dst) in row.chunks_exact_mut(ow).enumerate() {
            let y = (oy * sh + i * dh) as isize - ph as isize;
            if y < 0 || y >= h as isize || lo == hi {
                dst.fill(A::zero());
                continue;
            }
            let src = &plane[y as usize * w..(y as usize + 1) * w];
            dst[..lo].fill(A::zero());
            dst[hi..].fill(A::zero());
            if sw == 1 {
                copy_short(&mut dst[lo..hi], &src[first..first + (hi - lo)]);
            } else {
                for (d, s) in dst[lo..hi].iter_mut().zip(src[first..].iter().step_by(sw)) {
                    *d = *s;
                }
            }
        }
    };
    per_row(col, (oh * ow, ld), par, fill_row);
}

/// The buffers of a convolution: see [`Scratch`].
#[derive(Debug)]
struct Buffers<A> {
    /// The column matrix.
    col: Vec<A>,
    /// The padded input (see [`padded`]).
    pad: Vec<A>,
    /// One image's column gradient (the backward image by image).
    one: Vec<A>,
    /// A stacked run's output (or, in the backward, its output gradient).
    run: Vec<A>,
    /// The backward's product before it is added or folded back.
    tmp: Vec<A>,
}

impl<A> Default for Buffers<A> {
    fn default() -> Self {
        Buffers {
            col: Vec::new(),
            pad: Vec::new(),
            one: Vec::new(),
            run: Vec::new(),
            tmp: Vec::new(),
        }
    }
}

/// Scratch space of a convolution, kept across images and, per thread
/// and element type, across calls ([`Scratch::take`]; dropping it gives
/// its buffers back): a column matrix is as large as a layer's
/// activations times its kernel's taps, and zero-filling a fresh one at
/// every call was a tenth of ResNet-18's inference, though [`im2col`]
/// writes every element of it anyway.
#[derive(Debug)]
struct Scratch<A: 'static>(Buffers<A>);

thread_local! {
    /// The buffers of this thread's last convolution, one set per element
    /// type.
    static KEPT: std::cell::RefCell<Vec<Box<dyn std::any::Any>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl<A: 'static> Scratch<A> {
    /// This thread's kept buffers for `A`, or new ones.
    fn take() -> Self {
        let kept = KEPT
            .try_with(|k| {
                let mut k = k.try_borrow_mut().ok()?;
                let i = k.iter().position(|b| b.is::<Buffers<A>>())?;
                k.swap_remove(i).downcast::<Buffers<A>>().ok()
            })
            .ok()
            .flatten();
        Scratch(kept.map(|b| *b).unwrap_or_default())
    }

    /// `buf` at least `len` long (zero-filled only where it grows), as a
    /// slice of `len`.
    fn at_least(buf: &mut Vec<A>, len: usize) -> &mut [A]
    where
        A: Real,
    {
        if buf.len() < len {
            buf.resize(len, A::zero());
        }
        &mut buf[..len]
    }
}

impl<A> std::ops::Deref for Scratch<A> {
    type Target = Buffers<A>;
    fn deref(&self) -> &Buffers<A> {
        &self.0
    }
}

impl<A> std::ops::DerefMut for Scratch<A> {
    fn deref_mut(&mut self) -> &mut Buffers<A> {
        &mut self.0
    }
}

impl<A: 'static> Drop for Scratch<A> {
    /// Keeps the buffers for this thread's next convolution (in place of
    /// any kept before).
    fn drop(&mut self) {
        /// Buffers above this many bytes in all are freed, not kept: a
        /// one-off huge convolution should not hold its memory for the
        /// thread's lifetime.
        const KEEP_AT_MOST: usize = 256 << 20;
        let b = &self.0;
        let bytes = [&b.col, &b.pad, &b.one, &b.run, &b.tmp]
            .iter()
            .map(|v| v.capacity() * std::mem::size_of::<A>())
            .sum::<usize>();
        if bytes == 0 || bytes > KEEP_AT_MOST {
            return;
        }
        let keep = std::mem::take(&mut self.0);
        let _ = KEPT.try_with(|k| {
            if let Ok(mut k) = k.try_borrow_mut() {
                k.retain(|b| !b.is::<Buffers<A>>());
                k.push(Box::new(keep));
            }
        });
    }
}

/// One image: `out` is its `[c_out, oh * ow]` output.
fn conv_image<A: Real>(
    x: &[A],
    wt: &[A],
    out: &mut [A],
    scratch: &mut Scratch<A>,
    g: &Geometry,
    parallelism: Parallelism,
    prod: Products,
) {
    let groups = g.p.groups;
    let og = g.c_out / groups;
    let (kk, l) = (g.patch(), g.positions());
    let plane = g.cg * g.h * g.w;
    let inner_par = !matches!(parallelism, Parallelism::None);
    for (gi, dst) in out.chunks_exact_mut(og * l).enumerate() {
        let xg = &x[gi * plane..(gi + 1) * plane];
        let rhs = if is_pointwise(g) {
            Operand {
                data: xg,
                off: 0,
                rs: l,
                cs: 1,
            }
        } else {
            let Buffers { col, pad, .. } = &mut **scratch;
            let col = Scratch::at_least(col, kk * l);
            im2col(xg, col, g, inner_par, pad);
            Operand {
                data: &col[..],
                off: 0,
                rs: l,
                cs: 1,
            }
        };
        let lhs = Operand {
            data: wt,
            off: gi * og * kk,
            rs: kk,
            cs: 1,
        };
        product_into(dst, og, l, kk, lhs, rhs, parallelism, prod);
    }
}

/// Below this many output positions per image, the backward stacks the
/// images (its per-image products are the skinny ones: `W^T @ dY` re-packs
/// the whole weight per image).
const STACK_BELOW: usize = 1024;
/// Below this many, the forward does too. Above it the per-image products
/// (`W @ col`) are wide enough, and images in parallel beat one threaded
/// product: stacking every layer under 1024 positions made ResNet-18 b16
/// inference at 224x224 12% slower.
const STACK_BELOW_FORWARD: usize = 64;
/// The columns a stacked run aims for (images x positions).
const STACK_COLUMNS: usize = 2048;
/// The most elements a stacked run's column matrix may hold (16 MiB of f32).
const STACK_MAX_COL: usize = 1 << 22;

/// How many images each stacked run takes (see the module's docs), or
/// `None` to run image by image: an image has enough positions for a gemm
/// of its own, or only one image fits a run.
fn stacked_images(g: &Geometry, below: usize) -> Option<usize> {
    let l = g.positions();
    if l == 0 || l >= below {
        return None;
    }
    let by_width = STACK_COLUMNS.div_ceil(l);
    let by_memory = STACK_MAX_COL / (g.patch() * l).max(1);
    let run = by_width.min(by_memory).min(g.n);
    (run > 1).then_some(run)
}

/// The column matrices of images `i0..i0 + b` (group `gi`) side by side in
/// `col`, `[kk, b * l]`, each unrolled in place; `pad` is scratch space.
fn stacked_cols<A: Real>(
    x: &[A],
    g: &Geometry,
    (i0, b): (usize, usize),
    gi: usize,
    col: &mut Vec<A>,
    pad: &mut Vec<A>,
) {
    let (kk, l) = (g.patch(), g.positions());
    let (in_img, plane, cols) = (g.c_in * g.h * g.w, g.cg * g.h * g.w, b * l);
    let col = Scratch::at_least(col, kk * cols);
    for k in 0..b {
        let xg = &x[(i0 + k) * in_img + gi * plane..][..plane];
        let end = (kk - 1) * cols + (k + 1) * l;
        im2col_ld(xg, &mut col[k * l..end], cols, g, true, pad);
    }
}

/// The convolution with the images stacked `run` at a time.
#[allow(clippy::too_many_arguments)] // the operands, the output, the run and the products
fn conv2d_stacked<A: Real>(
    x: &[A],
    wt: &[A],
    out: &mut [A],
    g: &Geometry,
    run: usize,
    prod: Products,
) {
    let (kk, l) = (g.patch(), g.positions());
    let og = g.c_out / g.p.groups;
    let out_img = g.c_out * l;
    let par = solo_parallelism();
    let mut scratch = Scratch::take();
    let Buffers {
        col,
        pad,
        run: out_run,
        ..
    } = &mut *scratch;
    for i0 in (0..g.n).step_by(run) {
        let b = run.min(g.n - i0);
        let cols = b * l;
        for gi in 0..g.p.groups {
            stacked_cols(x, g, (i0, b), gi, col, pad);
            let dst = Scratch::at_least(out_run, og * cols);
            let lhs = Operand {
                data: wt,
                off: gi * og * kk,
                rs: kk,
                cs: 1,
            };
            let rhs = Operand {
                data: &col[..],
                off: 0,
                rs: cols,
                cs: 1,
            };
            product_into(dst, og, cols, kk, lhs, rhs, par, prod);
            for (o, row) in dst.chunks_exact(cols).enumerate() {
                for (k, src) in row.chunks_exact(l).enumerate() {
                    out[(i0 + k) * out_img + (gi * og + o) * l..][..l].copy_from_slice(src);
                }
            }
        }
    }
}

/// The convolution on dense operands in a gemm type.
fn conv2d_acc<A: Real>(x: &[A], wt: &[A], g: &Geometry, prod: Products) -> Vec<A> {
    conv2d_with(x, wt, g, stacked_images(g, STACK_BELOW_FORWARD), prod)
}

/// [`conv2d_acc`] with the images stacked `stack` at a time, or image by
/// image (`None`).
fn conv2d_with<A: Real>(
    x: &[A],
    wt: &[A],
    g: &Geometry,
    stack: Option<usize>,
    prod: Products,
) -> Vec<A> {
    let out_img = g.c_out * g.positions();
    let mut out = vec![A::zero(); g.n * out_img];
    if out.is_empty() {
        return out;
    }
    if let Some(run) = stack {
        conv2d_stacked(x, wt, &mut out, g, run, prod);
        return out;
    }
    let in_img = g.c_in * g.h * g.w;
    let work = out_img * g.patch();
    if batch_parallel(g.n, work) {
        let per = (PAR_CHUNK / work.max(1)).max(1);
        crate::par::chunks_mut(&mut out, per * out_img, |c, o| {
            let mut scratch = Scratch::take();
            for (k, o) in o.chunks_exact_mut(out_img).enumerate() {
                let i = c * per + k;
                let xi = &x[i * in_img..(i + 1) * in_img];
                conv_image(xi, wt, o, &mut scratch, g, Parallelism::None, prod);
            }
        });
    } else {
        let mut scratch = Scratch::take();
        let par = solo_parallelism();
        for (i, o) in out.chunks_exact_mut(out_img).enumerate() {
            let xi = &x[i * in_img..(i + 1) * in_img];
            conv_image(xi, wt, o, &mut scratch, g, par, prod);
        }
    }
    out
}

/// Checks the operands with core's checks (core ran them before it
/// dispatched; a direct call gets them too) and derives the sizes.
fn geometry(lx: &Layout, lw: &Layout, p: &Conv2dParams) -> Result<Geometry> {
    Conv2dGeometry::new(&lx.dims, &lw.dims, p)
}

/// Adds the column matrix `dcol` (`[cg * kh * kw, oh * ow]`, row `r` at
/// `dcol[r * ld..]`: `ld` is `oh * ow` for a matrix of its own, more for
/// one image's columns among a stacked run's) back into one group's input
/// gradient `[cg, h, w]`: the transpose of [`im2col`]. `buf` is scratch
/// space.
///
/// With stride 1, each output row of a tap adds into one whole run of the
/// (explicitly) padded gradient, whose inside is then added to `gx`; every
/// element gets its terms in the same order as on the general path.
fn col2im<A: Real>(dcol: &[A], ld: usize, gx: &mut [A], g: &Geometry, buf: &mut Vec<A>) {
    /// The fold, compiled for the CPU's widest vectors (its rows of adds
    /// are a tap's output row, 4 to 112 long in a ResNet).
    struct Fold<'a, A> {
        dcol: &'a [A],
        ld: usize,
        gx: &'a mut [A],
        g: &'a Geometry,
        buf: &'a mut Vec<A>,
    }
    impl<A: Real> crate::simd::Vectorized for Fold<'_, A> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            if self.g.p.stride == [1, 1] {
                col2im_unit(self.dcol, self.ld, self.gx, self.g, self.buf);
            } else {
                col2im_general(self.dcol, self.ld, self.gx, self.g);
            }
        }
    }
    crate::simd::run(Fold {
        dcol,
        ld,
        gx,
        g,
        buf,
    });
}

/// The rows of a column matrix, `(r, row)`, as [`col2im`] takes it.
fn col_rows<'a, A>(
    dcol: &'a [A],
    ld: usize,
    g: &Geometry,
) -> impl Iterator<Item = (usize, &'a [A])> {
    let l = g.positions();
    (0..g.patch()).map(move |r| (r, &dcol[r * ld..][..l]))
}

/// [`col2im`] with stride 1.
#[inline(always)]
fn col2im_unit<A: Real>(dcol: &[A], ld: usize, gx: &mut [A], g: &Geometry, buf: &mut Vec<A>) {
    let (kh, kw, h, w, ow) = (g.kh, g.kw, g.h, g.w, g.ow);
    let [ph, pw] = g.p.padding;
    let [hp, wp] = padded_size(g);
    let [dh, dw] = g.p.dilation;
    let unpadded = ph == 0 && pw == 0;
    let gp: &mut [A] = if unpadded {
        gx
    } else {
        buf.clear();
        buf.resize(g.cg * hp * wp, A::zero());
        buf
    };
    for (r, row) in col_rows(dcol, ld, g) {
        let (c, i, j) = (r / (kh * kw), (r / kw) % kh, r % kw);
        let plane = &mut gp[c * hp * wp..(c + 1) * hp * wp];
        let base = i * dh * wp + j * dw;
        for (oy, src) in row.chunks_exact(ow).enumerate() {
            let dst = &mut plane[base + oy * wp..][..ow];
            for (d, &v) in dst.iter_mut().zip(src) {
                *d = *d + v;
            }
        }
    }
    if !unpadded {
        for (gplane, bplane) in gx.chunks_exact_mut(h * w).zip(buf.chunks_exact(hp * wp)) {
            for (grow, brow) in gplane
                .chunks_exact_mut(w)
                .zip(bplane[ph * wp..].chunks_exact(wp))
            {
                for (d, &v) in grow.iter_mut().zip(&brow[pw..pw + w]) {
                    *d = *d + v;
                }
            }
        }
    }
}

/// [`col2im`] for any stride, bounds worked out per output row.
#[inline(always)]
fn col2im_general<A: Real>(dcol: &[A], ld: usize, gx: &mut [A], g: &Geometry) {
    let (kh, kw, h, w, ow) = (g.kh, g.kw, g.h, g.w, g.ow);
    let [sh, sw] = g.p.stride;
    let [ph, pw] = g.p.padding;
    let [dh, dw] = g.p.dilation;
    for (r, row) in col_rows(dcol, ld, g) {
        let (c, i, j) = (r / (kh * kw), (r / kw) % kh, r % kw);
        let plane = &mut gx[c * h * w..(c + 1) * h * w];
        let x0 = (j * dw) as isize - pw as isize;
        let (lo, hi) = tap_range(x0, sw, ow, w);
        for (oy, src) in row.chunks_exact(ow).enumerate() {
            let y = (oy * sh + i * dh) as isize - ph as isize;
            if y < 0 || y >= h as isize {
                continue;
            }
            let dst = &mut plane[y as usize * w..(y as usize + 1) * w];
            if lo == hi {
                continue;
            }
            // First input column written: x0 + lo * sw >= 0.
            let first = (x0 + (lo * sw) as isize) as usize;
            if sw == 1 {
                // A run of columns: a slice loop, which vectorises.
                let run = &mut dst[first..first + (hi - lo)];
                for (d, &v) in run.iter_mut().zip(&src[lo..hi]) {
                    *d = *d + v;
                }
            } else {
                for (d, &v) in dst[first..].iter_mut().step_by(sw).zip(&src[lo..hi]) {
                    *d = *d + v;
                }
            }
        }
    }
}

/// Gradients of the convolution on dense operands: `dx` (per image, in
/// parallel) and `dw` (summed over the images). Only what `need` asks for
/// (`[dx, dw]`) is computed; the other is left zero.
fn conv2d_backward_acc<A: Real>(
    x: &[A],
    wt: &[A],
    gy: &[A],
    g: &Geometry,
    need: [bool; 2],
    prod: Products,
) -> (Vec<A>, Vec<A>) {
    conv2d_backward_with(x, wt, gy, g, need, stacked_images(g, STACK_BELOW), prod)
}

/// The backward with the images stacked `run` at a time: per run and
/// group, `dW_g += dY_g @ col^T` and `dcol = W_g^T @ dY_g`, each one gemm
/// over the run's columns, `dcol` folded back image by image. `gx` and
/// `gw` come zeroed; the runs are summed into `gw` in order.
///
/// Small products (LeNet's 6 or 16 channels) run one run per task, each
/// single-threaded, its `dW` kept apart and the runs' added in order
/// afterwards: the same sums as one run after another with each product
/// threaded (a product splits its output, never its depth), without a
/// parallel region per product.
#[allow(clippy::too_many_arguments)] // the backward's operands and outputs
fn conv2d_backward_stacked<A: Real>(
    x: &[A],
    wt: &[A],
    gy: &[A],
    g: &Geometry,
    need: [bool; 2],
    run: usize,
    (gx, gw): (&mut [A], &mut [A]),
    prod: Products,
) {
    let (kk, l) = (g.patch(), g.positions());
    let og = g.c_out / g.p.groups;
    let in_img = g.c_in * g.h * g.w;
    let runs = g.n.div_ceil(run);
    let work = og * kk * run * l * g.p.groups;
    if batch_parallel(runs, work) {
        let need_w = need[1];
        let parts = crate::par::chunks_map(gx, run * in_img, |r, gx_run| {
            let mut part = if need_w {
                vec![A::zero(); gw.len()]
            } else {
                Vec::new()
            };
            let i0 = r * run;
            let b = run.min(g.n - i0);
            let into = RunGrads {
                gx: gx_run,
                gw: &mut part,
                add: false,
            };
            backward_run(x, wt, gy, g, need, (i0, b), into, Parallelism::None, prod);
            part
        });
        for (r, part) in parts.iter().filter(|p| !p.is_empty()).enumerate() {
            if r == 0 {
                gw.copy_from_slice(part);
            } else {
                add_into(gw, part);
            }
        }
        return;
    }
    let par = solo_parallelism();
    for i0 in (0..g.n).step_by(run) {
        let b = run.min(g.n - i0);
        let into = RunGrads {
            gx: &mut gx[i0 * in_img..(i0 + b) * in_img],
            gw: &mut *gw,
            add: i0 > 0,
        };
        backward_run(x, wt, gy, g, need, (i0, b), into, par, prod);
    }
}

/// `acc += v` elementwise, compiled for the CPU's widest vectors.
fn add_into<A: Real>(acc: &mut [A], v: &[A]) {
    struct AddInto<'a, A>(&'a mut [A], &'a [A]);
    impl<A: Real> crate::simd::Vectorized for AddInto<'_, A> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            for (a, &b) in self.0.iter_mut().zip(self.1) {
                *a = *a + b;
            }
        }
    }
    crate::simd::run(AddInto(acc, v));
}

/// Where one run's gradients go: its images' `gx` (zeroed, added into)
/// and `gw`, the run's weight gradient added into it (`add`, a later run)
/// or written (the first run, or a run's own part): the runs' sum is then
/// `((t0 + t1) + t2) ...` without a zero-filled start, and the first
/// product goes straight into `gw`.
struct RunGrads<'a, A> {
    gx: &'a mut [A],
    gw: &'a mut [A],
    add: bool,
}

/// Images `i0..i0 + b` of [`conv2d_backward_stacked`], every group.
#[allow(clippy::too_many_arguments)] // the backward's operands and outputs
fn backward_run<A: Real>(
    x: &[A],
    wt: &[A],
    gy: &[A],
    g: &Geometry,
    [need_x, need_w]: [bool; 2],
    (i0, b): (usize, usize),
    into: RunGrads<'_, A>,
    par: Parallelism,
    prod: Products,
) {
    let (kk, l) = (g.patch(), g.positions());
    let og = g.c_out / g.p.groups;
    let (in_img, out_img, plane) = (g.c_in * g.h * g.w, g.c_out * l, g.cg * g.h * g.w);
    let threaded = !matches!(par, Parallelism::None);
    let mut scratch = Scratch::take();
    let Buffers {
        col,
        pad,
        run: gyb,
        tmp,
        ..
    } = &mut *scratch;
    let cols = b * l;
    for gi in 0..g.p.groups {
        // The run's output gradient of the group, `[og, b * l]`.
        let gyb = Scratch::at_least(gyb, og * cols);
        for (o, row) in gyb.chunks_exact_mut(cols).enumerate() {
            for (k, dst) in row.chunks_exact_mut(l).enumerate() {
                dst.copy_from_slice(&gy[(i0 + k) * out_img + (gi * og + o) * l..][..l]);
            }
        }
        let gyg = Operand {
            data: &gyb[..],
            off: 0,
            rs: cols,
            cs: 1,
        };
        if need_w {
            stacked_cols(x, g, (i0, b), gi, col, pad);
            let col_t = Operand {
                data: &col[..],
                off: 0,
                rs: 1,
                cs: cols,
            };
            let gwg = &mut into.gw[gi * og * kk..][..og * kk];
            if into.add {
                let tmp = Scratch::at_least(tmp, og * kk);
                product_into(tmp, og, kk, cols, gyg, col_t, par, prod);
                add_into(gwg, tmp);
            } else {
                product_into(gwg, og, kk, cols, gyg, col_t, par, prod);
            }
        }
        if need_x {
            let tmp = Scratch::at_least(tmp, kk * cols);
            let w_t = Operand {
                data: wt,
                off: gi * og * kk,
                rs: 1,
                cs: kk,
            };
            product_into(tmp, kk, cols, og, w_t, gyg, par, prod);
            // Each image's columns folded back onto its own input.
            let dcol = &*tmp;
            // Images `k0..` of the run, with one padding buffer.
            let fold = |k0: usize, gxs: &mut [A], buf: &mut Vec<A>| {
                for (k, gxi) in gxs.chunks_mut(in_img).enumerate() {
                    let gxg = &mut gxi[gi * plane..][..plane];
                    col2im(&dcol[(k0 + k) * l..], cols, gxg, g, buf);
                }
            };
            if threaded && b > 1 {
                let per = b.div_ceil(crate::par::threads());
                crate::par::chunks_mut(into.gx, per * in_img, |c, gxs| {
                    fold(c * per, gxs, &mut Vec::new());
                });
            } else {
                fold(0, into.gx, pad);
            }
        }
    }
}

/// [`conv2d_backward_acc`] with the images stacked `stack` at a time, or
/// image by image (`None`).
fn conv2d_backward_with<A: Real>(
    x: &[A],
    wt: &[A],
    gy: &[A],
    g: &Geometry,
    [need_x, need_w]: [bool; 2],
    stack: Option<usize>,
    prod: Products,
) -> (Vec<A>, Vec<A>) {
    let (in_img, out_img) = (g.c_in * g.h * g.w, g.c_out * g.positions());
    let groups = g.p.groups;
    let og = g.c_out / groups;
    let (kk, l) = (g.patch(), g.positions());
    let plane = g.cg * g.h * g.w;
    let wlen = g.c_out * kk;
    let mut gx = vec![A::zero(); g.n * in_img];
    if gx.is_empty() || l == 0 || kk == 0 || og == 0 || !(need_x || need_w) {
        return (gx, vec![A::zero(); wlen]);
    }
    if let Some(run) = stack {
        let mut gw = vec![A::zero(); wlen];
        conv2d_backward_stacked(
            x,
            wt,
            gy,
            g,
            [need_x, need_w],
            run,
            (&mut gx, &mut gw),
            prod,
        );
        return (gx, gw);
    }
    // The images' weight gradients are summed in a fixed order (runs of
    // `RUN` images, then the runs' sums in sequence) rather than in the order
    // the threads happen to finish: a seeded training
    // run then gives the same bits every time, and a resumed one continues
    // exactly.
    const RUN: usize = 4;
    let partials: Vec<Vec<A>> = crate::par::chunks_map(&mut gx, in_img * RUN, |r, gx_run| {
        let mut gw = vec![A::zero(); wlen];
        let mut scratch = Scratch::take();
        let Buffers {
            col,
            one: dcol,
            pad,
            tmp,
            ..
        } = &mut *scratch;
        for (k, gxi) in gx_run.chunks_mut(in_img).enumerate() {
            let i = r * RUN + k;
            let xi = &x[i * in_img..(i + 1) * in_img];
            let gyi = &gy[i * out_img..(i + 1) * out_img];
            for gi in 0..groups {
                let gyg = Operand {
                    data: gyi,
                    off: gi * og * l,
                    rs: l,
                    cs: 1,
                };
                if need_w {
                    let col = Scratch::at_least(col, kk * l);
                    let xg = &xi[gi * plane..(gi + 1) * plane];
                    im2col(xg, col, g, false, pad);
                    // dW_g += dY_g @ col^T
                    let tmp = Scratch::at_least(tmp, og * kk);
                    let col_t = Operand {
                        data: &col[..],
                        off: 0,
                        rs: 1,
                        cs: l,
                    };
                    product_into(tmp, og, kk, l, gyg, col_t, Parallelism::None, prod);
                    add_into(&mut gw[gi * og * kk..(gi + 1) * og * kk], tmp);
                }
                if !need_x {
                    continue;
                }
                // dcol = W_g^T @ dY_g, folded back onto the input.
                let dcol = Scratch::at_least(dcol, kk * l);
                let w_t = Operand {
                    data: wt,
                    off: gi * og * kk,
                    rs: 1,
                    cs: kk,
                };
                product_into(dcol, kk, l, og, w_t, gyg, Parallelism::None, prod);
                col2im(dcol, l, &mut gxi[gi * plane..(gi + 1) * plane], g, pad);
            }
        }
        gw
    });
    let mut gw = vec![A::zero(); wlen];
    for part in partials {
        add_into(&mut gw, &part);
    }
    (gx, gw)
}

/// The convolution of `x` by `w` on the products `prod`, the operands
/// checked against their storage; its outputs rounded to bf16 with bf16
/// products.
fn forward<E: Float>(
    (x, lx): (&Vec<E>, &Layout),
    (w, lw): (&Vec<E>, &Layout),
    p: &Conv2dParams,
    prod: Products,
) -> Result<Vec<E>> {
    let g = geometry(lx, lw, p)?;
    if lx.span() > x.len() || lw.span() > w.len() {
        return Err(Error::invalid(
            "conv2d",
            "the input or weight view reaches past its storage",
        ));
    }
    let xs = dense_acc(x, lx);
    let ws = dense_acc(w, lw);
    Ok(from_acc_vec::<E>(rounded(
        conv2d_acc(&xs, &ws, &g, prod),
        prod,
    )))
}

/// The gradients of [`forward`], checked likewise; each rounded to bf16
/// once summed, with bf16 products.
fn backward<E: Float>(
    (x, lx): (&Vec<E>, &Layout),
    (w, lw): (&Vec<E>, &Layout),
    (gy, lg): (&Vec<E>, &Layout),
    p: &Conv2dParams,
    need: [bool; 2],
    prod: Products,
) -> Result<(Option<Vec<E>>, Option<Vec<E>>)> {
    let g = geometry(lx, lw, p)?;
    if *lg.dims != [g.n, g.c_out, g.oh, g.ow]
        || lx.span() > x.len()
        || lw.span() > w.len()
        || lg.span() > gy.len()
    {
        return Err(Error::invalid(
            "conv2d_backward",
            format!(
                "gradient {} does not fit the convolution",
                fmt_dims(&lg.dims)
            ),
        ));
    }
    let (xs, ws, gs) = (dense_acc(x, lx), dense_acc(w, lw), dense_acc(gy, lg));
    let (gx, gw) = conv2d_backward_acc(&xs, &ws, &gs, &g, need, prod);
    Ok((
        need[0].then(|| from_acc_vec::<E>(rounded(gx, prod))),
        need[1].then(|| from_acc_vec::<E>(rounded(gw, prod))),
    ))
}

/// `v` with each value rounded to bf16 when the products were bf16 ones
/// (`A` is then f32), as it is otherwise.
fn rounded<A: Real>(mut v: Vec<A>, prod: Products) -> Vec<A> {
    if prod == Products::Bf16 {
        let f = (&mut v as &mut dyn std::any::Any)
            .downcast_mut::<Vec<f32>>()
            .expect("bf16 products take f32 operands");
        crate::cast::round_in_place(f);
    }
    v
}

impl<E: Float> ConvKernel<E> for Cpu {
    fn conv2d(
        &self,
        x: &Vec<E>,
        lx: &Layout,
        w: &Vec<E>,
        lw: &Layout,
        p: &Conv2dParams,
    ) -> Result<Vec<E>> {
        forward((x, lx), (w, lw), p, Products::Plain)
    }

    fn conv2d_backward(
        &self,
        x: &Vec<E>,
        lx: &Layout,
        w: &Vec<E>,
        lw: &Layout,
        gy: &Vec<E>,
        lg: &Layout,
        p: &Conv2dParams,
        need: [bool; 2],
    ) -> Result<(Option<Vec<E>>, Option<Vec<E>>)> {
        backward((x, lx), (w, lw), (gy, lg), p, need, Products::Plain)
    }

    fn pack_conv_weight(
        &self,
        w: &Vec<E>,
        lw: &Layout,
        x_dims: &[usize],
        p: &Conv2dParams,
    ) -> Result<Option<PackedRhs>> {
        #[cfg(target_arch = "x86_64")]
        return packed::pack(w, lw, x_dims, p);
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (w, lw, x_dims, p);
            Ok(None)
        }
    }

    fn conv2d_packed(
        &self,
        x: &Vec<E>,
        lx: &Layout,
        w: &PackedRhs,
        lw: &Layout,
        p: &Conv2dParams,
    ) -> Result<Option<Vec<E>>> {
        #[cfg(target_arch = "x86_64")]
        return packed::conv2d(x, lx, w, lw, p);
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (x, lx, w, lw, p);
            Ok(None)
        }
    }

    /// bf16 for f32 tensors on a CPU with AMX tiles: the products of the
    /// AMX kernel, as autocast's matmul.
    fn has_conv_low(&self, low: DType) -> bool {
        MatmulKernel::<E>::has_matmul_low(self, low)
    }

    fn conv2d_low(
        &self,
        x: &Vec<E>,
        lx: &Layout,
        w: &Vec<E>,
        lw: &Layout,
        p: &Conv2dParams,
        low: DType,
    ) -> Result<Vec<E>> {
        low_products::<E>(self, "conv2d", low)?;
        forward((x, lx), (w, lw), p, Products::Bf16)
    }

    fn conv2d_backward_low(
        &self,
        x: &Vec<E>,
        lx: &Layout,
        w: &Vec<E>,
        lw: &Layout,
        gy: &Vec<E>,
        lg: &Layout,
        p: &Conv2dParams,
        need: [bool; 2],
        low: DType,
    ) -> Result<(Option<Vec<E>>, Option<Vec<E>>)> {
        low_products::<E>(self, "conv2d_backward", low)?;
        backward((x, lx), (w, lw), (gy, lg), p, need, Products::Bf16)
    }
}

/// An error unless this CPU has the `low` products for `E`.
fn low_products<E: Float>(cpu: &Cpu, op: &'static str, low: DType) -> Result<()> {
    if ConvKernel::<E>::has_conv_low(cpu, low) {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            format!("this CPU has no {low} convolution for {}", E::DTYPE),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_is_kept_for_the_threads_next_call_unless_huge() {
        {
            let mut s = Scratch::<f32>::take();
            s.col = vec![1.0; 1000];
        }
        let s = Scratch::<f32>::take();
        assert!(s.col.capacity() >= 1000);
        // Taken: the slot is empty until it is given back.
        assert_eq!(Scratch::<f32>::take().col.capacity(), 0);
        drop(s);
        // Another element type has its own slot.
        assert_eq!(Scratch::<f64>::take().col.capacity(), 0);
        {
            let mut s = Scratch::<f32>::take();
            s.col = Vec::with_capacity((256 << 20) / 4 + 1);
        }
        assert_eq!(Scratch::<f32>::take().col.capacity(), 0);
    }
    use forma_core::shape::window::window_out;
    use forma_core::{Dtype, Rng};
    use half::{bf16, f16};

    fn rand_vec(n: usize, rng: &mut Rng) -> Vec<f64> {
        (0..n).map(|_| rng.uniform() * 2.0 - 1.0).collect()
    }

    /// `F.conv2d` by definition on dense f64 operands.
    fn naive(x: &[f64], xd: [usize; 4], w: &[f64], wd: [usize; 4], p: &Conv2dParams) -> Vec<f64> {
        let [n, ci, h, wi] = xd;
        let [co, cg, kh, kw] = wd;
        let oh = window_out(h, kh, p.stride[0], p.padding[0], p.dilation[0]).unwrap();
        let ow = window_out(wi, kw, p.stride[1], p.padding[1], p.dilation[1]).unwrap();
        let og = co / p.groups;
        let mut out = vec![0.0; n * co * oh * ow];
        for b in 0..n {
            for o in 0..co {
                let grp = o / og;
                for y in 0..oh {
                    for xx in 0..ow {
                        let mut s = 0.0;
                        for c in 0..cg {
                            let cin = grp * cg + c;
                            for i in 0..kh {
                                for j in 0..kw {
                                    let iy = (y * p.stride[0] + i * p.dilation[0]) as isize
                                        - p.padding[0] as isize;
                                    let ix = (xx * p.stride[1] + j * p.dilation[1]) as isize
                                        - p.padding[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wi as isize {
                                        continue;
                                    }
                                    let xv =
                                        x[((b * ci + cin) * h + iy as usize) * wi + ix as usize];
                                    s += xv * w[((o * cg + c) * kh + i) * kw + j];
                                }
                            }
                        }
                        out[((b * co + o) * oh + y) * ow + xx] = s;
                    }
                }
            }
        }
        out
    }

    /// Runs the kernel in dtype `E` on a view `lx` of `x` (dense `xd` values
    /// are read through it) and compares with the f64 reference.
    fn check_view<E: Float>(
        xstore: &[f64],
        lx: &Layout,
        w: &[f64],
        wd: [usize; 4],
        p: Conv2dParams,
        rtol: f64,
    ) {
        let xe: Vec<E> = xstore.iter().map(|&v| <E as Dtype>::from_f64(v)).collect();
        let we: Vec<E> = w.iter().map(|&v| <E as Dtype>::from_f64(v)).collect();
        // Reference on the rounded, gathered values.
        let xr: Vec<f64> = crate::gather_vec(&xe, lx)
            .iter()
            .map(|&v| Dtype::to_f64(v))
            .collect();
        let wr: Vec<f64> = we.iter().map(|&v| Dtype::to_f64(v)).collect();
        let xd = [lx.dims[0], lx.dims[1], lx.dims[2], lx.dims[3]];
        let want = naive(&xr, xd, &wr, wd, &p);
        let got = Cpu
            .conv2d(&xe, lx, &we, &Layout::contiguous(&wd), &p)
            .unwrap();
        assert_eq!(got.len(), want.len());
        let scale = ((wd[1] * wd[2] * wd[3]) as f64).sqrt();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let g = Dtype::to_f64(*g);
            assert!(
                (g - w).abs() <= rtol * (w.abs() + scale),
                "{xd:?} * {wd:?} {p:?} element {i}: got {g}, want {w}"
            );
        }
    }

    fn check<E: Float>(xd: [usize; 4], wd: [usize; 4], p: Conv2dParams, rtol: f64, seed: u64) {
        let mut rng = Rng::seed_from(seed);
        let x = rand_vec(xd.iter().product(), &mut rng);
        let w = rand_vec(wd.iter().product(), &mut rng);
        check_view::<E>(&x, &Layout::contiguous(&xd), &w, wd, p, rtol);
    }

    fn check_all(xd: [usize; 4], wd: [usize; 4], p: Conv2dParams, seed: u64) {
        check::<f32>(xd, wd, p, 1e-5, seed);
        check::<f64>(xd, wd, p, 1e-12, seed);
        check::<f16>(xd, wd, p, 2e-3, seed);
        check::<bf16>(xd, wd, p, 1e-2, seed);
    }

    #[test]
    fn strided_padded_dilated_grouped() {
        let p = Conv2dParams {
            stride: [2, 2],
            padding: [1, 1],
            dilation: [2, 2],
            groups: 2,
        };
        check_all([2, 4, 9, 11], [6, 2, 3, 3], p, 1);
        // One image (gemm threads inside) and three (one image per task).
        check_all([1, 4, 9, 11], [6, 2, 3, 3], p, 2);
        check_all([3, 4, 9, 11], [6, 2, 3, 3], p, 3);
    }

    #[test]
    fn asymmetric_options() {
        let p = Conv2dParams {
            stride: [1, 3],
            padding: [2, 0],
            dilation: [1, 2],
            groups: 1,
        };
        check_all([2, 3, 6, 13], [5, 3, 2, 4], p, 4);
        // Depthwise, with a kernel wider than the input plus padding allows at the edges.
        let p = Conv2dParams {
            stride: [2, 1],
            padding: [1, 2],
            dilation: [1, 1],
            groups: 3,
        };
        check_all([2, 3, 5, 4], [6, 1, 3, 5], p, 5);
    }

    #[test]
    fn pointwise() {
        // 1x1 with stride 1: no unrolling; with stride 2: unrolled.
        check_all([2, 3, 5, 5], [4, 3, 1, 1], Conv2dParams::default(), 6);
        let p = Conv2dParams {
            stride: [2, 2],
            ..Conv2dParams::default()
        };
        check_all([2, 3, 5, 5], [4, 3, 1, 1], p, 7);
        let p = Conv2dParams {
            groups: 3,
            ..Conv2dParams::default()
        };
        check_all([1, 6, 4, 3], [9, 2, 1, 1], p, 8);
    }

    #[test]
    fn larger_and_default() {
        check_all([2, 8, 20, 18], [16, 8, 3, 3], Conv2dParams::default(), 9);
        let p = Conv2dParams {
            padding: [1, 1],
            ..Conv2dParams::default()
        };
        // Big enough for the parallel unrolling of a single image.
        check::<f32>([1, 16, 40, 40], [8, 16, 3, 3], p, 1e-5, 10);
    }

    #[test]
    fn strided_input_view() {
        let mut rng = Rng::seed_from(11);
        // Stored [n, h, w, c] (channels last), viewed as [n, c, h, w].
        let store = rand_vec(2 * 7 * 6 * 4, &mut rng);
        let lx = Layout::contiguous(&[2, 7, 6, 4]).permute(&[0, 3, 1, 2]);
        let w = rand_vec(3 * 4 * 3 * 2, &mut rng);
        let p = Conv2dParams {
            stride: [2, 1],
            padding: [1, 1],
            ..Conv2dParams::default()
        };
        check_view::<f32>(&store, &lx, &w, [3, 4, 3, 2], p, 1e-5);
        check_view::<bf16>(&store, &lx, &w, [3, 4, 3, 2], p, 1e-2);
        // A transposed weight view.
        let we: Vec<f32> = w.iter().map(|&v| v as f32).collect();
        let lw = Layout::contiguous(&[4, 3, 3, 2]).swap(0, 1);
        let xe: Vec<f32> = store.iter().map(|&v| v as f32).collect();
        let got = Cpu.conv2d(&xe, &lx, &we, &lw, &p).unwrap();
        let dense_w = crate::gather_vec(&we, &lw);
        let want = Cpu
            .conv2d(&xe, &lx, &dense_w, &Layout::contiguous(&[3, 4, 3, 2]), &p)
            .unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn empty_and_invalid() {
        let lx = Layout::contiguous(&[0, 2, 4, 4]);
        let lw = Layout::contiguous(&[3, 2, 3, 3]);
        let out = Cpu
            .conv2d(
                &Vec::<f32>::new(),
                &lx,
                &vec![0.0; 54],
                &lw,
                &Conv2dParams::default(),
            )
            .unwrap();
        assert!(out.is_empty());
        let lx = Layout::contiguous(&[1, 2, 2, 2]);
        let too_big = Cpu.conv2d(
            &vec![0.0f32; 8],
            &lx,
            &vec![0.0; 54],
            &lw,
            &Conv2dParams::default(),
        );
        assert!(too_big.is_err());
        let p = Conv2dParams {
            groups: 2,
            ..Conv2dParams::default()
        };
        let lx = Layout::contiguous(&[1, 2, 4, 4]);
        assert!(Cpu
            .conv2d(&vec![0.0f32; 32], &lx, &vec![0.0; 54], &lw, &p)
            .is_err());
    }

    /// The gradients `(dx, dw)` of [`naive`] by definition, in f64.
    fn naive_backward(
        x: &[f64],
        xd: [usize; 4],
        w: &[f64],
        wd: [usize; 4],
        gy: &[f64],
        p: &Conv2dParams,
    ) -> (Vec<f64>, Vec<f64>) {
        let [n, ci, h, wi] = xd;
        let [co, cg, kh, kw] = wd;
        let oh = window_out(h, kh, p.stride[0], p.padding[0], p.dilation[0]).unwrap();
        let ow = window_out(wi, kw, p.stride[1], p.padding[1], p.dilation[1]).unwrap();
        let og = co / p.groups;
        let (mut dx, mut dw) = (vec![0.0; x.len()], vec![0.0; w.len()]);
        for b in 0..n {
            for o in 0..co {
                for y in 0..oh {
                    for xx in 0..ow {
                        let gv = gy[((b * co + o) * oh + y) * ow + xx];
                        for c in 0..cg {
                            let cin = (o / og) * cg + c;
                            for i in 0..kh {
                                for j in 0..kw {
                                    let iy = (y * p.stride[0] + i * p.dilation[0]) as isize
                                        - p.padding[0] as isize;
                                    let ix = (xx * p.stride[1] + j * p.dilation[1]) as isize
                                        - p.padding[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wi as isize {
                                        continue;
                                    }
                                    let xi = ((b * ci + cin) * h + iy as usize) * wi + ix as usize;
                                    let wk = ((o * cg + c) * kh + i) * kw + j;
                                    dx[xi] += gv * w[wk];
                                    dw[wk] += gv * x[xi];
                                }
                            }
                        }
                    }
                }
            }
        }
        (dx, dw)
    }

    fn check_backward<E: Float>(
        xd: [usize; 4],
        wd: [usize; 4],
        p: Conv2dParams,
        rtol: f64,
        seed: u64,
    ) {
        let mut rng = Rng::seed_from(seed);
        let g = geometry(&Layout::contiguous(&xd), &Layout::contiguous(&wd), &p).unwrap();
        let yd = [xd[0], wd[0], g.oh, g.ow];
        let cast = |v: Vec<f64>| -> Vec<E> { v.into_iter().map(<E as Dtype>::from_f64).collect() };
        let x = cast(rand_vec(xd.iter().product(), &mut rng));
        let w = cast(rand_vec(wd.iter().product(), &mut rng));
        let gy = cast(rand_vec(yd.iter().product(), &mut rng));
        let wide = |v: &[E]| -> Vec<f64> { v.iter().map(|&v| Dtype::to_f64(v)).collect() };
        let (want_dx, want_dw) = naive_backward(&wide(&x), xd, &wide(&w), wd, &wide(&gy), &p);
        let (lx, lw, ly) = (
            Layout::contiguous(&xd),
            Layout::contiguous(&wd),
            Layout::contiguous(&yd),
        );
        let (dx, dw) = Cpu
            .conv2d_backward(&x, &lx, &w, &lw, &gy, &ly, &p, [true, true])
            .unwrap();
        // dx sums c_out * kh * kw terms at most, dw n * oh * ow.
        for (got, want, terms) in [
            (dx.unwrap(), want_dx, wd[0] * wd[2] * wd[3]),
            (dw.unwrap(), want_dw, xd[0] * g.oh * g.ow),
        ] {
            assert_eq!(got.len(), want.len());
            let scale = (terms as f64).sqrt();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let g = Dtype::to_f64(*g);
                assert!(
                    (g - w).abs() <= rtol * (w.abs() + scale),
                    "{xd:?} * {wd:?} {p:?} gradient element {i}: got {g}, want {w}"
                );
            }
        }
        // Only dw asked for: no dx, the same dw.
        let (none, dw_only) = Cpu
            .conv2d_backward(&x, &lx, &w, &lw, &gy, &ly, &p, [false, true])
            .unwrap();
        assert!(none.is_none() && dw_only.is_some());
    }

    fn check_backward_all(xd: [usize; 4], wd: [usize; 4], p: Conv2dParams, seed: u64) {
        check_backward::<f32>(xd, wd, p, 1e-5, seed);
        check_backward::<f64>(xd, wd, p, 1e-12, seed);
        check_backward::<bf16>(xd, wd, p, 1e-2, seed);
    }

    #[test]
    fn gradients_against_the_definition() {
        // Stride 1 (unrolled through the padded input): padded, dilated, grouped.
        let p = Conv2dParams {
            padding: [2, 1],
            dilation: [1, 2],
            groups: 2,
            ..Conv2dParams::default()
        };
        check_backward_all([3, 4, 7, 9], [6, 2, 3, 3], p, 12);
        // LeNet's two layers, batch 5.
        let p = Conv2dParams {
            padding: [2, 2],
            ..Conv2dParams::default()
        };
        check_backward_all([5, 1, 12, 12], [6, 1, 5, 5], p, 13);
        check_backward_all([5, 6, 14, 14], [16, 6, 5, 5], Conv2dParams::default(), 14);
        // Strided (the general unrolling).
        let p = Conv2dParams {
            stride: [2, 3],
            padding: [1, 2],
            dilation: [2, 1],
            groups: 1,
        };
        check_backward_all([2, 3, 9, 11], [4, 3, 3, 2], p, 15);
    }

    /// Autocast's bf16 convolution and its gradients: the definition's sums
    /// (in f64) of the operands rounded to bf16, each result rounded once,
    /// image by image and stacked, grouped and strided.
    #[test]
    fn bf16_products_round_what_they_read_and_write() {
        let cpu = Cpu;
        if !ConvKernel::<f32>::has_conv_low(&cpu, DType::BF16) {
            eprintln!("no AMX tiles on this CPU: the bf16 convolution is not run here");
            return;
        }
        assert!(!ConvKernel::<f32>::has_conv_low(&cpu, DType::F16));
        assert!(!ConvKernel::<f64>::has_conv_low(&cpu, DType::BF16));
        let r = |v: &[f64]| -> Vec<f64> {
            v.iter()
                .map(|&x| f64::from(crate::cast::round_f32(x as f32)))
                .collect()
        };
        let cases = [
            // LeNet's layers (stacked below 64 positions forward, below
            // 1024 backward), and a grouped, padded one image by image.
            (
                [8, 1, 28, 28],
                [6, 1, 5, 5],
                Conv2dParams {
                    padding: [2, 2],
                    ..Default::default()
                },
            ),
            ([8, 6, 14, 14], [16, 6, 5, 5], Conv2dParams::default()),
            (
                [3, 4, 40, 36],
                [6, 2, 3, 3],
                Conv2dParams {
                    padding: [1, 1],
                    groups: 2,
                    ..Default::default()
                },
            ),
            (
                [2, 3, 9, 11],
                [4, 3, 3, 2],
                Conv2dParams {
                    stride: [2, 3],
                    padding: [1, 2],
                    dilation: [2, 1],
                    groups: 1,
                },
            ),
        ];
        for (seed, (xd, wd, p)) in cases.into_iter().enumerate() {
            let mut rng = Rng::seed_from(40 + seed as u64);
            let x = rand_vec(xd.iter().product(), &mut rng);
            let w = rand_vec(wd.iter().product(), &mut rng);
            let want = naive(&r(&x), xd, &r(&w), wd, &p);
            let f = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
            let (lx, lw) = (Layout::contiguous(&xd), Layout::contiguous(&wd));
            let (xf, wf) = (f(&x), f(&w));
            let y = cpu.conv2d_low(&xf, &lx, &wf, &lw, &p, DType::BF16).unwrap();
            let out = |i: usize| {
                window_out(
                    xd[2 + i],
                    wd[2 + i],
                    p.stride[i],
                    p.padding[i],
                    p.dilation[i],
                )
            };
            let yd = [xd[0], wd[0], out(0).unwrap(), out(1).unwrap()];
            let gy = rand_vec(want.len(), &mut rng);
            let (dx_want, dw_want) = naive_backward(&r(&x), xd, &r(&w), wd, &r(&gy), &p);
            let lg = Layout::contiguous(&yd);
            let (dx, dw) = cpu
                .conv2d_backward_low(
                    &xf,
                    &lx,
                    &wf,
                    &lw,
                    &f(&gy),
                    &lg,
                    &p,
                    [true, true],
                    DType::BF16,
                )
                .unwrap();
            for (what, got, want) in [
                ("output", y, want),
                ("input gradient", dx.unwrap(), dx_want),
                ("weight gradient", dw.unwrap(), dw_want),
            ] {
                assert_eq!(got.len(), want.len());
                let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    // One bf16 rounding of an f32 sum of the exact products.
                    let tol = w.abs() / 256.0 + 1e-5 * scale;
                    assert!(
                        (f64::from(g) - w).abs() <= tol,
                        "{what} {xd:?} at {i}: {g} vs {w}"
                    );
                    assert_eq!(crate::cast::round_f32(g), g, "{what} is bf16-exact");
                }
            }
        }
    }

    /// The stacked runs (several sizes of run, the last one short) and the
    /// image-by-image path give the definition's outputs and gradients.
    /// Runs of small products one per task (their weight gradients kept
    /// apart, then added in order) give the bits of the runs one after
    /// another: LeNet's second convolution, f32, stacked 4 images a run.
    #[test]
    fn runs_in_parallel_give_the_sequential_bits() {
        let mut rng = Rng::seed_from(23);
        let (xd, wd) = ([64, 6, 12, 12], [16, 6, 5, 5]);
        let p = Conv2dParams::default();
        let g = geometry(&Layout::contiguous(&xd), &Layout::contiguous(&wd), &p).unwrap();
        let f32s = |n: usize, rng: &mut Rng| -> Vec<f32> {
            rand_vec(n, rng).into_iter().map(|v| v as f32).collect()
        };
        let x = f32s(xd.iter().product(), &mut rng);
        let w = f32s(wd.iter().product(), &mut rng);
        let gy = f32s(xd[0] * wd[0] * g.oh * g.ow, &mut rng);
        let run = 4;
        let work = wd[0] * g.patch() * run * g.positions();
        if crate::par::threads() > 1 {
            assert!(
                batch_parallel(xd[0] / run, work),
                "the parallel runs are taken"
            );
        }
        for need in [[true, true], [false, true], [true, false]] {
            let (dx, dw) = conv2d_backward_with(&x, &w, &gy, &g, need, Some(run), Products::Plain);
            let in_img = xd[1..].iter().product::<usize>();
            let (mut want_dx, mut want_dw) = (vec![0.0f32; dx.len()], vec![0.0f32; dw.len()]);
            for i0 in (0..xd[0]).step_by(run) {
                let into = RunGrads {
                    gx: &mut want_dx[i0 * in_img..(i0 + run) * in_img],
                    gw: &mut want_dw,
                    add: i0 > 0,
                };
                backward_run(
                    &x,
                    &w,
                    &gy,
                    &g,
                    need,
                    (i0, run),
                    into,
                    Parallelism::None,
                    Products::Plain,
                );
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&dx), bits(&want_dx), "{need:?} input gradient");
            assert_eq!(bits(&dw), bits(&want_dw), "{need:?} weight gradient");
            assert!(dw.iter().any(|&v| v != 0.0) == need[1]);
            assert!(dx.iter().any(|&v| v != 0.0) == need[0]);
        }
    }

    #[test]
    fn stacked_images_match_the_definition() {
        let mut rng = Rng::seed_from(17);
        for (xd, wd, p) in [
            // A ResNet's deep 3x3 layer (4 positions per image), grouped.
            (
                [5, 4, 2, 2],
                [6, 2, 3, 3],
                Conv2dParams {
                    padding: [1, 1],
                    groups: 2,
                    ..Conv2dParams::default()
                },
            ),
            // A downsampling 1x1, stride 2.
            (
                [7, 3, 6, 6],
                [5, 3, 1, 1],
                Conv2dParams {
                    stride: [2, 2],
                    ..Conv2dParams::default()
                },
            ),
            // Pointwise, and a strided, dilated 3x3.
            ([4, 3, 5, 4], [2, 3, 1, 1], Conv2dParams::default()),
            (
                [3, 2, 9, 8],
                [4, 2, 3, 3],
                Conv2dParams {
                    stride: [2, 1],
                    padding: [1, 2],
                    dilation: [2, 1],
                    groups: 1,
                },
            ),
        ] {
            let g = geometry(&Layout::contiguous(&xd), &Layout::contiguous(&wd), &p).unwrap();
            let yd = [xd[0], wd[0], g.oh, g.ow];
            let x = rand_vec(xd.iter().product(), &mut rng);
            let w = rand_vec(wd.iter().product(), &mut rng);
            let gy = rand_vec(yd.iter().product(), &mut rng);
            let want = naive(&x, xd, &w, wd, &p);
            let (want_dx, want_dw) = naive_backward(&x, xd, &w, wd, &gy, &p);
            for stack in [None, Some(2), Some(3), Some(xd[0])] {
                let close = |got: &[f64], want: &[f64], what: &str| {
                    assert_eq!(got.len(), want.len());
                    for (i, (a, b)) in got.iter().zip(want).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                            "{xd:?} * {wd:?} {p:?} stack {stack:?} {what} {i}: got {a}, want {b}"
                        );
                    }
                };
                close(
                    &conv2d_with(&x, &w, &g, stack, Products::Plain),
                    &want,
                    "output",
                );
                let (dx, dw) =
                    conv2d_backward_with(&x, &w, &gy, &g, [true, true], stack, Products::Plain);
                close(&dx, &want_dx, "input gradient");
                close(&dw, &want_dw, "weight gradient");
                // One gradient asked for: the other is left zero.
                let (dx0, dw1) =
                    conv2d_backward_with(&x, &w, &gy, &g, [false, true], stack, Products::Plain);
                close(&dw1, &want_dw, "weight gradient alone");
                assert!(dx0.iter().all(|&v| v == 0.0));
            }
        }
        // The run sizes chosen: none for one image or many positions.
        let geo = |xd: [usize; 4], wd: [usize; 4]| {
            geometry(
                &Layout::contiguous(&xd),
                &Layout::contiguous(&wd),
                &Conv2dParams::default(),
            )
            .unwrap()
        };
        let (fwd, bwd) = (STACK_BELOW_FORWARD, STACK_BELOW);
        let deep = geo([16, 512, 4, 4], [512, 512, 3, 3]);
        assert_eq!(stacked_images(&deep, fwd), Some(16));
        let mid = geo([64, 64, 18, 18], [64, 64, 3, 3]);
        assert_eq!(stacked_images(&mid, bwd), Some(8));
        assert_eq!(stacked_images(&mid, fwd), None);
        let one = geo([1, 512, 4, 4], [512, 512, 3, 3]);
        assert_eq!(stacked_images(&one, bwd), None);
        let wide = geo([16, 3, 64, 64], [8, 3, 3, 3]);
        assert_eq!(stacked_images(&wide, bwd), None);
    }

    #[test]
    fn unit_stride_unrolling_matches_the_general_one() {
        let mut rng = Rng::seed_from(16);
        for (xd, wd, padding, dilation) in [
            ([1, 3, 7, 9], [4, 3, 3, 2], [0, 0], [1, 1]),
            ([1, 2, 6, 5], [2, 2, 3, 3], [2, 1], [1, 2]),
            ([1, 1, 28, 28], [6, 1, 5, 5], [2, 2], [1, 1]),
            ([1, 6, 14, 14], [16, 6, 5, 5], [0, 0], [1, 1]),
            ([1, 2, 4, 4], [3, 2, 4, 4], [3, 3], [1, 1]),
        ] {
            let p = Conv2dParams {
                padding,
                dilation,
                ..Conv2dParams::default()
            };
            let g = geometry(&Layout::contiguous(&xd), &Layout::contiguous(&wd), &p).unwrap();
            let x: Vec<f32> = rand_vec(xd.iter().product(), &mut rng)
                .iter()
                .map(|&v| v as f32)
                .collect();
            let len = g.patch() * g.positions();
            let (mut fast, mut general, mut buf) = (vec![1.0; len], vec![2.0; len], Vec::new());
            let l = g.positions();
            im2col_unit(&x, &mut fast, l, &g, false, &mut buf);
            im2col_general(&x, &mut general, l, &g, false);
            assert_eq!(fast, general, "{xd:?} {wd:?} {p:?}");
            // Both orders of accumulation are the same: equal bits.
            let dcol: Vec<f32> = rand_vec(len, &mut rng).iter().map(|&v| v as f32).collect();
            let (mut fast, mut general) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()]);
            col2im_unit(&dcol, l, &mut fast, &g, &mut buf);
            col2im_general(&dcol, l, &mut general, &g);
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&general), "{xd:?} {wd:?} {p:?}");
        }
    }

    #[test]
    fn short_copies() {
        for n in 0..40 {
            let src: Vec<u32> = (0..n).collect();
            let mut dst = vec![u32::MAX; n as usize];
            copy_short(&mut dst, &src);
            assert_eq!(dst, src);
        }
    }

    #[test]
    fn taps() {
        assert_eq!(tap_range(0, 1, 3, 5), (0, 3));
        assert_eq!(tap_range(-1, 1, 3, 5), (1, 3));
        assert_eq!(tap_range(-3, 2, 4, 5), (2, 4));
        assert_eq!(tap_range(3, 2, 4, 5), (0, 1));
        assert_eq!(tap_range(5, 1, 2, 5), (0, 0));
        assert_eq!(tap_range(-9, 2, 3, 5), (3, 3));
    }
}
