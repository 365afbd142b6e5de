//! [`AttentionKernel`] for [`Cpu`]: one task per head (and block of queries)
//! computes its scores into a scratch buffer that stays in cache, turns them
//! into weights in place (scale, mask, softmax) and multiplies them by the
//! values, writing the result straight into the output's layout. Nothing of
//! size `heads x T x S` is written to memory, and no head is copied to be
//! split or merged.
//!
//! It runs for f32 and f64, which are their own accumulation types; f16 and
//! bf16 take the composed ops, which round after each op as eager PyTorch
//! does. Under autocast (f32 tensors, bf16 or f16 products) the same pass
//! rounds each head's queries, keys and values as it gathers them and the
//! result as it writes it ([`AttentionKernel::attention_low`]). With AMX
//! tiles, bf16 products run on them instead (`bgemm`, f32 sums), rounding
//! their operands as they pack them: the attention weights are then
//! rounded too before they multiply the values, as PyTorch's CPU flash
//! attention rounds them for bf16.

use super::matmul::{gemm_into, same_ref, same_vec, Operand};
use super::reduce::nan_max;
use crate::{Cpu, PAR_CHUNK};
use forma_core::dtype::Real;
use forma_core::error::fmt_dims;
use forma_core::ops::attention::AttentionKernel;
use forma_core::{DType, Error, Float, Layout, Result};
use gemm::Parallelism;
use std::mem::MaybeUninit;

/// Scores one task holds (256 KiB of f32): longer key sequences split the
/// queries of a head into blocks of fewer rows.
const SCORES: usize = 1 << 16;

/// The output buffer, shared by the tasks, each of which writes its own
/// disjoint set of elements.
#[derive(Clone, Copy)]
struct Dst<A>(*mut MaybeUninit<A>);

// SAFETY: `Dst` is only a base pointer; the tasks it is sent to write
// disjoint elements (their own head and query rows, and the output layout is
// a bijection, checked in `attention`), and the buffer outlives them (the
// parallel loop returns before `fused` does).
unsafe impl<A: Send> Send for Dst<A> {}
// SAFETY: as for `Send`: shared copies never touch the same element.
unsafe impl<A: Send> Sync for Dst<A> {}

impl<A> Dst<A> {
    /// Writes `x` at offset `i`.
    ///
    /// # Safety
    /// `i` must be inside the buffer, and no other task may write it.
    unsafe fn write(self, i: usize, x: A) {
        // SAFETY: as the caller promises.
        unsafe { self.0.add(i).write(MaybeUninit::new(x)) };
    }

    /// Writes `xs` at offsets `i..i + xs.len()`.
    ///
    /// # Safety
    /// The range must be inside the buffer, and no other task may write it.
    unsafe fn write_row(self, i: usize, xs: &[A]) {
        // SAFETY: as the caller promises; `MaybeUninit<A>` has `A`'s layout,
        // and a task's scratch row never overlaps the output buffer.
        unsafe { std::ptr::copy_nonoverlapping(xs.as_ptr(), self.0.add(i).cast::<A>(), xs.len()) };
    }
}

/// `v` in its accumulation type, when that is its own type (f32, f64).
fn acc<E: Float>(v: &Vec<E>) -> Option<&[E::Acc]> {
    same_ref::<E, E::Acc>(v).map(Vec::as_slice)
}

/// `v` as f32s, when `E` is f32.
fn f32s<E: Float>(v: &Vec<E>) -> Option<&[f32]> {
    same_ref::<E, f32>(v).map(Vec::as_slice)
}

/// One operand: its elements and its `[b, h, rows, cols]` layout.
type Operand4<'a, A> = (&'a [A], &'a Layout);

/// Whether `l` is a row-major layout of its dims with the axes permuted: then
/// its offsets cover `0..numel` exactly once.
fn is_permuted_dense(l: &Layout) -> bool {
    let mut axes: Vec<usize> = (0..l.rank()).filter(|&i| l.dims[i] > 1).collect();
    axes.sort_by_key(|&i| std::cmp::Reverse(l.strides[i]));
    let mut expect = 1;
    for &i in axes.iter().rev() {
        if l.strides[i] != expect {
            return false;
        }
        expect *= l.dims[i];
    }
    l.offset == 0
}

/// How one head's score rows become weights.
struct Rows<'a, A> {
    /// Keys: the length of a row.
    s: usize,
    /// The factor on every score.
    scale: A,
    /// The additive mask's storage and its stride along the keys.
    mask: Option<(&'a [A], usize)>,
    /// The offset of the mask's row for a query.
    mask_row: &'a dyn Fn(usize) -> usize,
    /// Whether keys after the query are hidden.
    causal: bool,
}

/// Scale, mask and softmax of one block of score rows in place: row `i` of
/// `scores` is query `r0 + i`.
#[inline(always)]
fn weights<A: Real>(scores: &mut [A], r0: usize, rows: &Rows<'_, A>) {
    let (s, scale) = (rows.s, rows.scale);
    for (i, row) in scores.chunks_exact_mut(s).enumerate() {
        let r = r0 + i;
        // Keys after `r` are hidden under the causal mask.
        let seen = if rows.causal { (r + 1).min(s) } else { s };
        let (row, hidden) = row.split_at_mut(seen);
        // Three passes over the row: scale (and mask) with the maximum,
        // the exponentials with their sum, the normalisation.
        let max = match rows.mask {
            Some((m, ms)) => {
                let base = (rows.mask_row)(r);
                map_fold(row, A::neg_infinity(), nan_max, |j, x| {
                    x * scale + m[base + j * ms]
                })
            }
            None => map_fold(row, A::neg_infinity(), nan_max, |_, x| x * scale),
        };
        let sum = map_fold(row, A::zero(), |a, b| a + b, |_, x| (x - max).exp_fast());
        let inv = A::one() / sum;
        row.iter_mut().for_each(|x| *x = *x * inv);
        hidden.iter_mut().for_each(|x| *x = A::zero());
    }
}

/// Replaces each `x` of `row` (at index `j`) by `f(j, x)` and folds the new
/// values with the associative `comb` (identity `id`): sixteen running
/// accumulators, so that the loop vectorises as wide as AVX-512, combined
/// pairwise at the end.
#[inline(always)]
fn map_fold<A: Real>(
    row: &mut [A],
    id: A,
    comb: impl Fn(A, A) -> A,
    f: impl Fn(usize, A) -> A,
) -> A {
    const W: usize = 16;
    let mut acc = [id; W];
    let whole = row.len() / W * W;
    let (body, rest) = row.split_at_mut(whole);
    for (c, chunk) in body.chunks_exact_mut(W).enumerate() {
        for (j, (a, x)) in acc.iter_mut().zip(chunk).enumerate() {
            *x = f(W * c + j, *x);
            *a = comb(*a, *x);
        }
    }
    let mut tail = id;
    for (j, x) in rest.iter_mut().enumerate() {
        *x = f(whole + j, *x);
        tail = comb(tail, *x);
    }
    let mut width = W;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            acc[j] = comb(acc[j], acc[j + width]);
        }
    }
    comb(acc[0], tail)
}

/// The arguments of [`weights`], as a [`crate::simd::Vectorized`] loop.
struct Weights<'a, 'r, A> {
    scores: &'a mut [A],
    r0: usize,
    rows: &'a Rows<'r, A>,
}

impl<A: Real> crate::simd::Vectorized for Weights<'_, '_, A> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        weights(self.scores, self.r0, self.rows);
    }
}

/// [`weights`], vectorised for the CPU it runs on.
fn run_weights<A: Real>(scores: &mut [A], r0: usize, rows: &Rows<'_, A>) {
    crate::simd::run(Weights { scores, r0, rows });
}

/// Autocast's rounding inside the fused pass: a strided block gathered
/// rounded, and a result row rounded in place.
trait Rounding<A>: Sync {
    /// Copies the `m x n` block of `data` whose element `(i, j)` is at
    /// `off + i * rs + j * cs` into `dst` (row-major), rounded.
    fn gather(&self, dst: &mut [A], data: &[A], off: usize, rs_cs: [usize; 2], m_n: [usize; 2]);
    /// Rounds `xs` in place.
    fn in_place(&self, xs: &mut [A]);
    /// Whether the products run on low-precision hardware that rounds the
    /// operands as it packs them ([`Rounding::product`]): then nothing is
    /// gathered or rounded in place.
    fn tiles(&self) -> bool {
        false
    }
    /// `dst = a @ b` (`m x k` by `k x n`) on the low-precision products,
    /// each operand rounded, the f32 sums rounded when `round`. Called only
    /// where [`Rounding::tiles`] says so.
    #[allow(clippy::too_many_arguments)]
    fn product(
        &self,
        dst: &mut [A],
        m: usize,
        n: usize,
        k: usize,
        a: Operand<'_, A>,
        b: Operand<'_, A>,
        round: bool,
    ) {
        let _ = (dst, m, n, k, a, b, round);
        unreachable!("products on tiles only where `tiles()` says so")
    }
}

/// bf16 rounding on AMX tiles: each product rounds its operands as it
/// packs them, the attention weights included (as PyTorch's CPU flash
/// attention rounds them for bf16 before multiplying by the values).
#[cfg(target_arch = "x86_64")]
struct Tiles;

#[cfg(target_arch = "x86_64")]
impl Rounding<f32> for Tiles {
    fn gather(&self, _: &mut [f32], _: &[f32], _: usize, _: [usize; 2], _: [usize; 2]) {
        unreachable!("products on tiles gather nothing")
    }

    fn in_place(&self, _: &mut [f32]) {
        unreachable!("products on tiles round their sums as they write them")
    }

    fn tiles(&self) -> bool {
        true
    }

    fn product(
        &self,
        dst: &mut [f32],
        m: usize,
        n: usize,
        k: usize,
        a: Operand<'_, f32>,
        b: Operand<'_, f32>,
        round: bool,
    ) {
        // SAFETY: the same memory as `MaybeUninit<f32>`, which the product
        // overwrites (and never reads) in full.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<MaybeUninit<f32>>(), dst.len())
        };
        super::bgemm::bgemm(&mut dst[..m * n], m, n, k, a, b, None, round, false);
    }
}

/// [`Rounding`] by an elementwise function, inlined into loops compiled for
/// the widest vectors the CPU has.
struct Round<F>(F);

/// A strided block gathered rounded (see [`Rounding::gather`]).
struct Gather<'a, A, F> {
    dst: &'a mut [A],
    data: &'a [A],
    off: usize,
    rs_cs: [usize; 2],
    m_n: [usize; 2],
    round: &'a F,
}

impl<A: Copy, F: Fn(A) -> A> crate::simd::Vectorized for Gather<'_, A, F> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let ([rs, cs], [m, n]) = (self.rs_cs, self.m_n);
        for (i, row) in self.dst[..m * n].chunks_exact_mut(n).enumerate() {
            let at = self.off + i * rs;
            if cs == 1 {
                for (d, &x) in row.iter_mut().zip(&self.data[at..at + n]) {
                    *d = (self.round)(x);
                }
            } else {
                for (j, d) in row.iter_mut().enumerate() {
                    *d = (self.round)(self.data[at + j * cs]);
                }
            }
        }
    }
}

/// Elements rounded in place.
struct InPlace<'a, A, F>(&'a mut [A], &'a F);

impl<A: Copy, F: Fn(A) -> A> crate::simd::Vectorized for InPlace<'_, A, F> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        self.0.iter_mut().for_each(|x| *x = (self.1)(*x));
    }
}

impl<A: Copy, F: Fn(A) -> A + Sync> Rounding<A> for Round<F> {
    fn gather(&self, dst: &mut [A], data: &[A], off: usize, rs_cs: [usize; 2], m_n: [usize; 2]) {
        let round = &self.0;
        crate::simd::run(Gather {
            dst,
            data,
            off,
            rs_cs,
            m_n,
            round,
        });
    }

    fn in_place(&self, xs: &mut [A]) {
        crate::simd::run(InPlace(xs, &self.0));
    }
}

/// The fused attention on accumulation-type operands; `out` has been checked
/// to be a permuted dense layout of `[b, h, t, dv]`. With `round` (autocast),
/// each task reads its head's queries, keys and values through it into a
/// scratch copy, and rounds its result rows the same way.
fn fused<A: Real>(
    Operands { q, k, v, mask }: Operands<'_, A>,
    causal: bool,
    scale: A,
    out: &Layout,
    round: Option<&dyn Rounding<A>>,
) -> Vec<A> {
    let (lq, lk, lv) = (q.1, k.1, v.1);
    let [b, h, t, dk] = [lq.dims[0], lq.dims[1], lq.dims[2], lq.dims[3]];
    let (s, dv) = (lk.dims[2], lv.dims[3]);
    let rows = (SCORES / s).clamp(1, t);
    let blocks = t.div_ceil(rows);
    let numel = out.numel();
    let mut vec: Vec<A> = Vec::with_capacity(numel);
    let dst = Dst(vec.spare_capacity_mut().as_mut_ptr());
    let os = out.strides;
    let task = |i: usize, (scores, local, copies): &mut (Vec<A>, Vec<A>, Vec<A>)| {
        let (bh, blk) = (i / blocks, i % blocks);
        let (bi, hi) = (bh / h, bh % h);
        let r0 = blk * rows;
        let m = rows.min(t - r0);
        let at = |l: &Layout| l.offset + bi * l.strides[0] + hi * l.strides[1];
        let mut qo = Operand {
            data: q.0,
            off: at(lq) + r0 * lq.strides[2],
            rs: lq.strides[2],
            cs: lq.strides[3],
        };
        // k^T: element (p, j) is key j's p-th entry.
        let mut kt = Operand {
            data: k.0,
            off: at(lk),
            rs: lk.strides[3],
            cs: lk.strides[2],
        };
        let mut vo = Operand {
            data: v.0,
            off: at(lv),
            rs: lv.strides[2],
            cs: lv.strides[3],
        };
        let tiles = round.filter(|r| r.tiles());
        if let Some(round) = round.filter(|r| !r.tiles()) {
            // Rounded copies, row-major: the query block, then the keys and
            // values of the head.
            let (cq, rest) = copies.split_at_mut(m * dk);
            let (ck, cv) = rest.split_at_mut(s * dk);
            round.gather(cq, q.0, qo.off, [qo.rs, qo.cs], [m, dk]);
            round.gather(ck, k.0, kt.off, [lk.strides[2], lk.strides[3]], [s, dk]);
            round.gather(cv, v.0, vo.off, [vo.rs, vo.cs], [s, dv]);
            qo = Operand {
                data: &*cq,
                off: 0,
                rs: dk,
                cs: 1,
            };
            kt = Operand {
                data: &*ck,
                off: 0,
                rs: 1,
                cs: dk,
            };
            vo = Operand {
                data: &*cv,
                off: 0,
                rs: dv,
                cs: 1,
            };
        }
        let scores = &mut scores[..m * s];
        match tiles {
            Some(t) => t.product(scores, m, s, dk, qo, kt, false),
            None => gemm_into(scores, m, s, dk, qo, kt, Parallelism::None),
        }
        let mask_row = |r: usize| mask.map_or(0, |(_, lm)| at(lm) + r * lm.strides[2]);
        let how = Rows {
            s,
            scale,
            mask: mask.map(|(d, lm)| (d, lm.strides[3])),
            mask_row: &mask_row,
            causal,
        };
        run_weights(scores, r0, &how);
        let p = Operand {
            data: &*scores,
            off: 0,
            rs: s,
            cs: 1,
        };
        let local = &mut local[..m * dv];
        match tiles {
            Some(t) => t.product(local, m, dv, s, p, vo, true),
            None => {
                gemm_into(local, m, dv, s, p, vo, Parallelism::None);
                if let Some(round) = round {
                    round.in_place(local);
                }
            }
        }
        let base = bi * os[0] + hi * os[1];
        for (i, row) in local.chunks_exact(dv).enumerate() {
            let o = base + (r0 + i) * os[2];
            if os[3] == 1 {
                // SAFETY: as below, for the `dv` consecutive elements of
                // the row.
                unsafe { dst.write_row(o, row) };
                continue;
            }
            for (d, &x) in row.iter().enumerate() {
                // SAFETY: `o + d * os[3]` is the offset of element
                // (bi, hi, r0 + i, d) of `out`, inside `0..numel` (a
                // permuted dense layout), and only this task writes it.
                unsafe { dst.write(o + d * os[3], x) };
            }
        }
    };
    let copies = if round.is_some_and(|r| !r.tiles()) {
        rows * dk + s * (dk + dv)
    } else {
        0
    };
    let scratch = || {
        (
            vec![A::zero(); rows * s],
            vec![A::zero(); rows * dv],
            vec![A::zero(); copies],
        )
    };
    let tasks = b * h * blocks;
    let work = rows * s * (dk + dv);
    if crate::par::threads() > 1 && tasks > 1 && tasks * work >= 2 * PAR_CHUNK {
        crate::par::for_each_init(tasks, (PAR_CHUNK / work).max(1), scratch, |sc, i| {
            task(i, sc)
        });
    } else {
        let mut sc = scratch();
        (0..tasks).for_each(|i| task(i, &mut sc));
    }
    // SAFETY: the tasks wrote every element of `out` (each (b, h, query)
    // row once, `out` being a bijection onto `0..numel`).
    unsafe { vec.set_len(numel) };
    vec
}

/// Checks that the operands and the output have the kernel's shapes;
/// `Ok(false)` when they are empty (the composed ops give PyTorch's answer).
fn fits<S>(
    q: (&S, &Layout),
    k: (&S, &Layout),
    v: (&S, &Layout),
    mask: Option<(&S, &Layout)>,
    out: &Layout,
) -> Result<bool> {
    let (lq, lk, lv) = (q.1, k.1, v.1);
    let fits = lq.rank() == 4
        && lk.rank() == 4
        && lv.rank() == 4
        && lk.dims[..2] == lq.dims[..2]
        && lk.dims[3] == lq.dims[3]
        && lv.dims[..3] == lk.dims[..3]
        && out.dims[..] == [lq.dims[0], lq.dims[1], lq.dims[2], lv.dims[3]]
        && mask
            .is_none_or(|(_, lm)| lm.dims[..] == [lq.dims[0], lq.dims[1], lq.dims[2], lk.dims[2]])
        && is_permuted_dense(out);
    if !fits {
        return Err(Error::invalid(
            "scaled_dot_product_attention",
            format!(
                "operands {}, {}, {} and output {} are not [b, h, t, dk], [b, h, s, dk], [b, h, s, dv] and a dense [b, h, t, dv]",
                fmt_dims(&lq.dims),
                fmt_dims(&lk.dims),
                fmt_dims(&lv.dims),
                fmt_dims(&out.dims)
            ),
        ));
    }
    Ok(out.numel() > 0 && lk.dims[2] > 0)
}

/// The operands of [`fused`].
struct Operands<'a, A> {
    q: Operand4<'a, A>,
    k: Operand4<'a, A>,
    v: Operand4<'a, A>,
    mask: Option<Operand4<'a, A>>,
}

/// The operands' elements as `A`s through `view` (`None` when it has no
/// view of one of them: the caller runs the composed ops), once their
/// shapes are checked, and when there is anything to compute.
fn operands<'a, E, A>(
    [q, k, v]: [(&'a Vec<E>, &'a Layout); 3],
    mask: Option<(&'a Vec<E>, &'a Layout)>,
    out: &Layout,
    view: impl Fn(&'a Vec<E>) -> Option<&'a [A]>,
) -> Result<Option<Operands<'a, A>>> {
    let (Some(qa), Some(ka), Some(va)) = (view(q.0), view(k.0), view(v.0)) else {
        return Ok(None);
    };
    let ma = match mask {
        Some((m, lm)) => match view(m) {
            Some(m) => Some((m, lm)),
            None => return Ok(None),
        },
        None => None,
    };
    if !fits(q, k, v, mask, out)? {
        return Ok(None);
    }
    Ok(Some(Operands {
        q: (qa, q.1),
        k: (ka, k.1),
        v: (va, v.1),
        mask: ma,
    }))
}

impl<E: Float> AttentionKernel<E> for Cpu {
    fn attention(
        &self,
        q: (&Vec<E>, &Layout),
        k: (&Vec<E>, &Layout),
        v: (&Vec<E>, &Layout),
        mask: Option<(&Vec<E>, &Layout)>,
        causal: bool,
        scale: f64,
        out: &Layout,
    ) -> Result<Option<Vec<E>>> {
        let Some(ops) = operands([q, k, v], mask, out, acc::<E>)? else {
            return Ok(None);
        };
        let y = fused(ops, causal, E::Acc::c(scale), out, None);
        Ok(Some(super::matmul::from_acc_vec::<E>(y)))
    }

    fn attention_low(
        &self,
        q: (&Vec<E>, &Layout),
        k: (&Vec<E>, &Layout),
        v: (&Vec<E>, &Layout),
        mask: Option<(&Vec<E>, &Layout)>,
        causal: bool,
        scale: f64,
        out: &Layout,
        low: DType,
    ) -> Result<Option<Vec<E>>> {
        // Autocast rounds f32 tensors; the others keep the composed path.
        let Some(ops) = operands([q, k, v], mask, out, f32s::<E>)? else {
            return Ok(None);
        };
        let bf16 = Round(crate::cast::round_f32);
        let f16 = Round(|x: f32| half::f16::from_f32(x).to_f32());
        let round: &dyn Rounding<f32> = match low {
            #[cfg(target_arch = "x86_64")]
            DType::BF16 if super::bgemm::available() => &Tiles,
            DType::BF16 => &bf16,
            DType::F16 => &f16,
            _ => return Ok(None),
        };
        let y = fused(ops, causal, scale as f32, out, Some(round));
        Ok(same_vec::<f32, E>(y).ok())
    }
}
