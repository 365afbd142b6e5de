//! Matrix products through the `gemm` crate, or for f32 on x86_64 CPUs with
//! AVX2 and FMA through Forma's own kernel (`sgemm.rs`).
//!
//! f32 and f64 operands go to gemm in place, with their own strides (transposed
//! and broadcast views are not copied). bf16 on a CPU with AMX tiles runs
//! there (`bgemm.rs`); otherwise f16 and bf16 are widened to f32 (their
//! [`Float::Acc`]), multiplied with f32 accumulation and rounded once at the
//! end, like PyTorch's CPU kernels. Autocast's bf16 products of f32 operands
//! ([`MatmulKernel::matmul_low`]) run on AMX too, rounding the operands as
//! they are packed. The dtype is resolved once per call through `Any`
//! downcasts, never per element.
//!
//! Parallelism: one large product is split over the threads inside the
//! product (Forma's sgemm, or gemm on rayon's threads); a batch of small
//! products runs one single-threaded product per matrix in parallel
//! (`crate::par`). When the right operand is broadcast over the
//! batch and the left operand's batch dims fold into its rows (the `[b, t, k] @
//! [k, n]` of a linear layer), the batch becomes one tall product.
//!
//! The helpers here ([`gemm_into`], [`dense_acc`], [`from_acc_vec`]) are shared
//! with the convolution kernel.

use crate::strided::StridedIter;
use crate::{fill_strided, Cpu, PAR_CHUNK};
use forma_core::dtype::Real;
use forma_core::error::fmt_dims;
use forma_core::ops::matmul::{MatmulKernel, PackedRhs};
use forma_core::shape::Dims;
use forma_core::{DType, Error, Float, Layout, Result};
pub(crate) use gemm::Parallelism;
use half::bf16;
use std::any::{Any, TypeId};
use std::borrow::Cow;
use std::mem::MaybeUninit;

/// Multiply-adds per matrix above which a batch of a few matrices is better
/// served by gemm's own threading than by one thread per matrix.
const INNER_PAR_WORK: usize = 1 << 21;

/// `v` itself when `T` and `U` are the same type.
// A `Vec`, not a slice: an unsized `[T]` cannot be downcast through `Any`.
#[allow(clippy::ptr_arg)]
pub(crate) fn same_ref<T: 'static, U: 'static>(v: &Vec<T>) -> Option<&Vec<U>> {
    (v as &dyn Any).downcast_ref::<Vec<U>>()
}

/// `v` itself when `T` and `U` are the same type, else `v` back.
pub(crate) fn same_vec<T: 'static, U: 'static>(v: Vec<T>) -> std::result::Result<Vec<U>, Vec<T>> {
    let mut slot = Some(v);
    if let Some(s) = (&mut slot as &mut dyn Any).downcast_mut::<Option<Vec<U>>>() {
        return Ok(s.take().expect("slot was filled"));
    }
    Err(slot.take().expect("slot was filled"))
}

/// A view's elements, row-major, in the accumulation type: borrowed when `E`
/// is its own accumulation type (f32, f64) and the view is dense, else copied.
pub(crate) fn dense_acc<'a, E: Float>(src: &'a Vec<E>, layout: &Layout) -> Cow<'a, [E::Acc]> {
    if let (Some(s), Some(r)) = (same_ref::<E, E::Acc>(src), layout.contiguous_range()) {
        return Cow::Borrowed(&s[r]);
    }
    let mut out = vec![E::Acc::default(); layout.numel()];
    fill_strided(&mut out, layout, |o| src[o].to_acc());
    Cow::Owned(out)
}

/// Narrows a result computed in the accumulation type; free for f32 and f64.
pub(crate) fn from_acc_vec<E: Float>(v: Vec<E::Acc>) -> Vec<E> {
    let v = match same_vec::<E::Acc, E>(v) {
        Ok(same) => return same,
        Err(v) => v,
    };
    let mut out = vec![E::default(); v.len()];
    let narrow = |o: &mut [E], s: &[E::Acc]| {
        for (o, &s) in o.iter_mut().zip(s) {
            *o = E::from_acc(s);
        }
    };
    if v.len() >= 2 * PAR_CHUNK {
        crate::par::chunks_mut(&mut out, PAR_CHUNK, |c, o| narrow(o, &v[c * PAR_CHUNK..]));
    } else {
        narrow(&mut out, &v);
    }
    out
}

/// A strided matrix operand: element `(i, j)` is `data[off + i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operand<'a, A> {
    /// The storage the matrix lives in.
    pub data: &'a [A],
    /// Index of element `(0, 0)`.
    pub off: usize,
    /// Row stride in elements.
    pub rs: usize,
    /// Column stride in elements.
    pub cs: usize,
}

impl<A> Operand<'_, A> {
    /// Row and column strides with those of size-1 dims zeroed (they are never
    /// used, and may be arbitrarily large), after checking that every element
    /// of the `rows x cols` matrix lies inside `data`.
    ///
    /// # Panics
    /// If an element would fall outside `data`: the kernels validate layouts
    /// before calling, so this guards an internal invariant.
    fn checked_strides(&self, rows: usize, cols: usize) -> (isize, isize) {
        let rs = if rows > 1 { self.rs } else { 0 };
        let cs = if cols > 1 { self.cs } else { 0 };
        let last = (rows - 1)
            .checked_mul(rs)
            .and_then(|r| r.checked_add((cols - 1).checked_mul(cs)?))
            .and_then(|r| r.checked_add(self.off));
        assert!(
            last.is_some_and(|l| l < self.data.len()),
            "gemm operand {rows}x{cols} (strides {rs}, {cs}, offset {}) outside a storage of {}",
            self.off,
            self.data.len()
        );
        // Each stride times (size - 1) is below `data.len() <= isize::MAX`.
        (rs as isize, cs as isize)
    }

    /// This operand with the strides of size-1 dims zeroed, after checking
    /// that its `rows x cols` matrix lies inside `data` (see
    /// `checked_strides`).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn clamped(self, rows: usize, cols: usize) -> Self {
        let (rs, cs) = self.checked_strides(rows, cols);
        Operand {
            rs: rs as usize,
            cs: cs as usize,
            ..self
        }
    }

    fn at(&self, i: usize, j: usize) -> &A {
        &self.data[self.off + i * self.rs + j * self.cs]
    }
}

/// `dst = lhs @ rhs` for an `m x k` `lhs` and a `k x n` `rhs` into a filled
/// buffer; see [`gemm_uninit`].
pub(crate) fn gemm_into<A: Real>(
    dst: &mut [A],
    m: usize,
    n: usize,
    k: usize,
    lhs: Operand<'_, A>,
    rhs: Operand<'_, A>,
    parallelism: Parallelism,
) {
    // SAFETY: `MaybeUninit<A>` has `A`'s layout, and `gemm_uninit` stores
    // only values of `A` (every element), so `dst` stays initialised.
    let dst = unsafe { &mut *(dst as *mut [A] as *mut [MaybeUninit<A>]) };
    gemm_uninit(dst, m, n, k, lhs, rhs, None, parallelism);
}

/// `dst = lhs @ rhs` for an `m x k` `lhs` and a `k x n` `rhs`, plus
/// `bias[j]` on column `j` when given (added to each finished sum); `dst`
/// is row-major `m x n` and is written in full (zeros when `k == 0`)
/// without being read, so a fresh allocation needs no zero-filling first.
///
/// # Panics
/// If `dst` is not `m * n` long, `bias` not `n` long or an operand does
/// not fit its storage.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_uninit<A: Real>(
    dst: &mut [MaybeUninit<A>],
    m: usize,
    n: usize,
    k: usize,
    lhs: Operand<'_, A>,
    rhs: Operand<'_, A>,
    bias: Option<&[A]>,
    parallelism: Parallelism,
) {
    assert_eq!(dst.len(), m * n, "gemm destination length");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "gemm bias length");
    }
    let plus = |j: usize, v: A| bias.map_or(v, |b| v + b[j]);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for (e, d) in dst.iter_mut().enumerate() {
            d.write(plus(e % n, A::zero()));
        }
        return;
    }
    let (lrs, lcs) = lhs.checked_strides(m, k);
    let (rrs, rcs) = rhs.checked_strides(k, n);
    let gemm_type =
        TypeId::of::<A>() == TypeId::of::<f32>() || TypeId::of::<A>() == TypeId::of::<f64>();
    if !gemm_type {
        // Not reached by the built-in dtypes (their accumulation types are f32
        // and f64); keeps `Real` implementors outside gemm's types correct.
        for i in 0..m {
            for j in 0..n {
                let mut s = A::zero();
                for p in 0..k {
                    s = s + *lhs.at(i, p) * *rhs.at(p, j);
                }
                dst[i * n + j].write(plus(j, s));
            }
        }
        return;
    }
    // f32 on an AVX2+FMA CPU: Forma's own kernel (`sgemm.rs`), which matches
    // or beats gemm's on the shapes measured there; f64 stays with gemm.
    #[cfg(target_arch = "x86_64")]
    if TypeId::of::<A>() == TypeId::of::<f32>() && super::sgemm::available() {
        let f32s = |s: &[A]| {
            // SAFETY: `A` is f32 (same `TypeId`), so this is the same slice
            // at its own type.
            unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) }
        };
        // SAFETY: as above, `A` is f32; the exclusive borrow moves into the
        // new slice for the rest of the call.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<MaybeUninit<f32>>(), dst.len())
        };
        let view = |o: &Operand<'_, A>, rs: isize, cs: isize| super::sgemm::View {
            data: f32s(o.data),
            off: o.off,
            rs: rs as usize,
            cs: cs as usize,
        };
        super::sgemm::sgemm(
            dst,
            m,
            n,
            k,
            view(&lhs, lrs, lcs),
            view(&rhs, rrs, rcs),
            bias.map(f32s),
            !matches!(parallelism, Parallelism::None),
        );
        return;
    }
    let lhs_ptr = lhs.data[lhs.off..].as_ptr();
    let rhs_ptr = rhs.data[rhs.off..].as_ptr();
    // SAFETY: `checked_strides` asserted that `off + i * rs + j * cs` is inside
    // each operand's slice for every `i < rows`, `j < cols`, which are exactly
    // the elements gemm reads (strides are non-negative, so no element precedes
    // the base pointer). `dst` is an exclusive borrow of exactly `m * n`
    // elements, written at `i * n + j` (row stride n, column stride 1), so it
    // aliases neither operand. `A` is f32 or f64 (checked just above), both of
    // which gemm supports, so its dispatch does not panic. gemm writes every
    // dst element with `read_dst = false` (dst := 1 * lhs @ rhs; alpha, the
    // weight of the old dst, is ignored).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr().cast::<A>(),
            1,
            n as isize,
            false,
            lhs_ptr,
            lcs,
            lrs,
            rhs_ptr,
            rcs,
            rrs,
            A::zero(),
            A::one(),
            false,
            false,
            false,
            parallelism,
        );
    }
    if let Some(b) = bias {
        // SAFETY: gemm wrote every element just above.
        let dst = unsafe { &mut *(dst as *mut [MaybeUninit<A>] as *mut [A]) };
        for row in dst.chunks_exact_mut(n) {
            row.iter_mut().zip(b).for_each(|(o, &b)| *o = *o + b);
        }
    }
}

/// gemm's threading for one product standing alone (gemm applies its own
/// size threshold below which it stays on one thread).
pub(crate) fn solo_parallelism() -> Parallelism {
    if crate::par::threads() > 1 {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

/// Whether `batch` independent products of `work` multiply-adds each should
/// run as one parallel task per product (single-threaded inside) rather than
/// one after another with gemm threading each: yes when there is enough work
/// and either the products are small or they spread evenly over the threads.
pub(crate) fn batch_parallel(batch: usize, work: usize) -> bool {
    let threads = crate::par::threads();
    threads > 1
        && batch > 1
        && batch.saturating_mul(work) >= 2 * PAR_CHUNK
        && (work < INNER_PAR_WORK || batch.is_multiple_of(threads) || batch >= 4 * threads)
}

/// The single stride that walks `dims` (row-major, size-1 dims ignored), so
/// they can act as one dim; `None` when they do not fold.
fn fold_stride(dims: &[usize], strides: &[usize]) -> Option<usize> {
    let mut inner = 0;
    let mut expect: Option<usize> = None;
    for (&d, &s) in dims.iter().zip(strides).rev() {
        if d == 1 {
            continue;
        }
        match expect {
            None => inner = s,
            Some(e) if e == s => {}
            Some(_) => return None,
        }
        expect = Some(s.checked_mul(d)?);
    }
    Some(inner)
}

/// The batch dims of a `[batch.., r, c]` layout, as a layout of their own.
fn batch_layout(l: &Layout) -> Layout {
    let r = l.rank();
    Layout {
        dims: Dims::from_slice(&l.dims[..r - 2]),
        strides: Dims::from_slice(&l.strides[..r - 2]),
        offset: l.offset,
    }
}

/// One product of a batch: `(dst, m, n, k, lhs, rhs, parallelism)`.
type Gemm<'g, T, O> = dyn Fn(&mut [MaybeUninit<O>], usize, usize, usize, Operand<'_, T>, Operand<'_, T>, Parallelism)
    + Sync
    + 'g;

/// The batched product on operands of a gemm type (the accumulation type).
/// The caller has validated the layouts and handled empty outputs and k = 0.
fn matmul_acc<A: Real>(a: &[A], la: &Layout, b: &[A], lb: &Layout) -> Vec<A> {
    batched(a, la, b, lb, &|o, m, n, k, l, r, par| {
        gemm_uninit(o, m, n, k, l, r, None, par);
    })
}

/// The batched product of validated, non-empty layouts, each matrix by
/// `gemm`: one tall product when `b` is shared by the batch and `a`'s batch
/// dims fold into its rows, else one product per matrix (in parallel when
/// [`batch_parallel`] says so).
fn batched<T: Sync, O: Send>(
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    gemm: &Gemm<'_, T, O>,
) -> Vec<O> {
    let r = la.rank();
    let (m, k, n) = (la.dims[r - 2], la.dims[r - 1], lb.dims[r - 1]);
    let batch: usize = la.dims[..r - 2].iter().product();
    let (acs, brs, bcs) = (la.strides[r - 1], lb.strides[r - 2], lb.strides[r - 1]);
    let len = batch * m * n;
    let mut vec = Vec::with_capacity(len);
    if len == 0 {
        return vec;
    }
    // Written once by the products, into uninitialised memory.
    let out = &mut vec.spare_capacity_mut()[..len];
    let rhs_at = |off| Operand {
        data: b,
        off,
        rs: brs,
        cs: bcs,
    };
    // `b` shared by the whole batch and `a`'s batch dims folding into its
    // rows: one tall product.
    let b_shared = (0..r - 2).all(|i| lb.dims[i] == 1 || lb.strides[i] == 0);
    if b_shared {
        if let Some(rs) = fold_stride(&la.dims[..r - 1], &la.strides[..r - 1]) {
            let lhs = Operand {
                data: a,
                off: la.offset,
                rs,
                cs: acs,
            };
            gemm(
                out,
                batch * m,
                n,
                k,
                lhs,
                rhs_at(lb.offset),
                solo_parallelism(),
            );
            // SAFETY: the product wrote all `len` elements.
            unsafe { vec.set_len(len) };
            return vec;
        }
    }
    let mut ia = StridedIter::new(&batch_layout(la), 0);
    let mut ib = StridedIter::new(&batch_layout(lb), 0);
    let offsets: Vec<(usize, usize)> = (0..batch)
        .map(|_| (ia.next_offset(), ib.next_offset()))
        .collect();
    let ars = la.strides[r - 2];
    let one = |o: &mut [MaybeUninit<O>], (ao, bo): (usize, usize), par| {
        let lhs = Operand {
            data: a,
            off: ao,
            rs: ars,
            cs: acs,
        };
        gemm(o, m, n, k, lhs, rhs_at(bo), par);
    };
    let work = m * n * k;
    if batch_parallel(batch, work) {
        let per = (PAR_CHUNK / work).max(1);
        crate::par::chunks_mut(out, per * m * n, |c, o| {
            for (o, &offs) in o.chunks_mut(m * n).zip(&offsets[c * per..]) {
                one(o, offs, Parallelism::None);
            }
        });
    } else {
        let par = solo_parallelism();
        for (o, &offs) in out.chunks_mut(m * n).zip(&offsets) {
            one(o, offs, par);
        }
    }
    // SAFETY: the `batch` products wrote their `m * n` elements each.
    unsafe { vec.set_len(len) };
    vec
}

/// A copy of a view in the accumulation type that keeps broadcast (stride-0)
/// dims unexpanded: the copy is row-major over the other dims and the returned
/// layout reads it with stride 0 along the broadcast ones. The view must be
/// non-empty.
fn compact_acc<E: Float>(src: &[E], l: &Layout) -> (Vec<E::Acc>, Layout) {
    let mut g = *l;
    for i in 0..g.rank() {
        if g.strides[i] == 0 {
            g.dims[i] = 1;
        }
    }
    let mut out = vec![E::Acc::default(); g.numel()];
    fill_strided(&mut out, &g, |o| src[o].to_acc());
    let mut c = Layout::contiguous(&g.dims);
    for i in 0..c.rank() {
        if l.strides[i] == 0 {
            c.dims[i] = l.dims[i];
            c.strides[i] = 0;
        }
    }
    (out, c)
}

/// A 2-D f32 storage and layout as an sgemm operand.
///
/// # Panics
/// If `E` is not f32.
#[cfg(target_arch = "x86_64")]
fn f32_view<'a, E: Float>(data: &'a [E], l: &Layout) -> super::sgemm::View<'a> {
    assert_eq!(TypeId::of::<E>(), TypeId::of::<f32>(), "an f32 operand");
    // SAFETY: `E` is f32 (same `TypeId`): the same slice at its own type.
    let data = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<f32>(), data.len()) };
    super::sgemm::View {
        data,
        off: l.offset,
        rs: l.strides[0],
        cs: l.strides[1],
    }
}

/// `a @ b (+ bias)` by `packed.sgemm` into a new row-major `[m, n]`
/// vector, returned at type `E` (which is f32).
#[cfg(target_arch = "x86_64")]
fn packed_product<E: Float>(
    packed: &super::sgemm::PackedB,
    m: usize,
    a: super::sgemm::View<'_>,
    bias: Option<&[f32]>,
) -> Vec<E> {
    assert_eq!(TypeId::of::<E>(), TypeId::of::<f32>(), "an f32 product");
    let len = m * packed.n();
    let mut out: Vec<f32> = Vec::with_capacity(len);
    packed.sgemm(&mut out.spare_capacity_mut()[..len], m, a, bias, true);
    // SAFETY: `sgemm` wrote all `m * n` elements.
    unsafe { out.set_len(len) };
    let mut out = std::mem::ManuallyDrop::new(out);
    // SAFETY: `E` is f32 (checked above): the same allocation at its own type.
    unsafe { Vec::from_raw_parts(out.as_mut_ptr().cast::<E>(), out.len(), out.capacity()) }
}

/// Checks that `a` and `b` are `[batch.., m, k]` and `[batch.., k, n]`
/// views inside storages of `a.0` and `b.0` elements.
fn check_operands((alen, la): (usize, &Layout), (blen, lb): (usize, &Layout)) -> Result<()> {
    let r = la.rank();
    if r < 2
        || lb.rank() != r
        || la.dims[..r - 2] != lb.dims[..r - 2]
        || la.dims[r - 1] != lb.dims[r - 2]
    {
        return Err(Error::invalid(
            "matmul",
            format!(
                "operands {} and {} are not [batch.., m, k] and [batch.., k, n]",
                fmt_dims(&la.dims),
                fmt_dims(&lb.dims)
            ),
        ));
    }
    if la.span() > alen || lb.span() > blen {
        return Err(Error::invalid(
            "matmul",
            format!(
                "a view reaches past its storage ({} of {}, {} of {})",
                la.span(),
                alen,
                lb.span(),
                blen
            ),
        ));
    }
    Ok(())
}

impl<E: Float> MatmulKernel<E> for Cpu {
    fn pack_rhs(&self, b: &Vec<E>, lb: &Layout) -> Result<Option<PackedRhs>> {
        #[cfg(target_arch = "x86_64")]
        if TypeId::of::<E>() == TypeId::of::<f32>() && super::sgemm::available() && lb.rank() == 2 {
            let (k, n) = (lb.dims[0], lb.dims[1]);
            if k == 0 || n == 0 || lb.span() > b.len() {
                return Ok(None);
            }
            let packed = super::sgemm::PackedB::new(f32_view(b, lb), k, n, crate::par::threads());
            return Ok(Some(PackedRhs {
                k,
                n,
                data: std::sync::Arc::new(packed),
            }));
        }
        let _ = (b, lb);
        Ok(None)
    }

    fn matmul_packed(&self, a: &Vec<E>, la: &Layout, b: &PackedRhs) -> Result<Option<Vec<E>>> {
        #[cfg(target_arch = "x86_64")]
        if TypeId::of::<E>() == TypeId::of::<f32>() && la.rank() == 2 && la.dims[1] == b.k {
            let Some(packed) = b.data.downcast_ref::<super::sgemm::PackedB>() else {
                return Ok(None);
            };
            if la.span() > a.len() {
                return Ok(None);
            }
            let m = la.dims[0];
            let view = f32_view(a, la);
            return Ok(Some(packed_product::<E>(packed, m, view, None)));
        }
        let _ = (a, la, b);
        Ok(None)
    }

    fn linear_packed(
        &self,
        (x, lx): (&Vec<E>, &Layout),
        w: &PackedRhs,
        bias: Option<(&Vec<E>, &Layout)>,
    ) -> Result<Option<Vec<E>>> {
        #[cfg(target_arch = "x86_64")]
        if TypeId::of::<E>() == TypeId::of::<f32>() && lx.rank() == 2 && lx.dims[1] == w.k {
            let Some(packed) = w.data.downcast_ref::<super::sgemm::PackedB>() else {
                return Ok(None);
            };
            let m = lx.dims[0];
            if lx.span() > x.len() || !packed.as_unpacked(m) {
                return Ok(None);
            }
            let bias = match bias {
                Some((b, lb)) if lb.dims[..] == [w.n] => Some(dense_acc(b, lb)),
                Some(_) => return Ok(None),
                None => None,
            };
            // SAFETY: `E` is f32, its own accumulation type: the same slice.
            let bias: Option<&[f32]> = bias
                .as_deref()
                .map(|b| unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<f32>(), b.len()) });
            return Ok(Some(packed_product::<E>(packed, m, f32_view(x, lx), bias)));
        }
        let _ = (x, lx, w, bias);
        Ok(None)
    }

    fn matmul(&self, a: &Vec<E>, la: &Layout, b: &Vec<E>, lb: &Layout) -> Result<Vec<E>> {
        check_operands((a.len(), la), (b.len(), lb))?;
        let r = la.rank();
        let (m, k, n) = (la.dims[r - 2], la.dims[r - 1], lb.dims[r - 1]);
        let numel = la.dims[..r - 2].iter().product::<usize>() * m * n;
        if numel == 0 || k == 0 {
            return Ok(vec![E::default(); numel]);
        }
        if let (Some(a), Some(b)) = (same_ref::<E, E::Acc>(a), same_ref::<E, E::Acc>(b)) {
            // f32, f64: gemm reads the views in place.
            return Ok(from_acc_vec::<E>(matmul_acc(a, la, b, lb)));
        }
        #[cfg(target_arch = "x86_64")]
        if let (Some(a), Some(b), true) = (
            same_ref::<E, bf16>(a),
            same_ref::<E, bf16>(b),
            super::bgemm::available(),
        ) {
            // bf16 on AMX tiles, read in place; the f32 sums rounded once,
            // as each block is written.
            let out = batched::<bf16, bf16>(a, la, b, lb, &|o, m, n, k, l, r, par| {
                let par = !matches!(par, Parallelism::None);
                super::bgemm::bgemm(o, m, n, k, l, r, None, false, par);
            });
            return Ok(same_vec::<bf16, E>(out).unwrap_or_else(|_| unreachable!("E is bf16")));
        }
        // f16, bf16: widen once to f32 (O(size) against O(m n k) products).
        let (ca, cla) = compact_acc(a, la);
        let (cb, clb) = compact_acc(b, lb);
        Ok(from_acc_vec::<E>(matmul_acc(&ca, &cla, &cb, &clb)))
    }

    fn has_matmul_low(&self, low: DType) -> bool {
        #[cfg(target_arch = "x86_64")]
        if low == DType::BF16 && TypeId::of::<E>() == TypeId::of::<f32>() {
            return super::bgemm::available();
        }
        let _ = low;
        false
    }

    fn matmul_low(
        &self,
        (a, la): (&Vec<E>, &Layout),
        (b, lb): (&Vec<E>, &Layout),
        bias: Option<(&Vec<E>, &Layout)>,
        low: DType,
        round: bool,
    ) -> Result<Vec<E>> {
        if !MatmulKernel::<E>::has_matmul_low(self, low) {
            return Err(Error::invalid(
                "matmul",
                format!("this CPU has no {low} product for {}", E::DTYPE),
            ));
        }
        check_operands((a.len(), la), (b.len(), lb))?;
        let r = la.rank();
        let bias = low_bias(bias, r, lb.dims[r - 1])?;
        low_product(a, la, b, lb, bias.as_deref(), round)
    }

    fn pack_rhs_low(&self, (b, lb): (&Vec<E>, &Layout), low: DType) -> Result<Option<PackedRhs>> {
        #[cfg(target_arch = "x86_64")]
        if MatmulKernel::<E>::has_matmul_low(self, low) && lb.rank() == 2 {
            let (k, n) = (lb.dims[0], lb.dims[1]);
            let b = same_ref::<E, f32>(b).expect("has_matmul_low holds only for f32");
            if k == 0 || n == 0 || lb.span() > b.len() {
                return Ok(None);
            }
            let packed = super::bgemm::PackedB::new(operand(b, lb), k, n);
            return Ok(Some(PackedRhs {
                k,
                n,
                data: std::sync::Arc::new(packed),
            }));
        }
        let _ = (b, lb, low);
        Ok(None)
    }

    fn linear_low_packed(
        &self,
        (x, lx): (&Vec<E>, &Layout),
        w: &PackedRhs,
        bias: Option<(&Vec<E>, &Layout)>,
        low: DType,
        round: bool,
    ) -> Result<Option<Vec<E>>> {
        #[cfg(target_arch = "x86_64")]
        if MatmulKernel::<E>::has_matmul_low(self, low) && lx.rank() == 2 && lx.dims[1] == w.k {
            let Some(packed) = w.data.downcast_ref::<super::bgemm::PackedB>() else {
                return Ok(None);
            };
            let x = same_ref::<E, f32>(x).expect("has_matmul_low holds only for f32");
            if lx.span() > x.len() {
                return Ok(None);
            }
            let bias = low_bias(bias, 2, w.n)?;
            let m = lx.dims[0];
            let mut out = Vec::with_capacity(m * w.n);
            super::bgemm::bgemm_packed(
                &mut out.spare_capacity_mut()[..m * w.n],
                m,
                operand(x, lx),
                packed,
                bias.as_deref(),
                round,
                true,
            );
            // SAFETY: the product wrote all `m * n` values.
            unsafe { out.set_len(m * w.n) };
            return Ok(Some(
                same_vec::<f32, E>(out).unwrap_or_else(|_| unreachable!("E is f32")),
            ));
        }
        let _ = (x, lx, w, bias, low, round);
        Ok(None)
    }
}

/// A rank-2 layout's matrix as a product's operand.
#[cfg(target_arch = "x86_64")]
fn operand<'a, T>(data: &'a [T], l: &Layout) -> Operand<'a, T> {
    Operand {
        data,
        off: l.offset,
        rs: l.strides[0],
        cs: l.strides[1],
    }
}

/// A low-precision product's bias (`[n]`, only for rank-2 operands) as f32
/// rounded to bf16, as autocast adds it.
fn low_bias<E: Float>(
    bias: Option<(&Vec<E>, &Layout)>,
    rank: usize,
    n: usize,
) -> Result<Option<Vec<f32>>> {
    match bias {
        Some((v, lv)) if rank == 2 && lv.dims[..] == [n] && lv.span() <= v.len() => {
            let v = same_ref::<E, f32>(v).expect("has_matmul_low holds only for f32");
            let mut out = vec![0f32; n];
            fill_strided(&mut out, lv, |o| crate::cast::round_f32(v[o]));
            Ok(Some(out))
        }
        Some((_, lv)) => Err(Error::invalid(
            "linear",
            format!(
                "a bias of {} for a product of {} columns",
                fmt_dims(&lv.dims),
                n
            ),
        )),
        None => Ok(None),
    }
}

/// Autocast's bf16 product of f32 operands on AMX tiles (see
/// [`MatmulKernel::matmul_low`]); the layouts are checked.
#[cfg(target_arch = "x86_64")]
fn low_product<E: Float>(
    a: &Vec<E>,
    la: &Layout,
    b: &Vec<E>,
    lb: &Layout,
    bias: Option<&[f32]>,
    round: bool,
) -> Result<Vec<E>> {
    let (Some(a), Some(b)) = (same_ref::<E, f32>(a), same_ref::<E, f32>(b)) else {
        unreachable!("has_matmul_low holds only for f32");
    };
    let sums = batched(a, la, b, lb, &|o, m, n, k, l, r, par| {
        let par = !matches!(par, Parallelism::None);
        super::bgemm::bgemm(o, m, n, k, l, r, bias, round, par);
    });
    Ok(same_vec::<f32, E>(sums).unwrap_or_else(|_| unreachable!("E is f32")))
}

#[cfg(not(target_arch = "x86_64"))]
fn low_product<E: Float>(
    _: &Vec<E>,
    _: &Layout,
    _: &Vec<E>,
    _: &Layout,
    _: Option<&[f32]>,
    _: bool,
) -> Result<Vec<E>> {
    unreachable!("has_matmul_low holds only on x86_64")
}

#[cfg(test)]
mod tests {
    use super::*;
    use forma_core::{Dtype, Rng};
    use half::{bf16, f16};

    fn rand_vec(n: usize, rng: &mut Rng) -> Vec<f64> {
        (0..n).map(|_| rng.uniform() * 2.0 - 1.0).collect()
    }

    /// Storage offset of a multi-index.
    fn at(l: &Layout, idx: &[usize]) -> usize {
        l.offset
            + idx
                .iter()
                .zip(l.strides.iter())
                .map(|(i, s)| i * s)
                .sum::<usize>()
    }

    /// Row-major multi-index of a linear index.
    fn unravel(mut lin: usize, dims: &[usize]) -> Vec<usize> {
        let mut idx = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            idx[d] = lin % dims[d];
            lin /= dims[d];
        }
        idx
    }

    /// The product by definition, in f64.
    fn naive(a: &[f64], la: &Layout, b: &[f64], lb: &Layout) -> Vec<f64> {
        let r = la.rank();
        let (k, n) = (la.dims[r - 1], lb.dims[r - 1]);
        let mut out_dims = la.dims.to_vec();
        out_dims[r - 1] = n;
        let numel: usize = out_dims.iter().product();
        (0..numel)
            .map(|lin| {
                let mut idx = unravel(lin, &out_dims);
                let (i, j) = (idx[r - 2], idx[r - 1]);
                (0..k)
                    .map(|p| {
                        idx[r - 2] = i;
                        idx[r - 1] = p;
                        let x = a[at(la, &idx)];
                        idx[r - 2] = p;
                        idx[r - 1] = j;
                        x * b[at(lb, &idx)]
                    })
                    .sum()
            })
            .collect()
    }

    /// Runs the kernel in dtype `E` on `a`, `b` (rounded to `E`) and compares
    /// with the f64 product of the rounded values.
    fn check<E: Float>(a: &[f64], la: &Layout, b: &[f64], lb: &Layout, rtol: f64) {
        let ae: Vec<E> = a.iter().map(|&x| <E as Dtype>::from_f64(x)).collect();
        let be: Vec<E> = b.iter().map(|&x| <E as Dtype>::from_f64(x)).collect();
        let ar: Vec<f64> = ae.iter().map(|&x| Dtype::to_f64(x)).collect();
        let br: Vec<f64> = be.iter().map(|&x| Dtype::to_f64(x)).collect();
        let want = naive(&ar, la, &br, lb);
        let got = Cpu.matmul(&ae, la, &be, lb).unwrap();
        assert_eq!(got.len(), want.len());
        let k = la.dims[la.rank() - 1] as f64;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let g = Dtype::to_f64(*g);
            assert!(
                (g - w).abs() <= rtol * (w.abs() + k.sqrt()),
                "{:?} @ {:?} element {i}: got {g}, want {w}",
                la.dims,
                lb.dims
            );
        }
    }

    fn check_all(a: &[f64], la: &Layout, b: &[f64], lb: &Layout) {
        check::<f32>(a, la, b, lb, 1e-5);
        check::<f64>(a, la, b, lb, 1e-12);
        check::<f16>(a, la, b, lb, 2e-3);
        check::<bf16>(a, la, b, lb, 1e-2);
    }

    #[test]
    fn contiguous_batched() {
        let mut rng = Rng::seed_from(1);
        let (la, lb) = (
            Layout::contiguous(&[2, 3, 4]),
            Layout::contiguous(&[2, 4, 5]),
        );
        let a = rand_vec(la.numel(), &mut rng);
        let b = rand_vec(lb.numel(), &mut rng);
        check_all(&a, &la, &b, &lb);
    }

    #[test]
    fn transposed_views() {
        let mut rng = Rng::seed_from(2);
        // a is stored [k, m] and b [n, k]; batch dims transposed too.
        let la = Layout::contiguous(&[3, 2, 7, 6]).permute(&[1, 0, 3, 2]);
        let lb = Layout::contiguous(&[2, 5, 3, 7]).permute(&[0, 2, 3, 1]);
        assert_eq!(
            (&*la.dims, &*lb.dims),
            (&[2, 3, 6, 7][..], &[2, 3, 7, 5][..])
        );
        let a = rand_vec(la.numel(), &mut rng);
        let b = rand_vec(lb.numel(), &mut rng);
        check_all(&a, &la, &b, &lb);
        // Only one side transposed, 2-d.
        let la = Layout::contiguous(&[9, 11]).swap(0, 1);
        let lb = Layout::contiguous(&[9, 4]);
        let a = rand_vec(99, &mut rng);
        let b = rand_vec(36, &mut rng);
        check_all(&a, &la, &b, &lb);
    }

    #[test]
    fn narrowed_views_with_offsets() {
        let mut rng = Rng::seed_from(3);
        let la = Layout::contiguous(&[4, 10, 12])
            .narrow(0, 1, 2)
            .narrow(1, 3, 5)
            .narrow(2, 2, 7);
        let lb = Layout::contiguous(&[3, 9, 8])
            .narrow(0, 1, 2)
            .narrow(1, 1, 7)
            .slice_step(2, 0, 4, 2);
        let a = rand_vec(480, &mut rng);
        let b = rand_vec(216, &mut rng);
        check_all(&a, &la, &b, &lb);
    }

    #[test]
    fn broadcast_batch() {
        let mut rng = Rng::seed_from(4);
        // b broadcast over the batch, a folds: one tall product.
        let la = Layout::contiguous(&[2, 3, 4, 5]);
        let lb = Layout::contiguous(&[5, 6]).broadcast_to(&[2, 3, 5, 6]);
        let a = rand_vec(la.numel(), &mut rng);
        let b = rand_vec(30, &mut rng);
        check_all(&a, &la, &b, &lb);
        // b broadcast, a transposed (does not fold): one product per matrix.
        let la = Layout::contiguous(&[3, 5, 4]).swap(1, 2);
        let lb = Layout::contiguous(&[1, 5, 6]).broadcast_to(&[3, 5, 6]);
        let a = rand_vec(60, &mut rng);
        check_all(&a, &la, &b, &lb);
        // a broadcast over part of the batch, b not.
        let la = Layout::contiguous(&[3, 1, 4, 5]).broadcast_to(&[3, 2, 4, 5]);
        let lb = Layout::contiguous(&[3, 2, 5, 6]);
        let a = rand_vec(60, &mut rng);
        let b = rand_vec(lb.numel(), &mut rng);
        check_all(&a, &la, &b, &lb);
        // Both broadcast along different dims.
        let la = Layout::contiguous(&[1, 2, 4, 5]).broadcast_to(&[3, 2, 4, 5]);
        let lb = Layout::contiguous(&[3, 1, 5, 6]).broadcast_to(&[3, 2, 5, 6]);
        let a = rand_vec(40, &mut rng);
        let b = rand_vec(90, &mut rng);
        check_all(&a, &la, &b, &lb);
    }

    #[test]
    fn broadcast_inside_the_matrix() {
        let mut rng = Rng::seed_from(5);
        // Every row of a is the same vector; every column of b the same.
        let la = Layout::contiguous(&[1, 6]).broadcast_to(&[4, 6]);
        let lb = Layout::contiguous(&[6, 1]).broadcast_to(&[6, 3]);
        let a = rand_vec(6, &mut rng);
        let b = rand_vec(6, &mut rng);
        check_all(&a, &la, &b, &lb);
    }

    #[test]
    fn vector_shapes() {
        let mut rng = Rng::seed_from(6);
        // [k] @ [k, n], [m, k] @ [k] and [k] @ [k] as the core promotes them.
        let v = Layout::contiguous(&[7]);
        let mat = Layout::contiguous(&[7, 5]);
        let x = rand_vec(7, &mut rng);
        let w = rand_vec(35, &mut rng);
        check_all(&x, &v.insert_axis(0), &w, &mat);
        let mat = Layout::contiguous(&[5, 7]);
        check_all(&w, &mat, &x, &v.insert_axis(1));
        let y = rand_vec(7, &mut rng);
        check_all(&x, &v.insert_axis(0), &y, &v.insert_axis(1));
        // Outer product (k = 1) and a batched matrix-vector product.
        check_all(&x, &v.insert_axis(1), &y, &v.insert_axis(0));
        let la = Layout::contiguous(&[3, 4, 7]);
        let lb = Layout::contiguous(&[7, 1]).broadcast_to(&[3, 7, 1]);
        let a = rand_vec(84, &mut rng);
        check_all(&a, &la, &x, &lb);
        // A strided vector (every other element).
        let lv = Layout::contiguous(&[14])
            .slice_step(0, 1, 7, 2)
            .insert_axis(1);
        let xs = rand_vec(14, &mut rng);
        check_all(&w, &mat, &xs, &lv);
    }

    #[test]
    fn empty_and_k_zero() {
        let la = Layout::contiguous(&[2, 3, 0]);
        let lb = Layout::contiguous(&[2, 0, 4]);
        let out = Cpu
            .matmul(&Vec::<f32>::new(), &la, &Vec::new(), &lb)
            .unwrap();
        assert_eq!(out, vec![0.0; 24]);
        let out = Cpu
            .matmul(&Vec::<bf16>::new(), &la, &Vec::new(), &lb)
            .unwrap();
        assert_eq!(out, vec![bf16::ZERO; 24]);
        let la = Layout::contiguous(&[0, 3]);
        let lb = Layout::contiguous(&[3, 4]);
        let out = Cpu
            .matmul(&Vec::<f64>::new(), &la, &vec![1.0; 12], &lb)
            .unwrap();
        assert!(out.is_empty());
        let la = Layout::contiguous(&[0, 2, 3]);
        let lb = Layout::contiguous(&[0, 3, 4]);
        let out = Cpu
            .matmul(&Vec::<f16>::new(), &la, &Vec::new(), &lb)
            .unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn larger_products() {
        let mut rng = Rng::seed_from(7);
        // Big enough for gemm's blocked, packed and threaded paths.
        let la = Layout::contiguous(&[130, 150]);
        let lb = Layout::contiguous(&[170, 150]).swap(0, 1);
        let a = rand_vec(la.numel(), &mut rng);
        let b = rand_vec(lb.numel(), &mut rng);
        check::<f32>(&a, &la, &b, &lb, 1e-5);
        check::<f64>(&a, &la, &b, &lb, 1e-12);
        check::<bf16>(&a, &la, &b, &lb, 1e-2);
        // Many small matrices: one task per group of matrices.
        let la = Layout::contiguous(&[400, 5, 6]);
        let lb = Layout::contiguous(&[400, 7, 6]).swap(1, 2);
        assert!(rayon::current_num_threads() == 1 || batch_parallel(400, 5 * 6 * 7));
        let a = rand_vec(la.numel(), &mut rng);
        let b = rand_vec(lb.numel(), &mut rng);
        check_all(&a, &la, &b, &lb);
        // A few big matrices: gemm's own threading per matrix.
        let la = Layout::contiguous(&[3, 140, 120]);
        let lb = Layout::contiguous(&[3, 120, 130]);
        let a = rand_vec(la.numel(), &mut rng);
        let b = rand_vec(lb.numel(), &mut rng);
        check::<f32>(&a, &la, &b, &lb, 1e-5);
    }

    #[test]
    fn bad_layouts_are_errors() {
        let a = vec![0.0f32; 6];
        let la = Layout::contiguous(&[2, 3]);
        assert!(Cpu.matmul(&a, &la, &a, &la).is_err());
        let lb = Layout::contiguous(&[3, 4]);
        assert!(
            Cpu.matmul(&a, &la, &a, &lb).is_err(),
            "b's view exceeds its storage"
        );
    }

    #[test]
    fn helpers() {
        assert_eq!(fold_stride(&[2, 3, 4], &[12, 4, 1]), Some(1));
        assert_eq!(fold_stride(&[2, 1, 4], &[4, 99, 1]), Some(1));
        assert_eq!(fold_stride(&[2, 3], &[1, 2]), None);
        assert_eq!(fold_stride(&[1, 1], &[5, 7]), Some(0));
        assert_eq!(fold_stride(&[2, 3], &[0, 5]), None);
        assert_eq!(same_vec::<f32, f32>(vec![1.0]), Ok(vec![1.0]));
        assert_eq!(same_vec::<f32, f64>(vec![1.0]), Err(vec![1.0]));
    }

    /// Throughput of a 512^3 f32 product (run with `--release --ignored
    /// --nocapture`); prints, asserts nothing about speed.
    #[test]
    #[ignore]
    fn gflops_512() {
        let n = 512;
        let mut rng = Rng::seed_from(8);
        let a: Vec<f32> = (0..n * n).map(|_| rng.uniform() as f32).collect();
        let b: Vec<f32> = (0..n * n).map(|_| rng.uniform() as f32).collect();
        let l = Layout::contiguous(&[n, n]);
        for (name, lb) in [("nn", l), ("nt", l.swap(0, 1))] {
            let mut times = Vec::new();
            for _ in 0..3 {
                std::hint::black_box(Cpu.matmul(&a, &l, &b, &lb).unwrap());
            }
            for _ in 0..21 {
                let t = std::time::Instant::now();
                std::hint::black_box(Cpu.matmul(&a, &l, &b, &lb).unwrap());
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            let t = times[times.len() / 2];
            println!(
                "matmul f32 512^3 {name}: {:.1} GFLOP/s ({:.3} ms, {} threads)",
                2.0 * (n as f64).powi(3) / t / 1e9,
                t * 1e3,
                rayon::current_num_threads()
            );
        }
    }
}
