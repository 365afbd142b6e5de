//! Thin f32 products as dot products: `dst[i][j] = a_i . b_j`, for a left
//! operand whose rows are contiguous and a right operand whose columns are
//! (`x @ w.t()`, a linear layer's forward, with `w` row-major).
//!
//! With few rows on one side (a batch of a few tokens), the
//! blocked product would spend most of its time packing the long operand (a
//! transposing copy of the whole weight, used by one or two tiles) or,
//! computed the other way round, padding the short side to a full tile.
//! Here both operands are read in place: tiles of dot products run along
//! the depth, in vectors, and each tile's sums are reduced at its end.

use super::sgemm::View;
use crate::simd::has_avx512;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Rows on the short side up to which [`sdot`] is the faster product.
/// Measured on the encoder's shapes (depths 384 and 1536, 384 to 1536
/// columns) with AVX-512, 1 and 2 threads: 1.5 to 5x faster than the
/// blocked product up to 8 rows, even at 16, slower from 24.
const THIN: usize = 8;

/// Multiply-adds below which the product stays on one thread.
const PAR_WORK: usize = 1 << 18;

/// Vectors of the long side per task (a multiple of every kernel's tile).
const TASK: usize = 64;

/// Whether [`sdot`] computes this product (and is the faster way to).
pub(crate) fn fits(m: usize, n: usize, k: usize, a: &View<'_>, b: &View<'_>) -> bool {
    m > 0 && n > 0 && a.cs == 1 && b.rs == 1 && m.min(n) <= THIN && k >= 16 && has_avx512()
}

/// `dst = a @ b` (row-major `m x n`, written in full) for an `a` with
/// contiguous rows and a `b` with contiguous columns, plus `bias[j]` on
/// column `j` when given (after the sum); `parallel` lets a large product
/// use several threads (`crate::par`).
///
/// # Panics
/// If [`fits`] does not hold, if `dst` is not `m * n` long or if an operand
/// does not fit its storage (or `bias` is shorter than `n`).
pub(crate) fn sdot(
    dst: &mut [MaybeUninit<f32>],
    m: usize,
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    bias: Option<&[f32]>,
    parallel: bool,
) {
    assert!(fits(m, n, k, &a, &b), "sdot: operands it does not take");
    assert_eq!(dst.len(), m * n, "sdot destination length");
    a.check(m, k);
    b.check(k, n);
    // The vectors are rows of `a` and columns of `b`; the long side is
    // split between tasks and each task walks all of the short side.
    let (ra, rb) = (Vectors::new(&a, m, a.rs), Vectors::new(&b, n, b.cs));
    let a_long = m > n;
    let (long, short) = if a_long { (ra, rb) } else { (rb, ra) };
    let out = Dst(dst.as_mut_ptr().cast::<f32>());
    let task = |t: usize| {
        let l0 = t * TASK;
        let l1 = (l0 + TASK).min(long.len);
        // Each tile of the long side is read from memory once (the next
        // one prefetched meanwhile), then from L1 for every tile of the
        // short side.
        for l in (l0..l1).step_by(T) {
            for s0 in (0..short.len).step_by(T) {
                let (ls, ss) = (long.tile(l), short.tile(s0));
                let ahead = (s0 == 0 && l + T < l1).then_some(T * long.stride);
                // SAFETY: every pointer heads `k` elements of its storage
                // (checked above), and the CPU has AVX-512 (`fits`).
                let sums = unsafe { dots_avx512(k, ss, ls, ahead) };
                for (si, row) in sums.iter().enumerate().take(short.len - s0) {
                    for (li, &v) in row.iter().enumerate().take(l1 - l) {
                        let (s, l) = (s0 + si, l + li);
                        let (i, j) = if a_long { (l, s) } else { (s, l) };
                        let v = bias.map_or(v, |b| v + b[j]);
                        // SAFETY: `(i, j)` is inside the `m x n` output,
                        // and only this task writes its long range.
                        unsafe { out.at(i * n + j).write(v) };
                    }
                }
            }
        }
    };
    let tasks = long.len.div_ceil(TASK);
    if parallel && m * n * k >= PAR_WORK && tasks > 1 {
        crate::par::run(tasks, &task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// One side's vectors: vector `i` starts at `data[off + i * stride]`.
#[derive(Clone, Copy)]
struct Vectors<'a> {
    data: &'a [f32],
    off: usize,
    stride: usize,
    len: usize,
}

impl<'a> Vectors<'a> {
    fn new(v: &View<'a>, len: usize, stride: usize) -> Self {
        Vectors {
            data: v.data,
            off: v.off,
            stride,
            len,
        }
    }

    /// The starts of vectors `at..at + T`; past the end, the last vector
    /// again (its sums are computed and dropped).
    fn tile(&self, at: usize) -> [*const f32; T] {
        std::array::from_fn(|i| {
            let v = (at + i).min(self.len - 1);
            self.data[self.off + v * self.stride..].as_ptr()
        })
    }
}

/// The output pointer, shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct Dst(*mut f32);

impl Dst {
    /// The element `i` places past the start.
    ///
    /// # Safety
    /// `i` must be inside the output.
    unsafe fn at(self, i: usize) -> *mut f32 {
        // SAFETY: the caller's guarantee.
        unsafe { self.0.add(i) }
    }
}
// SAFETY: tasks write disjoint elements (distinct ranges of the long side),
// and the exclusive borrow of `dst` outlives them.
unsafe impl Send for Dst {}
// SAFETY: as for `Send`.
unsafe impl Sync for Dst {}

/// The tile: `T` vectors of each side.
const T: usize = 4;

/// The `T x T` dot products of `s[i]` and `l[j]`, each `k` long.
///
/// # Safety
/// Each pointer must head `k` readable elements, and the CPU must have
/// AVX-512.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
unsafe fn dots_avx512(
    k: usize,
    s: [*const f32; T],
    l: [*const f32; T],
    ahead: Option<usize>,
) -> [[f32; T]; T] {
    const L: usize = 16;
    // SAFETY: reads stay below `k` elements from each pointer. (Plain
    // loops over the arrays: the same kernel written with `from_fn` and
    // `map` closures ran at a third of this speed.)
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); T]; T];
        let mut lv = [_mm512_setzero_ps(); T];
        let mut p = 0;
        while p < k {
            // Whole vectors, then the tail through masked loads (lanes past
            // `k` read as zero).
            let mask: __mmask16 = if k - p >= L {
                !0
            } else {
                ((1u32 << (k - p)) - 1) as u16
            };
            if let Some(d) = ahead {
                // The next tile's lines, on their way while this one runs
                // (`wrapping_add`: a prefetch past the operand reads nothing).
                for &lj in &l {
                    _mm_prefetch::<_MM_HINT_T0>(lj.wrapping_add(d + p).cast::<i8>());
                }
            }
            for j in 0..T {
                lv[j] = _mm512_maskz_loadu_ps(mask, l[j].add(p));
            }
            for i in 0..T {
                let sv = _mm512_maskz_loadu_ps(mask, s[i].add(p));
                for j in 0..T {
                    acc[i][j] = _mm512_fmadd_ps(sv, lv[j], acc[i][j]);
                }
            }
            p += L;
        }
        let mut flat = [0.0f32; L];
        _mm512_storeu_ps(flat.as_mut_ptr(), reduce16(acc));
        let mut sums = [[0.0; T]; T];
        for i in 0..T {
            for j in 0..T {
                sums[i][j] = flat[T * j + i];
            }
        }
        sums
    }
}

/// The sums of the lanes of the 16 vectors `v[i][j]`, as one vector whose
/// element `4 * j + i` is the sum of `v[i][j]`: each level adds pairs of
/// vectors with their halves exchanged (512-bit halves, then 128-bit
/// quarters, then pairs and single lanes within quarters), 28 shuffles and
/// 15 adds in all instead of a separate reduction per vector.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn reduce16(v: [[__m512; T]; T]) -> __m512 {
    // Flat order f = 4 * i + j.
    let f = |n: usize| v[n / T][n % T];
    // Level 1: a[p] has vector 2p's halves summed in its low 256 bits and
    // vector 2p + 1's in its high 256 bits.
    let mut a = [_mm512_setzero_ps(); 8];
    for (p, a) in a.iter_mut().enumerate() {
        let (x, y) = (f(2 * p), f(2 * p + 1));
        *a = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(x, y),
            _mm512_shuffle_f32x4::<0xEE>(x, y),
        );
    }
    // Level 2: quarter q of b[p] holds vector 4p + q's four partial sums.
    let mut b = [_mm512_setzero_ps(); 4];
    for (p, b) in b.iter_mut().enumerate() {
        let (x, y) = (a[2 * p], a[2 * p + 1]);
        *b = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(x, y),
            _mm512_shuffle_f32x4::<0xDD>(x, y),
        );
    }
    // Levels 3 and 4, within quarters: quarter q of the result holds the
    // totals of vectors q, 4 + q, 8 + q and 12 + q.
    let c0 = _mm512_add_ps(
        _mm512_shuffle_ps::<0x44>(b[0], b[1]),
        _mm512_shuffle_ps::<0xEE>(b[0], b[1]),
    );
    let c1 = _mm512_add_ps(
        _mm512_shuffle_ps::<0x44>(b[2], b[3]),
        _mm512_shuffle_ps::<0xEE>(b[2], b[3]),
    );
    _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(c0, c1),
        _mm512_shuffle_ps::<0xDD>(c0, c1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use forma_core::Rng;

    /// `sdot` against a plain f64 triple loop, for short sides on either
    /// operand, edge tiles, depth tails and both threading paths.
    #[test]
    fn matches_the_reference() {
        if !has_avx512() {
            return;
        }
        let mut rng = Rng::seed_from(5);
        for &(m, n, k) in &[
            (1, 1, 16),
            (1, 9, 17),
            (3, 70, 31),
            (8, 1152, 384),
            (8, 130, 100),
            (130, 5, 64),
            (200, 8, 1536),
            (7, 7, 47),
        ] {
            // `a` row-major with padded rows, `b` as the transpose of a
            // row-major `n x k` weight with padded rows, at offsets.
            let (lda, ldw) = (k + 3, k + 5);
            let a: Vec<f32> = (0..2 + m * lda).map(|_| rng.normal() as f32).collect();
            let w: Vec<f32> = (0..1 + n * ldw).map(|_| rng.normal() as f32).collect();
            let av = View {
                data: &a,
                off: 2,
                rs: lda,
                cs: 1,
            };
            let bv = View {
                data: &w,
                off: 1,
                rs: 1,
                cs: ldw,
            };
            for parallel in [false, true] {
                let mut dst = vec![MaybeUninit::new(f32::NAN); m * n];
                sdot(&mut dst, m, n, k, av, bv, None, parallel);
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k)
                            .map(|p| a[2 + i * lda + p] as f64 * w[1 + j * ldw + p] as f64)
                            .sum();
                        // SAFETY: `sdot` writes every element.
                        let got = unsafe { dst[i * n + j].assume_init() } as f64;
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()) * (k as f64).sqrt(),
                            "{m}x{n}x{k} ({i}, {j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
