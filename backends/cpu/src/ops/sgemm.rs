//! Forma's own f32 matrix product for x86_64 with AVX2 and FMA, or AVX-512.
//!
//! The classic blocked design (Goto / BLIS): the right operand is packed into
//! `kc x NR` column panels, the left operand is read in `MR x kc` row panels
//! (packed into a contiguous buffer when it is reused across many column
//! panels or strided badly, read in place otherwise), and a register-blocked
//! microkernel keeps its `MR x NR` accumulators in vector registers: 6x16 in
//! `ymm` registers with AVX2 ([`Avx2`]), 8x32 in `zmm` registers with
//! AVX-512 ([`Avx512`]), picked at run time. Only the microkernel and the
//! block sizes differ between the two ([`Kernel`]); packing, blocking and
//! threading are written once.
//! Packing reads any non-negative strides (8x8 register transposes for the
//! transposed views of linear layers), so transposed and broadcast views are
//! never copied whole, and pads partial panels with zeros so the microkernel
//! has no edge cases; partial output tiles go through a small temporary.
//! Shapes that tile much better the other way round (m = 16, narrow outputs)
//! are computed as `dst^T = b^T @ a^T`.
//!
//! Block sizes follow the cache hierarchy, in one of two loop orders per
//! kernel ([`Kernel::A_OUTER`]). In the order both x86 kernels use, an
//! `MR x kc` panel of the left operand (12 KiB) stays in L1 while the
//! microkernel walks along a `kc x nc` block of the right operand, in L2:
//! L1 is left for the streamed panel and the output's lines; the depth
//! blocks are then the outer loop, so each block of the left operand (up
//! to 1024 or 2040 rows) is packed once for all the column blocks (or, on
//! the AVX-512 kernel, read in place when its rows are contiguous). In the
//! other order (the narrow kernel's, and any product whose left operand
//! is read in place), a `kc x NR` panel of the right operand stays in L1
//! while the microkernel walks down the rows of an `mc x kc` block of the
//! left operand, in L2. A deep `kc` cuts the read-modify-write passes over
//! the output.
//!
//! Threading: a product with enough work is cut into disjoint row (or
//! column) ranges of the output, one per thread. A mid-size product, or one
//! whose cut side is long for the thread count, has each range pack its own
//! blocks of both operands into thread-local buffers reused from call to
//! call (no serial step before the split; the blocks stay in L2). Otherwise
//! the operand every range needs whole is packed once and shared (in
//! parallel, before the ranges start). Either way the ranges run on
//! `crate::par`'s threads, the caller's among them.
//!
//! Results are deterministic (a fixed summation order per element: depth
//! blocks in order, one FMA chain per block) whatever the thread count, on
//! a given kernel (the two kernels' depth blocks differ).

use crate::simd::{has_avx2, has_avx512};
use std::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_permute2f128_ps, _mm256_set1_ps,
    _mm256_setzero_ps, _mm256_shuffle_ps, _mm256_storeu_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps,
    _mm_prefetch, _MM_HINT_T0,
};
use std::cell::RefCell;
use std::mem::MaybeUninit;

/// One microkernel and the block sizes that suit it: the ISA-specific part
/// of the product. Everything else (packing, blocking, threading) is
/// written once over these constants.
pub(crate) trait Kernel {
    /// Rows of the microkernel's output tile.
    const MR: usize;
    /// Columns of the microkernel's output tile.
    const NR: usize;
    /// Depth of one packed block (the reduction dimension): a `KC x NR`
    /// panel of the right operand stays in L1.
    const KC: usize;
    /// Rows of one block of the left operand (kept in L2).
    const MC: usize;
    /// Rows of one block of the left operand when the left panels are the
    /// outer loop ([`Kernel::A_OUTER`]): the block is packed once for every
    /// column block, so it may be larger than L2 (its panels are read once
    /// per right block, then from L1).
    const MC_OUTER: usize;
    /// Columns of one packed block of the right operand.
    const NC: usize;
    /// The order of the two loops around the microkernel. When true, one
    /// `MR x KC` panel of the (packed) left operand stays in L1 while the
    /// tiles walk along every column panel of the `KC x NC` right block,
    /// which is streamed from L2. When false, one `KC x NR` right panel
    /// stays in L1 while the tiles walk down the rows of the `MC x KC` left
    /// block, streamed from L2.
    const A_OUTER: bool;
    /// Whether, in the [`Kernel::A_OUTER`] order, a left operand whose
    /// rows are contiguous is read in place rather than packed (see
    /// `block`).
    const A_IN_PLACE: bool;

    /// Whether this CPU runs the kernel (detected at run time).
    fn supported() -> bool;

    /// The microkernel: `c[i][j] (+)= sum_p a[i * ars + p * aks] * b[p * NR + j]`
    /// for `i < MR`, `j < NR`, `p < kc`; `c` is overwritten unless
    /// `accumulate`, and `bias` is added last (after the old `c`).
    ///
    /// # Safety
    /// The CPU supports the kernel's ISA; `a` is valid for reads at every
    /// `i * ars + p * aks`; `b` is 64-byte aligned and valid for `kc * NR`
    /// reads; `c` is valid for reads and writes at every `i * ldc + j` and
    /// those elements are not accessed by anything else during the call;
    /// `bias` is valid for reads of its `MR` (rows) or `NR` (columns) values.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(
        kc: usize,
        a: *const f32,
        ars: usize,
        aks: usize,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        bias: TileBias,
    );

    /// [`Kernel::run`] on `panels` consecutive column panels of a packed
    /// right block with one left panel (packed, or read in place), in one
    /// call: tile `p` reads its right panel from `b + p * kc * NR`, writes
    /// `c + p * NR` and adds a column bias from `p * NR` on.
    ///
    /// # Safety
    /// As for [`Kernel::run`] on each of the `panels` tiles.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_panels(
        kc: usize,
        a: *const f32,
        ars: usize,
        aks: usize,
        b: *const f32,
        panels: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        bias: TileBias,
    );
}

/// A bias added to every element of a product after its last term: one
/// value per row or per column of the product computed (the columns of
/// `x @ w.t()`, which are rows once computed transposed).
#[derive(Clone, Copy)]
enum Bias<'a> {
    /// No bias.
    None,
    /// `v[i]` added to row `i`.
    Rows(&'a [f32]),
    /// `v[j]` added to column `j`.
    Cols(&'a [f32]),
}

impl<'a> Bias<'a> {
    /// The bias of the transposed product.
    fn transposed(self) -> Self {
        match self {
            Bias::None => Bias::None,
            Bias::Rows(v) => Bias::Cols(v),
            Bias::Cols(v) => Bias::Rows(v),
        }
    }

    /// The bias of the sub-matrix from row `i` and column `j`.
    fn at(self, i: usize, j: usize) -> Self {
        match self {
            Bias::None => Bias::None,
            Bias::Rows(v) => Bias::Rows(&v[i..]),
            Bias::Cols(v) => Bias::Cols(&v[j..]),
        }
    }

    /// The value added to element `(i, j)`.
    fn get(self, i: usize, j: usize) -> f32 {
        match self {
            Bias::None => 0.0,
            Bias::Rows(v) => v[i],
            Bias::Cols(v) => v[j],
        }
    }

    /// As a [`Kernel::run`] argument (the caller guarantees its extent).
    fn tile(self) -> TileBias {
        match self {
            Bias::None => TileBias::None,
            Bias::Rows(v) => TileBias::Rows(v.as_ptr()),
            Bias::Cols(v) => TileBias::Cols(v.as_ptr()),
        }
    }
}

/// A microkernel's [`Bias`]: a pointer to the tile's first row or column
/// value.
#[derive(Clone, Copy)]
pub(crate) enum TileBias {
    /// No bias.
    None,
    /// `p[i]` added to row `i` of the tile.
    Rows(*const f32),
    /// `p[j]` added to column `j` of the tile.
    Cols(*const f32),
}

/// Largest `MR * NR` of any kernel (the size of an edge tile's temporary).
const MAX_TILE: usize = 256;

/// Multiply-adds below which a product stays on one thread.
const PAR_WORK: usize = 1 << 20;
/// Multiply-adds below which a parallel product is split into ranges that
/// pack their own operands ([`split`]); from here on, unless the cut side is
/// long for the thread count ([`SPLIT_LEN`]), the shared path. Measured on
/// a 2-core AVX2 machine: the split is 1.2-1.5x faster at 128^3 and 256^3.
const SPLIT_WORK: usize = 1 << 26;
/// Rows (or columns, the side cut) per thread from which a large product
/// still takes [`split`]. Each of its ranges packs the operand every range
/// needs in L2-sized blocks of its own: `threads` copies of the packing
/// work, against the shared path's one copy packed whole, which lives in L3
/// and is read from there. The copies cost a fraction `threads / len` of a
/// range's work, small from here on. Measured with 2 threads, where the
/// split is 3 to 10% faster than the shared path from 512^3 to 2048^3 (and
/// on the encoder's 1024-row products); more threads were not measured.
const SPLIT_LEN: usize = 128;
/// Elements above which an operand is not packed whole to be shared (64 MiB).
const MAX_SHARED: usize = 1 << 24;
/// Elements below which a shared operand is packed on one thread.
const PAR_PACK: usize = 1 << 17;

/// Whether this CPU runs the product (AVX2 and FMA detected at run time).
pub(crate) fn available() -> bool {
    has_avx2()
}

/// A strided f32 matrix: element `(i, j)` is `data[off + i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View<'a> {
    /// The storage the matrix lives in.
    pub data: &'a [f32],
    /// Index of element `(0, 0)`.
    pub off: usize,
    /// Row stride in elements.
    pub rs: usize,
    /// Column stride in elements.
    pub cs: usize,
}

impl View<'_> {
    /// Asserts that every element of a `rows x cols` matrix (both non-zero)
    /// lies inside `data`.
    pub(crate) fn check(&self, rows: usize, cols: usize) {
        let last = (rows - 1)
            .checked_mul(self.rs)
            .and_then(|r| r.checked_add((cols - 1).checked_mul(self.cs)?))
            .and_then(|r| r.checked_add(self.off));
        assert!(
            last.is_some_and(|l| l < self.data.len()),
            "sgemm operand {rows}x{cols} (strides {}, {}, offset {}) outside a storage of {}",
            self.rs,
            self.cs,
            self.off,
            self.data.len()
        );
    }

    /// The transpose.
    fn transposed(self) -> Self {
        View {
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// The sub-matrix starting at `(i, j)`.
    fn at(&self, i: usize, j: usize) -> Self {
        View {
            off: self.off + i * self.rs + j * self.cs,
            ..*self
        }
    }
}

/// The output: element `(i, j)` at `ptr + i * rs + j * cs` (`cs` is 1, or
/// `rs` is 1 when the product is computed transposed), shared between tasks
/// that each write a disjoint set of its elements.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    rs: usize,
    cs: usize,
}

impl Out {
    /// The same matrix seen from `elems` elements further.
    ///
    /// # Safety
    /// The result must stay inside the allocation `ptr` points into.
    unsafe fn shifted(self, elems: usize) -> Out {
        Out {
            // SAFETY: the caller keeps the result in bounds.
            ptr: unsafe { self.ptr.add(elems) },
            ..self
        }
    }
}

// SAFETY: `Out` is only a base pointer; the tasks it is sent to write
// disjoint elements (distinct row or column ranges, see `sgemm_with` and
// `split`), and the exclusive borrow it was made from outlives them (every
// parallel loop returns before `sgemm_with` does).
unsafe impl Send for Out {}
// SAFETY: as for `Send`: shared copies never touch the same element.
unsafe impl Sync for Out {}

/// `dst = a @ b` for an `m x k` `a` and a `k x n` `b`; `dst` is row-major
/// `m x n` and is written in full (zeros when `k == 0`), never read before
/// it is written, so it may be uninitialised. `parallel` lets a large
/// product use several threads (`crate::par`). Thin products whose left rows and right
/// columns are contiguous (`x @ w.t()` for a few rows of `x`) are computed
/// as dot products (`super::sdot`) instead of packed blocks, and one row of
/// `a` reads `b` in place too (`super::srow`).
///
/// With a `bias` (`n` values), `bias[j]` is added to column `j` of the
/// product once all of its terms are summed: the same bits as adding it
/// afterwards, without another pass over `dst` (`addmm`, a linear layer).
///
/// # Panics
/// If the CPU lacks AVX2 or FMA, if `dst` is not `m * n` long, if `bias` is
/// not `n` long or if an operand does not fit its storage.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm(
    dst: &mut [MaybeUninit<f32>],
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    bias: Option<&[f32]>,
    parallel: bool,
) {
    if let Some(v) = bias {
        assert_eq!(v.len(), n, "sgemm bias length");
    }
    if super::sdot::fits(m, n, k, &a, &b) {
        super::sdot::sdot(dst, m, n, k, a, b, bias, parallel);
        return;
    }
    if super::srow::fits(m, n, k, &a, &b) {
        super::srow::srow(dst, n, k, a, b, bias, parallel);
        return;
    }
    let bias = bias.map_or(Bias::None, Bias::Cols);
    if has_avx512() && m.min(n) <= Avx512Narrow::NR && (n <= m || b.rs == 1) {
        // A narrow output: its narrow side becomes the tiles' 16 columns,
        // and the long operand is read in place as the tiles' rows (a
        // weight `w` of `x @ w.t()` is not packed, where the 32-column
        // kernel would either pack all of it or pad 16 columns to 32).
        let limits = Limits {
            transpose: m < n,
            ..Limits::DEFAULT
        };
        sgemm_with::<Avx512Narrow>(dst, m, n, k, a, b, bias, parallel, limits);
    } else if has_avx512() {
        sgemm_with::<Avx512>(dst, m, n, k, a, b, bias, parallel, Limits::DEFAULT);
    } else {
        sgemm_with::<Avx2>(dst, m, n, k, a, b, bias, parallel, Limits::DEFAULT);
    }
}

/// A right operand packed once for many products with it (a recurrent
/// layer's weight, read at every time step), as [`Shared::B`] lays it out
/// for the kernel this CPU runs. Its columns are cut into one part per
/// thread, each packed on its own, so the parts run in parallel without
/// cutting a packed panel.
pub(crate) struct PackedB {
    k: usize,
    n: usize,
    /// Whether the parts are packed for [`Avx512`] (else [`Avx2`]).
    avx512: bool,
    /// Per part: its first column, its columns, and its packed copy (a
    /// buffer and the offset of the 64-byte aligned copy in it).
    parts: Vec<(usize, usize, Vec<f32>, usize)>,
}

impl PackedB {
    /// Packs `b` (`k x n`, both non-zero) in `parts` column ranges.
    ///
    /// # Panics
    /// If the CPU lacks AVX2 or FMA, or `b` does not fit its storage.
    pub(crate) fn new(b: View<'_>, k: usize, n: usize, parts: usize) -> Self {
        assert!(available(), "sgemm's kernel is not supported by this CPU");
        b.check(k, n);
        if has_avx512() {
            Self::with::<Avx512>(b, k, n, parts, true)
        } else {
            Self::with::<Avx2>(b, k, n, parts, false)
        }
    }

    fn with<K: Kernel>(b: View<'_>, k: usize, n: usize, parts: usize, avx512: bool) -> Self {
        let parts = parts.clamp(1, n.div_ceil(K::NR));
        let parts = (0..parts)
            .map(|i| {
                let (s, l) = part(i, parts, n, K::NR);
                let len = k * l.div_ceil(K::NR) * K::NR;
                let mut buf = vec![0.0f32; len + 16];
                let skip = buf.as_ptr().align_offset(64);
                pack_b_all::<K>(&mut buf[skip..skip + len], b.at(0, s), k, l);
                (s, l, buf, skip)
            })
            .collect();
        PackedB {
            k,
            n,
            avx512,
            parts,
        }
    }

    /// `dst = a @ b` (row-major `m x n`, written in full) for an `m x k`
    /// `a`, plus `bias[j]` on column `j` when given (after the sum, as
    /// [`sgemm`] adds it); the parts in parallel when `parallel` and the
    /// product is large.
    ///
    /// # Panics
    /// If `dst` is not `m * n` long, `bias` not `n`, or `a` does not fit
    /// its storage.
    pub(crate) fn sgemm(
        &self,
        dst: &mut [MaybeUninit<f32>],
        m: usize,
        a: View<'_>,
        bias: Option<&[f32]>,
        parallel: bool,
    ) {
        if self.avx512 {
            self.sgemm_with::<Avx512>(dst, m, a, bias, parallel);
        } else {
            self.sgemm_with::<Avx2>(dst, m, a, bias, parallel);
        }
    }

    /// Columns of the packed operand.
    pub(crate) fn n(&self) -> usize {
        self.n
    }

    /// Whether [`sgemm`] on an unpacked `b` would pack it the way this
    /// copy is packed, so [`PackedB::sgemm`] gives its very values: not
    /// for one row or a product [`super::sdot`] takes, nor for the narrow
    /// kernel AVX-512 reads a weight in place with.
    pub(crate) fn as_unpacked(&self, m: usize) -> bool {
        m > 1 && !(self.avx512 && m.min(self.n) <= Avx512Narrow::NR)
    }

    fn sgemm_with<K: Kernel>(
        &self,
        dst: &mut [MaybeUninit<f32>],
        m: usize,
        a: View<'_>,
        bias: Option<&[f32]>,
        parallel: bool,
    ) {
        let (k, n) = (self.k, self.n);
        assert_eq!(dst.len(), m * n, "sgemm destination length");
        if let Some(v) = bias {
            assert_eq!(v.len(), n, "sgemm bias length");
        }
        if m == 0 {
            return;
        }
        a.check(m, k);
        let out = Out {
            ptr: dst.as_mut_ptr().cast::<f32>(),
            rs: n,
            cs: 1,
        };
        // `block` reads a shared right operand only through its packed copy.
        let unused = View {
            data: &[],
            off: 0,
            rs: 0,
            cs: 0,
        };
        let run = |i: usize| {
            let (s, l, buf, skip) = &self.parts[i];
            let len = k * l.div_ceil(K::NR) * K::NR;
            let packed = Shared::B(&buf[*skip..*skip + len]);
            let bias = bias.map_or(Bias::None, |v| Bias::Cols(&v[*s..*s + *l]));
            // SAFETY: part `i` owns columns `s..s + l` of the `m x n`
            // output, which `dst` holds and this call borrows exclusively;
            // `a` was checked to hold `m x k`, and the packed copy is all of
            // those columns of `b`, packed for `K` with `block`'s depth blocks.
            unsafe { block::<K>(out.shifted(*s), m, *l, k, a, unused, bias, packed) };
        };
        let work = m.saturating_mul(n).saturating_mul(k);
        if parallel && self.parts.len() > 1 && work >= PAR_WORK {
            crate::par::run(self.parts.len(), &run);
        } else {
            (0..self.parts.len()).for_each(run);
        }
    }
}

/// The thresholds that pick a parallel path (the tests change them to
/// exercise every path on small shapes).
#[derive(Clone, Copy, Debug)]
struct Limits {
    /// Multiply-adds below which a parallel product takes [`split`].
    split_work: usize,
    /// Rows (columns) of the cut side per thread from which it takes
    /// [`split`] whatever the work.
    split_len: usize,
    /// Elements above which an operand is not packed whole to be shared.
    max_shared: usize,
    /// Whether to compute `dst^T = b^T @ a^T` whatever the shape (else
    /// chosen by the padding of the tiles).
    transpose: bool,
}

impl Limits {
    const DEFAULT: Limits = Limits {
        split_work: SPLIT_WORK,
        split_len: SPLIT_LEN,
        max_shared: MAX_SHARED,
        transpose: false,
    };
}

/// [`sgemm`] with the thresholds that pick a parallel path as a parameter.
#[allow(clippy::too_many_arguments)]
fn sgemm_with<K: Kernel>(
    dst: &mut [MaybeUninit<f32>],
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    bias: Bias<'_>,
    parallel: bool,
    limits: Limits,
) {
    assert!(
        K::supported(),
        "sgemm's kernel is not supported by this CPU"
    );
    assert_eq!(dst.len(), m * n, "sgemm destination length");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for (i, row) in dst.chunks_exact_mut(n).enumerate() {
            for (j, d) in row.iter_mut().enumerate() {
                d.write(0.0 + bias.get(i, j));
            }
        }
        return;
    }
    a.check(m, k);
    b.check(k, n);
    let mut out = Out {
        ptr: dst.as_mut_ptr().cast::<f32>(),
        rs: n,
        cs: 1,
    };
    // Tiles are MR x NR; when the shape pads clearly less the other way round
    // (m = 16, a narrow output), compute `dst^T = b^T @ a^T` instead. Not for
    // small gains: a transposed output is written through a temporary.
    let padded =
        |rows: usize, cols: usize| rows.div_ceil(K::MR) * K::MR * (cols.div_ceil(K::NR) * K::NR);
    let (m, n, a, b, bias) = if limits.transpose || padded(n, m) * 10 < padded(m, n) * 9 {
        out = Out {
            rs: 1,
            cs: n,
            ..out
        };
        (n, m, b.transposed(), a.transposed(), bias.transposed())
    } else {
        (m, n, a, b, bias)
    };
    let threads = if parallel { crate::par::threads() } else { 1 };
    let work = m.saturating_mul(n).saturating_mul(k);
    if threads <= 1 || work < PAR_WORK {
        // SAFETY: `out` addresses the `m x n` elements of `dst` (or of its
        // transpose, with `m`, `n`, `a` and `b` swapped to match), borrowed
        // exclusively for this call; `a` and `b` were checked to hold their
        // `m x k` and `k x n` elements.
        unsafe { block::<K>(out, m, n, k, a, b, bias, Shared::None) };
        return;
    }
    let cut = if m >= n { m } else { n };
    if work < limits.split_work || cut >= limits.split_len.saturating_mul(threads) {
        // SAFETY: as for `block` just above.
        unsafe { split::<K>(out, m, n, k, a, b, bias, threads) };
        return;
    }
    // Cut the longer side of the output into one range of whole microkernel
    // tiles per thread, the tiles dealt out evenly. The operand every range
    // needs whole (`b` for row ranges, `a` for column ranges) is packed
    // once and shared. One range per thread rather than a few: a range's
    // blocks of the other operand are reused across all of the shared one,
    // so smaller ranges re-read the shared operand from L3 more often
    // (measured on 2 cores, before the split took those shapes: 1024^3 and
    // 1024x384x1152 5-6% faster than with four ranges per thread, 512^3
    // and 2048^3 even).
    let rows = m >= n;
    let (len, unit) = if rows { (m, K::MR) } else { (n, K::NR) };
    let tiles = len.div_ceil(unit);
    let parts = threads.min(tiles);
    let ranges: Vec<(usize, usize)> = (0..parts).map(|i| part(i, parts, len, unit)).collect();
    let packed_len = if rows {
        k * n.div_ceil(K::NR) * K::NR
    } else {
        m.div_ceil(K::MR) * K::MR * k
    };
    if packed_len > limits.max_shared {
        // Too big to keep a packed copy around: every task packs its own
        // blocks of both operands (re-packing the shared one per task).
        crate::par::run(ranges.len(), &|i| {
            let (s, l) = ranges[i];
            // SAFETY: the ranges are disjoint, so each task owns its part of
            // the output; the borrow of `dst` outlives the parallel loop and
            // the operands were checked.
            unsafe { range::<K>(out, m, n, k, a, b, bias, rows, s, l, Shared::None) };
        });
        return;
    }
    with_shared(packed_len, |packed| {
        if rows {
            pack_b_all::<K>(packed, b, k, n);
        } else {
            pack_a_all::<K>(packed, a, m, k);
        }
        let packed = &*packed;
        let shared = if rows {
            Shared::B(packed)
        } else {
            Shared::A(packed)
        };
        crate::par::run(ranges.len(), &|i| {
            let (s, l) = ranges[i];
            // SAFETY: as in the unshared case above, and `packed` is all of
            // the operand the ranges do not cut.
            unsafe { range::<K>(out, m, n, k, a, b, bias, rows, s, l, shared) };
        });
    });
}

/// A parallel product whose operands every range packs itself: the longer
/// side of the output cut into one range of whole tiles per thread (at
/// most), each computed by [`block`] packing its own blocks of both
/// operands (no serial packing step before the split). The calling thread
/// takes ranges too ([`crate::par::run`]).
///
/// The ranges split the output, never the depth, so every element is summed
/// in the same order as on one thread.
///
/// # Safety
/// As for [`block`].
unsafe fn split<K: Kernel>(
    out: Out,
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    bias: Bias<'_>,
    threads: usize,
) {
    // Rows when the right operand (which every row range packs whole) is
    // the smaller one to pack twice, else columns (every range packs `a`).
    let rows = m >= n;
    let (len, unit) = if rows { (m, K::MR) } else { (n, K::NR) };
    let tiles = len.div_ceil(unit);
    let parts = threads.min(tiles);
    let run = |i: usize| {
        let (s, l) = part(i, parts, len, unit);
        // SAFETY: the ranges are disjoint and each is claimed once, so this
        // one owns its part of the output; the caller's guarantees cover
        // the operands.
        unsafe { range::<K>(out, m, n, k, a, b, bias, rows, s, l, Shared::None) };
    };
    crate::par::run(parts, &run);
}

/// Part `i` of `parts` of a side `len` long, cut into whole tiles of
/// `unit` dealt out evenly: its start and length.
fn part(i: usize, parts: usize, len: usize, unit: usize) -> (usize, usize) {
    let tiles = len.div_ceil(unit);
    let s = i * tiles / parts * unit;
    let e = ((i + 1) * tiles / parts * unit).min(len);
    (s, e - s)
}

/// [`block`] on rows `s..s + l` of the output (`rows`) or on its columns
/// `s..s + l`, with the rows of `a` or the columns of `b` that part reads.
///
/// # Safety
/// As for [`block`] over the whole `m x n` product, with `s + l` inside the
/// cut side; that part of the output belongs to this call alone, and a
/// `shared` operand is all of the one not cut (`b` for rows, `a` for
/// columns).
#[allow(clippy::too_many_arguments)]
unsafe fn range<K: Kernel>(
    out: Out,
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    bias: Bias<'_>,
    rows: bool,
    s: usize,
    l: usize,
    shared: Shared<'_>,
) {
    // SAFETY: row (column) `s` of the output starts inside it, and the
    // caller's guarantees cover `a`'s rows (`b`'s columns) `s..s + l` and
    // all of the other operand.
    unsafe {
        let (m, n, out, a, b, bias) = if rows {
            (l, n, out.shifted(s * out.rs), a.at(s, 0), b, bias.at(s, 0))
        } else {
            (m, l, out.shifted(s * out.cs), a, b.at(0, s), bias.at(0, s))
        };
        block::<K>(out, m, n, k, a, b, bias, shared)
    }
}

thread_local! {
    /// The calling thread's buffer for an operand shared by parallel tasks.
    static SHARED: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::default());
}

/// Runs `f` on a 64-byte aligned buffer of `len` elements from this thread's
/// [`SHARED`] (a fresh one if it is already in use).
fn with_shared<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SHARED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut g) => f(g.get(len)),
        Err(_) => f(AlignedBuf::default().get(len)),
    })
}

thread_local! {
    /// Packing buffers of the calling thread: (right operand block, left
    /// operand block, one edge panel of the left operand).
    static BUFS: RefCell<(AlignedBuf, AlignedBuf, AlignedBuf)> =
        RefCell::new((AlignedBuf::default(), AlignedBuf::default(), AlignedBuf::default()));
}

/// A growable f32 buffer whose working slice starts on a 64-byte boundary
/// (so the microkernel's aligned loads from packed panels are valid).
#[derive(Default)]
struct AlignedBuf {
    v: Vec<f32>,
}

impl AlignedBuf {
    /// A 64-byte aligned slice of `len` elements (contents unspecified).
    fn get(&mut self, len: usize) -> &mut [f32] {
        let need = len + 16;
        if self.v.len() < need {
            self.v = vec![0.0; need];
        }
        let skip = self.v.as_ptr().align_offset(64);
        // A `Vec<f32>` is 4-aligned, so at most 15 elements are skipped.
        &mut self.v[skip..skip + len]
    }
}

/// Runs `f` with this thread's packing buffers (fresh ones if they are
/// already in use, which only a re-entrant call could cause).
fn with_bufs<R>(f: impl FnOnce(&mut AlignedBuf, &mut AlignedBuf, &mut AlignedBuf) -> R) -> R {
    BUFS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut g) => {
            let (bb, ab, eb) = &mut *g;
            f(bb, ab, eb)
        }
        Err(_) => f(
            &mut AlignedBuf::default(),
            &mut AlignedBuf::default(),
            &mut AlignedBuf::default(),
        ),
    })
}

/// Splits `len` into `ceil(len / max)` near-equal blocks, each a multiple of
/// `unit` except possibly the last; returns the block size.
fn balanced(len: usize, max: usize, unit: usize) -> usize {
    let blocks = len.div_ceil(max);
    len.div_ceil(blocks).div_ceil(unit) * unit
}

/// An operand packed once for every task of a parallel product: all of
/// it, in the layout `block` packs one block at a time (for each depth
/// block `pc`, its panels from offset `pc * padded width`).
#[derive(Clone, Copy)]
enum Shared<'a> {
    /// Nothing shared: `block` packs both operands itself.
    None,
    /// The whole right operand, `ceil(n / NR)` panels per depth block.
    B(&'a [f32]),
    /// The whole left operand, `ceil(m / MR)` panels per depth block.
    A(&'a [f32]),
}

/// Packs all of `b` (`k x n`) as [`Shared::B`] expects, in parallel.
fn pack_b_all<K: Kernel>(dst: &mut [f32], b: View<'_>, k: usize, n: usize) {
    pack_all::<K>(dst, k, n, K::NR, |d, pc, kc, j0| {
        pack_b::<K>(d, b.at(pc, j0), kc, K::NR.min(n - j0));
    });
}

/// Packs all of `a` (`m x k`) as [`Shared::A`] expects, in parallel.
fn pack_a_all<K: Kernel>(dst: &mut [f32], a: View<'_>, m: usize, k: usize) {
    pack_all::<K>(dst, k, m, K::MR, |d, pc, kc, i0| {
        pack_a_block::<K>(d, a.at(i0, pc), K::MR.min(m - i0), kc);
    });
}

/// Packs a whole operand whose other side is `len` long: for each depth
/// block (`pc`, `kc` deep) its panels of `unit` rows or columns, the panel
/// starting at `s` written by `panel(dst, pc, kc, s)`; in parallel when the
/// operand is large.
fn pack_all<K: Kernel>(
    dst: &mut [f32],
    k: usize,
    len: usize,
    unit: usize,
    panel: impl Fn(&mut [f32], usize, usize, usize) + Sync,
) {
    let kc_max = balanced(k, K::KC, 1);
    let padded = len.div_ceil(unit) * unit;
    let mut rest = dst;
    let mut jobs = Vec::new();
    for pc in (0..k).step_by(kc_max) {
        let kc = kc_max.min(k - pc);
        let (d, r) = rest.split_at_mut(kc * padded);
        rest = r;
        jobs.extend(
            d.chunks_mut(kc * unit)
                .enumerate()
                .map(|(p, d)| (pc, kc, p * unit, d)),
        );
    }
    let pack = |(pc, kc, s, d): (usize, usize, usize, &mut [f32])| panel(d, pc, kc, s);
    if k * len >= PAR_PACK {
        crate::par::each(jobs, pack);
    } else {
        jobs.into_iter().for_each(pack);
    }
}

/// The single-threaded blocked product `out = a @ b` (`m x k` times `k x n`).
/// With a [`Shared`] operand, `a` or `b` is only used for its shape and the
/// packed copy (of exactly this `a` or `b`) is read instead.
///
/// # Safety
/// `out` must address an `m x n` matrix (at its strides) that
/// nothing else reads or writes during the call, and `a`, `b` must hold their
/// `m x k` and `k x n` elements.
#[allow(clippy::too_many_arguments)]
unsafe fn block<K: Kernel>(
    out: Out,
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    bias: Bias<'_>,
    shared: Shared<'_>,
) {
    let kc_max = balanced(k, K::KC, 1);
    let nc_max = match shared {
        // The shared copy holds every column: one column block.
        Shared::B(_) => n.div_ceil(K::NR) * K::NR,
        _ => balanced(n, K::NC, K::NR),
    };
    // Packing the left operand pays when its block is reused across many
    // column panels, or when reading it in place would stride badly (a
    // column stride other than 1 makes each broadcast a separate line).
    let pack_a = n > 2 * K::NR || a.cs != 1 || matches!(shared, Shared::A(_));
    // The kernel's loop order (see [`Kernel::A_OUTER`]), for a packed left
    // operand and a right block no larger than the kernel's (a shared one
    // holds every column, and may not fit L2). Its left blocks are packed
    // once for every column block.
    let a_outer = K::A_OUTER && pack_a && nc_max <= K::NC;
    let mc_max = balanced(m, if a_outer { K::MC_OUTER } else { K::MC }, K::MR);
    // In that order a left panel is read from L1 across a whole right
    // block once it is there, so rows that are contiguous may as well be
    // read in place (prefetched a panel ahead) and not be copied at all:
    // measured on 2 Zen 4 cores, alternating in one process, 128^3 6%
    // faster, 256^3 4.5%, 512^3 1.7%, 64x784x512 3.7%, the encoder's
    // projections 4-5% (the whole encoder, batch 8, 4%). Not when the row
    // stride is a multiple of 4 KiB: the panel's rows then share L1 sets,
    // and 2048^3 read in place was 2-3% slower. Not on Intel either: on a
    // Xeon with AVX-512 and AMX the packed panel was faster on every
    // product measured that reads in place (2 threads, alternating runs:
    // 64x576x3136 and 64x147x12544 4-6%, 512x4608x784 1-4%,
    // 128x1152x784 2-8%, 64x784x512 4-8%; ResNet-18 b16 inference 3%):
    // the in-place panel's eight row pointers cost an address add per
    // broadcast, on the ports the FMAs need.
    let in_place_pays = K::A_IN_PLACE && !crate::simd::is_intel();
    let pack_a = pack_a
        && !(a_outer
            && in_place_pays
            && a.cs == 1
            && !a.rs.is_multiple_of(1024)
            && !matches!(shared, Shared::A(_)));
    with_bufs(|bbuf, abuf, ebuf| {
        let own_a = pack_a && !matches!(shared, Shared::A(_));
        let bbuf = bbuf.get(match shared {
            Shared::B(_) => 0,
            _ => kc_max * nc_max.div_ceil(K::NR) * K::NR,
        });
        let abuf = abuf.get(if own_a { kc_max * mc_max } else { 0 });
        let edge = ebuf.get(kc_max * K::MR);
        // (pointer, row stride, depth stride) of the left panel of `MR`
        // whole rows at row `ic + ir` and depth `pc`: packed in `apack`
        // (when `pack_a`), or read in place.
        let whole_panel = |apack: &[f32], ic: usize, ir: usize, (pc, kc): (usize, usize)| {
            if pack_a {
                (apack[ir * kc..].as_ptr(), 1, K::MR)
            } else {
                let v = a.at(ic + ir, pc);
                (v.data[v.off..].as_ptr(), v.rs, 1)
            }
        };
        // The tile at rows `ir..` and columns `jr..` of the blocks at `at`
        // (the (start, length) of their rows, columns and depth), whose
        // packed copies are `apack` (when `pack_a`) and `bpack`.
        type At = ((usize, usize), (usize, usize), (usize, usize));
        let mut one = |apack: &[f32], bpack: &[f32], at: At, ir: usize, jr: usize| {
            let ((ic, mc), (jc, nc), (pc, kc)) = at;
            let (mr, nr) = (K::MR.min(mc - ir), K::NR.min(nc - jr));
            let bp = bpack[jr * kc..].as_ptr();
            // (pointer, row stride, depth stride) of the A panel.
            let (ap, ars, aks) = if pack_a || mr == K::MR {
                whole_panel(apack, ic, ir, (pc, kc))
            } else {
                pack_a_block::<K>(&mut edge[..kc * K::MR], a.at(ic + ir, pc), mr, kc);
                (edge.as_ptr(), 1, K::MR)
            };
            // SAFETY: (ic + ir, jc + jr) is inside the m x n output, which
            // `out` covers.
            let c = unsafe { out.ptr.add((ic + ir) * out.rs + (jc + jr) * out.cs) };
            // The bias goes in after the last depth block's terms.
            let bias = match pc + kc == k {
                true => bias.at(ic + ir, jc + jr),
                false => Bias::None,
            };
            // SAFETY: the A panel holds MR rows of `kc` elements at the
            // given strides (a packed panel, or MR full rows of `a` checked
            // by the caller), the B panel `kc x NR` packed elements starting
            // 64-byte aligned (`jr * kc` is a multiple of 16 and so is every
            // depth block's offset); `c` heads an `mr x nr` tile of the
            // output, which this call owns; a bias from the tile's row and
            // column holds (at least) its values.
            unsafe { tile::<K>(kc, ap, ars, aks, bp, c, out, mr, nr, pc > 0, bias) };
        };
        // The blocks (start, length) of a side `len` long.
        let blocks =
            |len: usize, max: usize| (0..len).step_by(max).map(move |s| (s, max.min(len - s)));
        if a_outer {
            // Each left panel stays in L1 across a right block's panels.
            for (pc, kc) in blocks(k, kc_max) {
                for (ic, mc) in blocks(m, mc_max) {
                    let apack = packed_a::<K>(abuf, shared, a, m, (ic, mc), (pc, kc), own_a);
                    for (jc, nc) in blocks(n, nc_max) {
                        let bpack = packed_b::<K>(bbuf, shared, b, nc_max, (jc, nc), (pc, kc));
                        let at = ((ic, mc), (jc, nc), (pc, kc));
                        for ir in (0..mc).step_by(K::MR) {
                            // The row's whole tiles in one kernel call,
                            // the rest (a partial panel) one by one.
                            let whole = match K::MR <= mc - ir && out.cs == 1 {
                                true => nc / K::NR,
                                false => 0,
                            };
                            if whole > 0 {
                                let (i, j) = (ic + ir, jc);
                                let bias = match pc + kc == k {
                                    true => bias.at(i, j).tile(),
                                    false => TileBias::None,
                                };
                                let (ap, ars, aks) = whole_panel(apack, ic, ir, (pc, kc));
                                // SAFETY: the left panel holds MR rows of
                                // `kc` at those strides, the packed right
                                // block `whole` panels of `kc x NR` (64-byte
                                // aligned); rows `i..i + MR` and columns
                                // `j..j + whole NR` lie in the output, row
                                // stride `out.rs`, which this call owns; a
                                // bias holds those rows' or columns' values.
                                unsafe {
                                    let c = out.ptr.add(i * out.rs + j);
                                    K::run_panels(
                                        kc,
                                        ap,
                                        ars,
                                        aks,
                                        bpack.as_ptr(),
                                        whole,
                                        c,
                                        out.rs,
                                        pc > 0,
                                        bias,
                                    );
                                }
                            }
                            for jr in (whole * K::NR..nc).step_by(K::NR) {
                                one(apack, bpack, at, ir, jr);
                            }
                        }
                    }
                }
            }
        } else {
            // Each right panel stays in L1 across a left block's panels.
            for (jc, nc) in blocks(n, nc_max) {
                for (pc, kc) in blocks(k, kc_max) {
                    let bpack = packed_b::<K>(bbuf, shared, b, nc_max, (jc, nc), (pc, kc));
                    for (ic, mc) in blocks(m, mc_max) {
                        let apack = packed_a::<K>(abuf, shared, a, m, (ic, mc), (pc, kc), own_a);
                        let at = ((ic, mc), (jc, nc), (pc, kc));
                        for jr in (0..nc).step_by(K::NR) {
                            for ir in (0..mc).step_by(K::MR) {
                                one(apack, bpack, at, ir, jr);
                            }
                        }
                    }
                }
            }
        }
    });
}

/// The `kc x nc` block of `b` at depth `pc` and column `jc`, packed into
/// `buf` ([`pack_b`]), or a [`Shared::B`] copy's block (`nc_max` wide).
fn packed_b<'s, K: Kernel>(
    buf: &'s mut [f32],
    shared: Shared<'s>,
    b: View<'_>,
    nc_max: usize,
    (jc, nc): (usize, usize),
    (pc, kc): (usize, usize),
) -> &'s [f32] {
    match shared {
        Shared::B(all) => &all[pc * nc_max..],
        _ => {
            let d = &mut buf[..kc * nc.div_ceil(K::NR) * K::NR];
            pack_b::<K>(d, b.at(pc, jc), kc, nc);
            d
        }
    }
}

/// The `mc x kc` block of `a` (`m` rows in all) at row `ic` and depth `pc`,
/// packed into `buf` ([`pack_a_block`]) when `own`, or a [`Shared::A`]
/// copy's block; empty otherwise (the panels are read in place).
fn packed_a<'s, K: Kernel>(
    buf: &'s mut [f32],
    shared: Shared<'s>,
    a: View<'_>,
    m: usize,
    (ic, mc): (usize, usize),
    (pc, kc): (usize, usize),
    own: bool,
) -> &'s [f32] {
    match shared {
        Shared::A(all) => &all[pc * m.div_ceil(K::MR) * K::MR + ic * kc..],
        _ if own => {
            let d = &mut buf[..kc * mc.div_ceil(K::MR) * K::MR];
            pack_a_block::<K>(d, a.at(ic, pc), mc, kc);
            d
        }
        _ => &[],
    }
}

/// Packs the `kc x nc` block `b` into `ceil(nc / NR)` panels of `kc x NR`
/// (row-major within a panel), zero-padding the last panel's columns.
fn pack_b<K: Kernel>(dst: &mut [f32], b: View<'_>, kc: usize, nc: usize) {
    if b.cs == 1 && b.rs != 1 {
        if has_avx512() {
            // SAFETY: the CPU has AVX-512.
            unsafe { pack_b_rows_avx512::<K>(dst, b, kc, nc) };
        } else {
            pack_b_rows::<K>(dst, b, kc, nc);
        }
        return;
    }
    for (panel, d) in dst.chunks_exact_mut(kc * K::NR).enumerate() {
        let j0 = panel * K::NR;
        let nr = K::NR.min(nc - j0);
        let src = b.at(0, j0);
        if src.rs == 1 && src.cs != 0 {
            // SAFETY: sgemm checked that the CPU has AVX2 and FMA.
            unsafe { pack_b_panel_cols(d, src, kc, K::NR, nr) };
        } else {
            if nr < K::NR {
                d.fill(0.0);
            }
            // Walk each column along its stride (contiguous when `b` is
            // a transposed view).
            for j in 0..nr {
                let s = src.off + j * src.cs;
                for p in 0..kc {
                    d[p * K::NR + j] = src.data[s + p * src.rs];
                }
            }
        }
    }
}

/// [`pack_b`] of a `b` whose rows are contiguous.
#[inline(always)]
fn pack_b_rows<K: Kernel>(dst: &mut [f32], b: View<'_>, kc: usize, nc: usize) {
    // Rows in memory order: each row of the block is read once, whole,
    // and dealt out to the panels (a panel at a time would read a short
    // piece of each of `kc` rows, each on its own page of a wide `b`).
    let full = nc / K::NR;
    for p in 0..kc {
        let s = b.off + p * b.rs;
        let row = &b.data[s..s + nc];
        // The same piece of a row further down, fetched while this one
        // is copied (`wrapping_add`: past the block the address may lie
        // outside `b`; a prefetch never faults).
        let ahead = b.data.as_ptr().wrapping_add(s + B_ROWS_AHEAD * b.rs);
        for (q, piece) in row.chunks_exact(K::NR).enumerate() {
            for l in (0..K::NR).step_by(16) {
                let line = ahead.wrapping_add(q * K::NR + l);
                // SAFETY: the CPU has SSE (x86_64); a prefetch reads nothing.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(line.cast::<i8>()) };
            }
            // `K::NR` is a constant here: the copy compiles to vector
            // moves, not a memmove call.
            dst[(q * kc + p) * K::NR..][..K::NR].copy_from_slice(piece);
        }
        let rest = &row[full * K::NR..];
        if !rest.is_empty() {
            let d = &mut dst[(full * kc + p) * K::NR..][..K::NR];
            d[..rest.len()].copy_from_slice(rest);
            d[rest.len()..].fill(0.0);
        }
    }
}

/// [`pack_b_rows`] compiled for AVX-512: its copies move whole `zmm`
/// registers (two per 32-column panel row, not eight `xmm` ones). 512^3 and
/// 1024^3 on 2 threads 2-5% faster, interleaved.
///
/// # Safety
/// The CPU has AVX-512.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
unsafe fn pack_b_rows_avx512<K: Kernel>(dst: &mut [f32], b: View<'_>, kc: usize, nc: usize) {
    pack_b_rows::<K>(dst, b, kc, nc);
}

/// Packs the `mc x kc` block `a` into `ceil(mc / MR)` panels of `MR x kc`
/// stored depth-major (`MR` consecutive values per depth step),
/// zero-padding the last panel's rows.
fn pack_a_block<K: Kernel>(dst: &mut [f32], a: View<'_>, mc: usize, kc: usize) {
    for (panel, d) in dst.chunks_exact_mut(kc * K::MR).enumerate() {
        let i0 = panel * K::MR;
        let mr = K::MR.min(mc - i0);
        let src = a.at(i0, 0);
        if mr < K::MR {
            d.fill(0.0);
        }
        if src.cs == 1 && mr == K::MR && src.rs != 0 {
            // SAFETY: sgemm checked that the CPU has AVX2 and FMA.
            unsafe { pack_a_panel_rows(d, src, kc, K::MR) };
        } else if src.rs == 1 && mr == K::MR {
            for (p, col) in d.chunks_exact_mut(K::MR).enumerate() {
                let s = src.off + p * src.cs;
                col.copy_from_slice(&src.data[s..s + K::MR]);
            }
        } else {
            for i in 0..mr {
                let s = src.off + i * src.rs;
                for p in 0..kc {
                    d[p * K::MR + i] = src.data[s + p * src.cs];
                }
            }
        }
    }
}

/// One `mr x nr` output tile (`mr <= MR`, `nr <= NR`): the whole
/// microkernel straight into `c` when the tile is whole, else through a
/// temporary.
///
/// # Safety
/// As for [`Kernel::run`], except that only `mr x nr` elements from `c` (at the
/// strides of `out`) need to be valid.
#[allow(clippy::too_many_arguments)]
unsafe fn tile<K: Kernel>(
    kc: usize,
    a: *const f32,
    ars: usize,
    aks: usize,
    b: *const f32,
    c: *mut f32,
    out: Out,
    mr: usize,
    nr: usize,
    accumulate: bool,
    bias: Bias<'_>,
) {
    // SAFETY (both calls): the caller's guarantees on the operands; the
    // output is either the caller's whole row-major tile or `tmp`, a whole
    // tile with row stride NR; a bias holds the tile's values.
    let run = |c: *mut f32, ldc: usize, acc: bool, bias: TileBias| unsafe {
        K::run(kc, a, ars, aks, b, c, ldc, acc, bias)
    };
    if mr == K::MR && nr == K::NR && out.cs == 1 {
        run(c, out.rs, accumulate, bias.tile());
        return;
    }
    const { assert!(K::MR * K::NR <= MAX_TILE) };
    // Not zeroed first: the kernel writes its whole tile (`accumulate` off).
    let mut buf = MaybeUninit::<[f32; MAX_TILE]>::uninit();
    run(buf.as_mut_ptr().cast(), K::NR, false, TileBias::None);
    // SAFETY: the kernel wrote all `MR x NR` values of its tile, from the
    // start of `buf` at row stride NR.
    let tmp = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<f32>(), K::MR * K::NR) };
    let put = |i: usize, j: usize| {
        // SAFETY: (i, j) lies in the caller's `mr x nr` tile, which holds
        // values when accumulating (and may be uninitialised otherwise, so
        // it is only written then).
        unsafe {
            let d = c.add(i * out.rs + j * out.cs);
            let v = tmp[i * K::NR + j];
            let v = if accumulate { d.read() + v } else { v };
            d.write(match bias {
                Bias::None => v,
                _ => v + bias.get(i, j),
            });
        }
    };
    // Walk the output in its memory order (rows of a transposed output are
    // the tile's columns).
    if out.cs == 1 {
        for (i, t) in tmp.chunks_exact(K::NR).take(mr).enumerate() {
            // SAFETY: row `i` of the caller's tile holds `nr` contiguous
            // elements, initialised when accumulating (only written
            // otherwise). Whole rows as slices, so the copy is vectorised.
            unsafe {
                let d = c.add(i * out.rs);
                if accumulate {
                    let row = std::slice::from_raw_parts_mut(d, nr);
                    row.iter_mut().zip(t).for_each(|(o, &v)| *o += v);
                } else {
                    std::ptr::copy_nonoverlapping(t.as_ptr(), d, nr);
                }
                // Written just above, so initialised.
                let row = std::slice::from_raw_parts_mut(d, nr);
                match bias {
                    Bias::None => {}
                    Bias::Rows(v) => row.iter_mut().for_each(|o| *o += v[i]),
                    Bias::Cols(v) => row.iter_mut().zip(v).for_each(|(o, &b)| *o += b),
                }
            }
        }
    } else if out.rs == 1 && mr == 8 && K::MR == 8 {
        // A transposed output (`dst^T = b^T @ a^T`): each of the tile's
        // columns is 8 contiguous elements of the output, written whole
        // after an 8x8 register transpose.
        // SAFETY: column `j < nr` of the caller's tile is the 8 contiguous
        // elements from `c + j * out.cs` (row stride 1), initialised when
        // accumulating; `tmp` is a whole 8 x NR tile; kernels need AVX2.
        unsafe { put_columns8(&tmp[..8 * K::NR], K::NR, c, out.cs, nr, accumulate, bias) };
    } else {
        for j in 0..nr {
            for i in 0..mr {
                put(i, j);
            }
        }
    }
}

/// Writes (or adds, when `accumulate`) the first `nr` columns of the
/// row-major `8 x ld` tile `tmp` to `c + j * cs` for column `j`, each as 8
/// contiguous elements: the tile transposed 8 columns at a time in
/// registers. The `bias` of the tile is added last.
///
/// # Safety
/// Each `c + j * cs` for `j < nr` must head 8 writable elements (readable
/// values when accumulating); `ld` must be at least `nr` rounded up to 8,
/// `tmp` at least `8 * ld` long, and the CPU must have AVX2.
///
/// # Panics
/// If `bias` holds fewer than the tile's 8 rows or `nr` columns.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn put_columns8(
    tmp: &[f32],
    ld: usize,
    c: *mut f32,
    cs: usize,
    nr: usize,
    accumulate: bool,
    bias: Bias<'_>,
) {
    let rows = match bias {
        Bias::Rows(v) => Some(load8(v, 0)),
        _ => None,
    };
    for h in (0..nr).step_by(8) {
        let t = transpose8(std::array::from_fn(|i| load8(tmp, i * ld + h)));
        for (jj, &v) in t.iter().enumerate().take(nr - h) {
            // SAFETY: the caller's guarantee for column `h + jj < nr`.
            unsafe {
                let d = c.add((h + jj) * cs);
                let mut v = if accumulate {
                    _mm256_add_ps(v, _mm256_loadu_ps(d))
                } else {
                    v
                };
                if let Some(r) = rows {
                    v = _mm256_add_ps(v, r);
                } else if let Bias::Cols(b) = bias {
                    v = _mm256_add_ps(v, _mm256_set1_ps(b[h + jj]));
                }
                _mm256_storeu_ps(d, v);
            }
        }
    }
}

/// How many rows ahead [`pack_b`] prefetches a row-major right operand (a
/// new page per row of a wide one, which the hardware prefetcher does not
/// cross to): 2048^3 on 2 threads 3-7% faster than without, 1 to 4 rows
/// alike.
const B_ROWS_AHEAD: usize = 4;

/// How far ahead (in elements) a microkernel prefetches a packed A panel.
const A_AHEAD: usize = 1024;

/// The vector type, lane count and intrinsics of AVX2 (`ymm`) under the
/// names the [`microkernel!`] macro uses.
mod isa256 {
    pub(super) use std::arch::x86_64::{
        __m256 as V, _mm256_add_ps as add, _mm256_fmadd_ps as fma, _mm256_load_ps as load,
        _mm256_loadu_ps as loadu, _mm256_set1_ps as set1, _mm256_setzero_ps as zero,
        _mm256_storeu_ps as storeu,
    };
    pub(super) const LANES: usize = 8;
}

/// As [`isa256`], for AVX-512 (`zmm`).
mod isa512 {
    pub(super) use std::arch::x86_64::{
        __m512 as V, _mm512_add_ps as add, _mm512_fmadd_ps as fma, _mm512_load_ps as load,
        _mm512_loadu_ps as loadu, _mm512_set1_ps as set1, _mm512_setzero_ps as zero,
        _mm512_storeu_ps as storeu,
    };
    pub(super) const LANES: usize = 16;
}

/// Defines the [`Kernel`] `$kernel` (`$mr x $nv L` tiles, `L` the lanes of
/// the vector type of `$isa`, with the given block sizes) and its
/// microkernel `$name::<PACKED>`, from the vector type and intrinsics of the
/// ISA module `$isa` ([`isa256`], [`isa512`]). With `PACKED`, `ars` and
/// `aks` are taken as 1 and `$mr` (a packed panel), so the compiler folds
/// them into the addressing.
macro_rules! microkernel {
    ($(#[$doc:meta])* $kernel:ident, $supported:ident, $kc:literal, $mc:literal,
     $mc_outer:literal, $nc:literal, $a_outer:literal, $a_in_place:literal, $name:ident, $isa:ident, $feature:literal, $mr:literal, $nv:literal) => {
        $(#[$doc])*
        pub(crate) struct $kernel;

        impl Kernel for $kernel {
            const MR: usize = $mr;
            const NR: usize = $nv * $isa::LANES;
            const KC: usize = $kc;
            const MC: usize = $mc;
            const MC_OUTER: usize = $mc_outer;
            const NC: usize = $nc;
            const A_OUTER: bool = $a_outer;
            const A_IN_PLACE: bool = $a_in_place;

            fn supported() -> bool {
                $supported()
            }

            unsafe fn run(
                kc: usize,
                a: *const f32,
                ars: usize,
                aks: usize,
                b: *const f32,
                c: *mut f32,
                ldc: usize,
                accumulate: bool,
                bias: TileBias,
            ) {
                // SAFETY: the caller's guarantees (`Kernel::run`).
                unsafe { Self::run_panels(kc, a, ars, aks, b, 1, c, ldc, accumulate, bias) }
            }

            unsafe fn run_panels(
                kc: usize,
                a: *const f32,
                ars: usize,
                aks: usize,
                b: *const f32,
                panels: usize,
                c: *mut f32,
                ldc: usize,
                accumulate: bool,
                bias: TileBias,
            ) {
                // SAFETY: the caller's guarantees (`Kernel::run_panels`).
                unsafe {
                    if ars == 1 && aks == Self::MR {
                        $name::<true>(kc, a, ars, aks, b, panels, c, ldc, accumulate, bias);
                    } else {
                        $name::<false>(kc, a, ars, aks, b, panels, c, ldc, accumulate, bias);
                    }
                }
            }
        }

        /// [`Kernel::run`] on `panels` tiles side by side (see
        /// [`Kernel::run_panels`]; 1 for `run`).
        ///
        /// # Safety
        /// As for [`Kernel::run_panels`] (for [`Kernel::run`] when `panels`
        /// is 1), with the ISA this kernel is compiled for.
        #[target_feature(enable = $feature)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name<const PACKED: bool>(
            kc: usize,
            a: *const f32,
            ars: usize,
            aks: usize,
            b: *const f32,
            panels: usize,
            c: *mut f32,
            ldc: usize,
            accumulate: bool,
            bias: TileBias,
        ) {
            const MR: usize = $mr;
            const NV: usize = $nv;
            const L: usize = $isa::LANES;
            let (ars, aks) = if PACKED { (1, MR) } else { (ars, aks) };
            // SAFETY: every pointer access below stays within the ranges
            // the caller guarantees: `a` at `i * ars + p * aks` for i < MR,
            // p < kc; `b` at `p * NV L + v L` for v < NV (aligned: `b` is,
            // and a vector is at most 64 bytes); `c` at `i * ldc + v L`
            // with L-wide unaligned accesses ending below `i * ldc + NV L`;
            // a bias at its `MR` or `NV L` values.
            unsafe {
                for panel in 0..panels {
                    // Tile `panel`: the next right panel, output columns
                    // and column bias values.
                    let b = b.add(panel * kc * NV * L);
                    let c = c.add(panel * NV * L);
                    let bias = match bias {
                        TileBias::Cols(p) => TileBias::Cols(p.add(panel * NV * L)),
                        other => other,
                    };
                    let mut acc: [[$isa::V; NV]; MR] = [[$isa::zero(); NV]; MR];
                    // One base per row and one offset for the depth: every
                    // address is `base + offset` (a single x86 addressing mode)
                    // when the strides are not constants.
                    let rows: [*const f32; MR] = std::array::from_fn(|i| a.add(i * ars));
                    let mut off = 0usize;
                    let mut bp = b;
                    macro_rules! step {
                        () => {
                            let mut bv = [$isa::zero(); NV];
                            for (v, x) in bv.iter_mut().enumerate() {
                                *x = $isa::load(bp.add(v * L));
                            }
                            for (r, row) in acc.iter_mut().zip(rows) {
                                let x = $isa::set1(*row.add(off));
                                for (r, &b) in r.iter_mut().zip(&bv) {
                                    *r = $isa::fma(x, b, *r);
                                }
                            }
                            off += aks;
                            bp = bp.add(NV * L);
                        };
                    }
                    // A panel read in place from the caller's rows (`aks == 1`;
                    // a weight matrix times a few rows of activations, or any
                    // left operand in the left-panel-outer order) may come
                    // from memory: while the first tile is computed, fetch
                    // the next panel (the next `MR` rows, where the caller's
                    // next call reads), two cache lines per four steps.
                    let stream = !PACKED && aks == 1 && panel == 0;
                    // The output tile is read (when accumulating) and written
                    // only after the loop: start fetching its lines now, so a
                    // tile of a large output (past L2) does not stall there.
                    for i in 0..MR {
                        let ci = c.add(i * ldc);
                        _mm_prefetch::<_MM_HINT_T0>(ci.cast::<i8>());
                        _mm_prefetch::<_MM_HINT_T0>(ci.add(NV * L - 1).cast::<i8>());
                    }
                    let (mut pr, mut pc) = (0usize, 0usize);
                    for _ in 0..kc / 4 {
                        if stream && pr < MR {
                            for _ in 0..2 {
                                // `wrapping_add`: past the last panel the address
                                // lies outside the operand (a prefetch never
                                // faults, and nothing is read).
                                let line = a.wrapping_add((MR + pr) * ars + pc);
                                _mm_prefetch::<_MM_HINT_T0>(line.cast::<i8>());
                                pc += 16;
                                if pc >= kc {
                                    pc = 0;
                                    pr += 1;
                                }
                            }
                        }
                        if PACKED && !$a_outer {
                            // A packed panel is read once per tile, and the
                            // next tile's follows it: keep the lines some 128
                            // steps ahead on their way to L1 (as many as four
                            // steps consume). Not in a kernel whose left panel
                            // is outer: its next tile reads the same panel.
                            let line = a.wrapping_add(off + A_AHEAD);
                            for l in (0..4 * MR).step_by(16) {
                                _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(l).cast::<i8>());
                            }
                        }
                        step!();
                        step!();
                        step!();
                        step!();
                    }
                    for _ in 0..kc % 4 {
                        step!();
                    }
                    for (i, r) in acc.iter().enumerate() {
                        for (v, &x) in r.iter().enumerate() {
                            let cv = c.add(i * ldc + v * L);
                            let x = if accumulate { $isa::add(x, $isa::loadu(cv)) } else { x };
                            // The bias after every term (and the old `c`).
                            let x = match bias {
                                TileBias::None => x,
                                TileBias::Rows(p) => $isa::add(x, $isa::set1(*p.add(i))),
                                TileBias::Cols(p) => $isa::add(x, $isa::loadu(p.add(v * L))),
                            };
                            $isa::storeu(cv, x);
                        }
                    }
                }
            }
        }
    };
}

microkernel!(
    /// The AVX2+FMA kernel: 6x16 tiles, 12 accumulators in `ymm` registers.
    /// Block sizes for 32 KiB L1d and 512 KiB L2 per core (Zen 3): a
    /// `6 x 512` panel of the left operand (12 KiB) stays in L1 while the
    /// tiles stream a `512 x 128` block of the right operand (256 KiB)
    /// from L2; up to 2040 rows of the left operand are packed at once.
    /// Measured on 2 Zen 3 cores, alternating with the other order (a
    /// `512 x 16` right panel in L1, the tiles walking down 144 rows):
    /// 128^3 6-10% faster, 256^3 6-13%, 1024^3 2-7%, the encoder's
    /// projections even. Its left operand is always packed: reading the
    /// 6-row panels in place (see `block`) was mixed on 2 Zen 4 cores
    /// running this kernel (256^3 1% and 64x784x512 3.5% slower, 128^3 and
    /// the encoder's projections 3% faster).
    Avx2,
    has_avx2,
    512,
    144,
    2040,
    128,
    true,
    false,
    kernel_avx2,
    isa256,
    "avx2,fma",
    6,
    2
);
microkernel!(
    /// The AVX-512 kernel: 8x32 tiles, 16 accumulators in `zmm` registers.
    /// Block sizes for 48 KiB L1d and 2 MiB L2 per core: a `8 x 384` panel
    /// of the left operand (12 KiB) stays in L1 while the tiles stream a
    /// `384 x 768` block of the right operand (1.1 MiB) from L2. Measured
    /// on 2 cores against keeping a `256 x 32` right panel in L1 (32 KiB
    /// of the 48, beside the streamed left panels and the output's lines):
    /// 4-10% faster from 1024^3 to 2048^3 and on the encoder's projections
    /// (1024 rows of depth 384 or 1536), even below. Up to 1024 rows of
    /// the left operand are packed at once (1.5 MiB), once for every column
    /// block rather than once per column block: 2048^3 a further 3-10%
    /// faster, 1024^3 0-5%. A left operand with contiguous rows is read in
    /// place instead on AMD's cores (see `block`).
    Avx512,
    has_avx512,
    384,
    192,
    1024,
    768,
    true,
    true,
    kernel_avx512,
    isa512,
    "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma",
    8,
    2
);
microkernel!(
    /// The AVX-512 kernel for narrow outputs: 8x16 tiles, 8 accumulators
    /// (as many as keep both FMA units busy) in `zmm` registers. Each step
    /// issues one load per FMA, so it peaks below [`Avx512`], but on a
    /// product with 9 to 16 columns it does not pad them to 32. A `512 x 16`
    /// panel of the right operand is 32 KiB.
    Avx512Narrow,
    has_avx512,
    512,
    192,
    192,
    4080,
    false,
    false,
    kernel_avx512_narrow,
    isa512,
    "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma",
    8,
    1
);

/// The 8x8 transpose of `r` (row `i` of the result holds element `i` of
/// every input vector).
#[target_feature(enable = "avx2,fma")]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// Eight consecutive elements of `data` from `at`, as a vector.
///
/// # Panics
/// If they run past `data`.
#[target_feature(enable = "avx2,fma")]
fn load8(data: &[f32], at: usize) -> __m256 {
    let s = &data[at..at + 8];
    // SAFETY: `s` holds the 8 elements read (unaligned load).
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

/// Stores `v` into the 8 elements of `dst` from `at`.
///
/// # Panics
/// If they run past `dst`.
#[target_feature(enable = "avx2,fma")]
fn store8(dst: &mut [f32], at: usize, v: __m256) {
    let d = &mut dst[at..at + 8];
    // SAFETY: `d` holds the 8 elements written (unaligned store).
    unsafe { _mm256_storeu_ps(d.as_mut_ptr(), v) }
}

/// `pack_b`'s panel of `nr` columns (a multiple of 8), the first `valid`
/// of them read from a `b` whose columns are contiguous (`rs == 1`, a
/// transposed view) and the rest zeros: 8x8 blocks transposed in registers.
#[target_feature(enable = "avx2,fma")]
fn pack_b_panel_cols(d: &mut [f32], src: View<'_>, kc: usize, nr: usize, valid: usize) {
    let kc8 = kc / 8 * 8;
    for p0 in (0..kc8).step_by(8) {
        for h in 0..nr / 8 {
            let r: [__m256; 8] = std::array::from_fn(|j| {
                let j = 8 * h + j;
                if j < valid {
                    load8(src.data, src.off + j * src.cs + p0)
                } else {
                    _mm256_setzero_ps()
                }
            });
            let t = transpose8(r);
            for (pp, v) in t.into_iter().enumerate() {
                store8(d, (p0 + pp) * nr + 8 * h, v);
            }
        }
    }
    for j in 0..nr {
        let s = src.off + j * src.cs;
        for p in kc8..kc {
            d[p * nr + j] = if j < valid { src.data[s + p] } else { 0.0 };
        }
    }
}

/// `pack_a_block`'s panel of `mr` rows for an `a` whose rows are
/// contiguous (`cs == 1`): each group of 8 rows (the last padded with
/// zeros) transposed in registers per 8 depths.
#[target_feature(enable = "avx2,fma")]
fn pack_a_panel_rows(d: &mut [f32], src: View<'_>, kc: usize, mr: usize) {
    let kc8 = kc / 8 * 8;
    let mut tmp = [0.0f32; 8];
    for p0 in (0..kc8).step_by(8) {
        for g in (0..mr).step_by(8) {
            let w = 8.min(mr - g);
            let r: [__m256; 8] = std::array::from_fn(|i| {
                if i < w {
                    load8(src.data, src.off + (g + i) * src.rs + p0)
                } else {
                    _mm256_setzero_ps()
                }
            });
            for (pp, v) in transpose8(r).into_iter().enumerate() {
                let q = (p0 + pp) * mr + g;
                // A partial group (MR = 6) still stores 8 lanes where
                // they fit: the last ones land on the next depth's first
                // rows (zeros from the padding rows), which are written
                // after this store.
                if w == 8 || q + 8 <= d.len() {
                    store8(d, q, v);
                } else {
                    store8(&mut tmp, 0, v);
                    d[q..q + w].copy_from_slice(&tmp[..w]);
                }
            }
        }
    }
    for i in 0..mr {
        let s = src.off + i * src.rs;
        for p in kc8..kc {
            d[p * mr + i] = src.data[s + p];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forma_core::Rng;

    /// A filled buffer as an output slot for `sgemm` (which only writes
    /// initialised values into it).
    fn w(v: &mut [f32]) -> &mut [MaybeUninit<f32>] {
        // SAFETY: `MaybeUninit<f32>` has `f32`'s layout, and `sgemm` stores
        // only f32 values, so `v` stays initialised.
        unsafe { &mut *(v as *mut [f32] as *mut [MaybeUninit<f32>]) }
    }

    /// A `rows x cols` matrix laid out in a storage with the given strides
    /// and offset (gaps filled with NaN, which a stray read would spread).
    struct Mat {
        data: Vec<f32>,
        off: usize,
        rs: usize,
        cs: usize,
    }

    impl Mat {
        fn new(rows: usize, cols: usize, layout: Layout, rng: &mut Rng) -> Self {
            let (off, rs, cs) = match layout {
                Layout::RowMajor => (0, cols, 1),
                Layout::ColMajor => (0, 1, rows),
                // Padded rows, every other column, an offset.
                Layout::Strided => (3, 2 * cols + 5, 2),
                // Every row (or column) is the same vector.
                Layout::BroadcastRows => (1, 0, 1),
                Layout::BroadcastCols => (1, 1, 0),
            };
            let len = off + (rows - 1) * rs + (cols - 1) * cs + 1;
            let mut data = vec![f32::NAN; len];
            for i in 0..rows {
                for j in 0..cols {
                    data[off + i * rs + j * cs] = (rng.uniform() * 2.0 - 1.0) as f32;
                }
            }
            Mat { data, off, rs, cs }
        }

        fn view(&self) -> View<'_> {
            View {
                data: &self.data,
                off: self.off,
                rs: self.rs,
                cs: self.cs,
            }
        }

        fn get(&self, i: usize, j: usize) -> f64 {
            f64::from(self.data[self.off + i * self.rs + j * self.cs])
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Layout {
        RowMajor,
        ColMajor,
        Strided,
        BroadcastRows,
        BroadcastCols,
    }

    /// A right operand packed once ([`PackedB`]), in one to three column
    /// parts, against the f64 product: thin and wide shapes, every layout
    /// of `b`, a strided `a`, a recurrent layer's step (32 x 1024 x 256).
    #[test]
    fn packed_right_operand_matches_the_f64_product() {
        for (m, n, k) in [(1, 17, 3), (5, 40, 300), (32, 1024, 256), (7, 3, 600)] {
            for lb in [Layout::RowMajor, Layout::ColMajor, Layout::Strided] {
                for (parts, la) in [
                    (1, Layout::RowMajor),
                    (2, Layout::Strided),
                    (3, Layout::RowMajor),
                ] {
                    let mut rng = Rng::seed_from((m * 1000 + n + k) as u64);
                    let a = Mat::new(m, k, la, &mut rng);
                    let b = Mat::new(k, n, lb, &mut rng);
                    let packed = PackedB::new(b.view(), k, n, parts);
                    let mut got = vec![f32::NAN; m * n];
                    packed.sgemm(w(&mut got), m, a.view(), None, true);
                    let bound = 2e-6 * (k as f64).sqrt();
                    for i in 0..m {
                        for j in 0..n {
                            let terms = (0..k).map(|p| a.get(i, p) * b.get(p, j));
                            let want: f64 = terms.clone().sum();
                            let size: f64 = terms.map(f64::abs).sum();
                            let g = f64::from(got[i * n + j]);
                            assert!(
                                (g - want).abs() <= bound * (size + 1.0),
                                "{m}x{n}x{k} {la:?} {lb:?} {parts} parts ({i}, {j}): {g} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// With a bias, where [`PackedB::as_unpacked`] says the unpacked
    /// product packs the same way, [`PackedB::sgemm`] gives [`sgemm`]'s
    /// very bits (what a compiled model's `linear` relies on).
    #[test]
    fn packed_product_with_bias_is_the_unpacked_one_bit_for_bit() {
        for (m, n, k) in [(16, 1152, 384), (36, 48, 16), (2, 5, 40), (130, 70, 300)] {
            let mut rng = Rng::seed_from((m + n + k) as u64);
            let a = Mat::new(m, k, Layout::RowMajor, &mut rng);
            let b = Mat::new(k, n, Layout::ColMajor, &mut rng);
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.25 - 3.0).collect();
            let mut want = vec![f32::NAN; m * n];
            sgemm(w(&mut want), m, n, k, a.view(), b.view(), Some(&bias), true);
            for parts in [1, 2] {
                let packed = PackedB::new(b.view(), k, n, parts);
                if !packed.as_unpacked(m) {
                    continue;
                }
                let mut got = vec![f32::NAN; m * n];
                packed.sgemm(w(&mut got), m, a.view(), Some(&bias), true);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(same, "{m}x{n}x{k}, {parts} parts");
            }
        }
    }

    /// Checks every kernel this CPU runs ([`check_with`]).
    fn check(m: usize, n: usize, k: usize, la: Layout, lb: Layout, parallel: bool, seed: u64) {
        check_with::<Avx2>(m, n, k, la, lb, parallel, seed);
        if has_avx512() {
            check_with::<Avx512>(m, n, k, la, lb, parallel, seed);
            check_with::<Avx512Narrow>(m, n, k, la, lb, parallel, seed);
        }
    }

    /// Checks the product with kernel `K` against the f64 product of the same f32 inputs. Each
    /// term is exact in f64; the f32 result carries rounding of order
    /// `eps * sqrt(k) * |a| |b|` for random signs, bounded here by
    /// `2e-6 * sqrt(k)` relative to `sum |a_ip b_pj|` (plus the same absolute
    /// floor, for sums that cancel).
    #[allow(clippy::too_many_arguments)]
    fn check_with<K: Kernel>(
        m: usize,
        n: usize,
        k: usize,
        la: Layout,
        lb: Layout,
        parallel: bool,
        seed: u64,
    ) {
        let mut rng = Rng::seed_from(seed);
        let a = Mat::new(m, k, la, &mut rng);
        let b = Mat::new(k, n, lb, &mut rng);
        let mut dst = vec![f32::NAN; m * n];
        let (av, bv) = (a.view(), b.view());
        sgemm_with::<K>(
            w(&mut dst),
            m,
            n,
            k,
            av,
            bv,
            Bias::None,
            parallel,
            Limits::DEFAULT,
        );
        // With a bias per column: the product's own bits, plus the bias.
        let bias: Vec<f32> = (0..n).map(|_| rng.uniform() as f32 - 0.5).collect();
        let want: Vec<f32> = dst
            .iter()
            .enumerate()
            .map(|(e, &v)| v + bias[e % n])
            .collect();
        let mut got = vec![f32::NAN; m * n];
        let cols = Bias::Cols(&bias);
        sgemm_with::<K>(
            w(&mut got),
            m,
            n,
            k,
            av,
            bv,
            cols,
            parallel,
            Limits::DEFAULT,
        );
        assert!(
            want.iter()
                .zip(&got)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{m}x{k} @ {k}x{n} ({la:?}, {lb:?}): a bias is not added after the sum"
        );
        if parallel {
            same_bits_every_path::<K>(&dst, m, n, k, av, bv, Bias::None);
            same_bits_every_path::<K>(&want, m, n, k, av, bv, cols);
        }
        let tol = 2e-6 * (k as f64).sqrt().max(1.0);
        for i in 0..m {
            for j in 0..n {
                let (mut want, mut mag) = (0.0, 0.0);
                for p in 0..k {
                    let t = a.get(i, p) * b.get(p, j);
                    want += t;
                    mag += t.abs();
                }
                let got = f64::from(dst[i * n + j]);
                assert!(
                    (got - want).abs() <= tol * (mag + 1.0),
                    "{m}x{k} @ {k}x{n} ({la:?}, {lb:?}) at ({i}, {j}): got {got}, want {want}"
                );
            }
        }
    }

    /// Asserts that every parallel path (the split, the general path with
    /// and without a shared packed operand) and one thread give exactly
    /// `want` (a fixed summation order per element).
    fn same_bits_every_path<K: Kernel>(
        want: &[f32],
        m: usize,
        n: usize,
        k: usize,
        a: View<'_>,
        b: View<'_>,
        bias: Bias<'_>,
    ) {
        let split = Limits {
            split_work: usize::MAX,
            ..Limits::DEFAULT
        };
        let shared = Limits {
            split_work: 0,
            split_len: usize::MAX,
            ..Limits::DEFAULT
        };
        let unshared = Limits {
            split_work: 0,
            split_len: usize::MAX,
            max_shared: 0,
            transpose: false,
        };
        let transposed = Limits {
            transpose: true,
            ..Limits::DEFAULT
        };
        for (limits, par) in [
            (split, true),
            (shared, true),
            (unshared, true),
            (Limits::DEFAULT, false),
            (transposed, false),
            (transposed, true),
        ] {
            let mut other = vec![f32::NAN; m * n];
            sgemm_with::<K>(w(&mut other), m, n, k, a, b, bias, par, limits);
            assert!(
                want.iter()
                    .zip(&other)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{m}x{k} @ {k}x{n}: paths differ ({limits:?}, parallel {par})"
            );
        }
    }

    const SHAPES: &[(usize, usize, usize)] = &[
        (1, 1, 1),
        (1, 17, 3),
        (5, 1, 9),
        (6, 16, 1),
        (7, 13, 5),
        (12, 32, 256),
        (13, 33, 257),
        (37, 41, 29),
        (65, 130, 300),
        (150, 20, 40),
        (3, 500, 11),
    ];

    #[test]
    fn shapes_row_major() {
        for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
            check(m, n, k, Layout::RowMajor, Layout::RowMajor, false, s as u64);
            check(m, n, k, Layout::RowMajor, Layout::RowMajor, true, s as u64);
        }
    }

    #[test]
    fn transposed_strided_and_broadcast_operands() {
        use Layout::*;
        let layouts = [RowMajor, ColMajor, Strided, BroadcastRows, BroadcastCols];
        for &(m, n, k) in &[(7, 13, 5), (37, 41, 29), (20, 70, 300)] {
            for la in layouts {
                for lb in layouts {
                    check(m, n, k, la, lb, false, 10);
                }
            }
        }
        check(200, 300, 100, ColMajor, ColMajor, true, 11);
        check(100, 300, 200, Strided, ColMajor, true, 12);
    }

    #[test]
    fn transposed_orientation() {
        // Shapes that pad less computed as `b^T @ a^T` (m = 16, narrow n).
        for &(m, n, k) in &[(16, 200, 30), (16, 1152, 100), (128, 10, 900), (12, 5, 300)] {
            for par in [false, true] {
                check(m, n, k, Layout::RowMajor, Layout::ColMajor, par, 40);
                check(m, n, k, Layout::Strided, Layout::RowMajor, par, 41);
            }
        }
    }

    #[test]
    fn large_k_and_several_blocks() {
        // k over several KC blocks (accumulation across blocks), m over
        // several MC blocks, both ways of splitting over threads.
        check(300, 70, 1000, Layout::RowMajor, Layout::ColMajor, true, 20);
        check(40, 600, 700, Layout::ColMajor, Layout::RowMajor, true, 21);
        check(2, 3, 5000, Layout::RowMajor, Layout::RowMajor, false, 22);
        // Past one block of every size of each kernel whose tiles walk the
        // right block with the left panel outer, and several of its outer
        // left blocks, each across several right blocks.
        for (mc, nc, kc, mc_outer) in [
            (Avx2::MC, Avx2::NC, Avx2::KC, Avx2::MC_OUTER),
            (Avx512::MC, Avx512::NC, Avx512::KC, Avx512::MC_OUTER),
        ] {
            check(
                mc + 9,
                nc + 40,
                kc + 17,
                Layout::RowMajor,
                Layout::ColMajor,
                true,
                23,
            );
            check(
                mc_outer + 9,
                nc + 40,
                24,
                Layout::RowMajor,
                Layout::RowMajor,
                false,
                24,
            );
        }
    }

    #[test]
    fn wide_output_over_several_column_blocks() {
        let nc = Avx2::NC.max(Avx512::NC);
        check(7, nc + 37, 9, Layout::RowMajor, Layout::RowMajor, false, 30);
        check(7, nc + 37, 9, Layout::RowMajor, Layout::ColMajor, true, 31);
    }

    #[test]
    fn around_the_parallel_thresholds() {
        // Just below and above PAR_WORK (one thread / the split), and just
        // below and above SPLIT_WORK (the split / the general path), with
        // sides that are no multiple of a tile, split by rows and by columns.
        const { assert!(101 * 101 * 102 < PAR_WORK && 103 * 101 * 101 > PAR_WORK) };
        check(101, 101, 102, Layout::RowMajor, Layout::RowMajor, true, 50);
        check(103, 101, 101, Layout::RowMajor, Layout::ColMajor, true, 51);
        check(37, 300, 97, Layout::RowMajor, Layout::RowMajor, true, 52);
        const { assert!(407 * 409 * 403 < SPLIT_WORK && 409 * 409 * 403 > SPLIT_WORK) };
        check(407, 409, 403, Layout::RowMajor, Layout::RowMajor, true, 53);
        check(409, 409, 403, Layout::RowMajor, Layout::ColMajor, true, 54);
    }

    #[test]
    fn split_in_pools_of_other_sizes() {
        // The split from inside a pool (the caller is a worker), with one
        // range per thread for 1 to 5 threads and more threads than tiles:
        // the same bits as one thread.
        let mut rng = Rng::seed_from(60);
        for &(m, n, k) in &[(131, 70, 150), (20, 333, 170), (8, 9, 20000)] {
            let a = Mat::new(m, k, Layout::RowMajor, &mut rng);
            let b = Mat::new(k, n, Layout::Strided, &mut rng);
            let mut want = vec![f32::NAN; m * n];
            sgemm(w(&mut want), m, n, k, a.view(), b.view(), None, false);
            for threads in 1..=5 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("a thread pool");
                let mut got = vec![f32::NAN; m * n];
                pool.install(|| sgemm(w(&mut got), m, n, k, a.view(), b.view(), None, true));
                assert!(
                    want.iter()
                        .zip(&got)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{m}x{k} @ {k}x{n} on {threads} threads"
                );
            }
        }
    }

    /// The four values of `b` as a matrix at row stride `rs` (column stride 1).
    fn view4(b: &[f32; 4], rs: usize) -> View<'_> {
        View {
            data: b,
            off: 0,
            rs,
            cs: 1,
        }
    }

    #[test]
    fn empty_and_k_zero() {
        let b = [1.0f32; 4];
        let v = view4(&b, 1);
        let mut dst = vec![f32::NAN; 6];
        sgemm(w(&mut dst), 2, 3, 0, v, v, None, false);
        assert_eq!(dst, vec![0.0; 6]);
        let mut dst: Vec<f32> = Vec::new();
        sgemm(w(&mut dst), 0, 3, 2, v, v, None, true);
        assert!(dst.is_empty());
    }

    #[test]
    fn bias_after_the_sum_on_every_route() {
        // `sgemm` itself: thin products (dot products), narrow outputs
        // (the narrow kernel, transposed), several depth blocks, and no
        // depth at all; each the product's bits plus the bias.
        let mut rng = Rng::seed_from(70);
        let shapes = [
            (3, 700, 40),
            (700, 5, 300),
            (16, 300, 100),
            (200, 130, 700),
            (4, 6, 0),
        ];
        for (m, n, k) in shapes {
            let a = Mat::new(m, k.max(1), Layout::RowMajor, &mut rng);
            let b = Mat::new(k.max(1), n, Layout::ColMajor, &mut rng);
            let bias: Vec<f32> = (0..n).map(|_| rng.uniform() as f32 - 0.5).collect();
            for parallel in [false, true] {
                let (mut plain, mut got) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
                sgemm(w(&mut plain), m, n, k, a.view(), b.view(), None, parallel);
                sgemm(
                    w(&mut got),
                    m,
                    n,
                    k,
                    a.view(),
                    b.view(),
                    Some(&bias),
                    parallel,
                );
                for (e, (&p, &g)) in plain.iter().zip(&got).enumerate() {
                    let want = p + bias[e % n];
                    assert_eq!(want.to_bits(), g.to_bits(), "{m}x{k} @ {k}x{n} at {e}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "sgemm bias length")]
    fn bias_of_the_wrong_length_panics() {
        let b = [1.0f32; 4];
        let v = view4(&b, 2);
        let mut dst = vec![0.0; 4];
        sgemm(w(&mut dst), 2, 2, 2, v, v, Some(&b[..3]), false);
    }

    #[test]
    #[should_panic(expected = "outside a storage")]
    fn operand_past_its_storage_panics() {
        let b = [1.0f32; 4];
        let v = view4(&b, 2);
        let mut dst = vec![0.0; 9];
        sgemm(w(&mut dst), 3, 3, 2, v, v, None, false);
    }
}
