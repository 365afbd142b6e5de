//! Fast paths for dense operands, and the process-level allocator tuning.
//!
//! When every operand of an elementwise kernel is one contiguous run of its
//! storage, the kernel is a zip over slices: written that way the compiler
//! vectorises it, and the output is written once into uninitialised capacity
//! rather than zero-filled first and overwritten. The strided walk in
//! [`crate::map_strided`] handles everything else.

use crate::PAR_CHUNK;
use forma_core::Layout;
use std::mem::MaybeUninit;

/// The contiguous runs of `layouts` in their storages, when all are dense.
pub(crate) fn dense_slices<'a, E, const K: usize>(
    storages: [&'a [E]; K],
    layouts: [&Layout; K],
) -> Option<[&'a [E]; K]> {
    let ranges: [_; K] = std::array::from_fn(|i| layouts[i].contiguous_range());
    if ranges.iter().any(Option::is_none) {
        return None;
    }
    Some(std::array::from_fn(|i| {
        let r = ranges[i].clone().expect("checked above");
        &storages[i][r]
    }))
}

/// The one value a view repeats, when all its strides are 0 (a scalar
/// broadcast to the output's sizes).
pub(crate) fn broadcast_scalar<E: Copy>(storage: &[E], layout: &Layout) -> Option<E> {
    (layout.numel() > 0 && layout.strides[..layout.rank()].iter().all(|&s| s == 0))
        .then(|| storage[layout.offset])
}

/// An elementwise function of `K` values, for the kernel loops below.
///
/// The loops are compiled twice, for AVX2+FMA and for the baseline, and the
/// function must be inlined into both for the AVX2 copy to run 8 lanes wide.
/// LLVM inlines a closure called from two places only while it is small (a
/// GELU is not), so the ops' kernels implement this with an
/// `#[inline(always)]` method instead.
pub(crate) trait Elementwise<A, const K: usize>: Sync {
    /// The output type.
    type Out: Copy;
    /// The function at one position.
    fn at(&self, x: [A; K]) -> Self::Out;
}

/// A kernel that writes one chunk of an output: `fill(start, out)` writes
/// every element of `out`, whose first element is the output's `start`th.
///
/// # Safety
/// `fill` must write every element of `out`: [`build`] then treats the
/// whole output as initialised.
pub(crate) unsafe trait Chunks<T>: Sync {
    /// Fills one chunk; implementations are `#[inline(always)]`, so the
    /// loop lands in [`fill_avx2`]'s body.
    fn fill(&self, start: usize, out: &mut [MaybeUninit<T>]);
}

/// A new vector of `n` values written by `kernel` chunk by chunk (in
/// parallel for large `n`), into uninitialised memory.
pub(crate) fn build<T: Copy + Send>(n: usize, kernel: &impl Chunks<T>) -> Vec<T> {
    tune_allocator();
    let mut out: Vec<T> = Vec::with_capacity(n);
    let spare = &mut out.spare_capacity_mut()[..n];
    if n >= 2 * PAR_CHUNK {
        crate::par::chunks_mut(spare, PAR_CHUNK, |c, chunk| {
            fill_chunk(kernel, c * PAR_CHUNK, chunk)
        });
    } else {
        fill_chunk(kernel, 0, spare);
    }
    // SAFETY: `kernel` was handed every chunk of the first `n` slots and
    // writes each element of its chunk (`Chunks`' contract); `T: Copy`, so
    // nothing needs dropping if a panic stops us before this line.
    unsafe { out.set_len(n) };
    out
}

/// Runs `kernel` on one chunk, compiled for the widest vectors the CPU has
/// (see [`crate::simd`]).
#[inline]
fn fill_chunk<T, K: Chunks<T>>(kernel: &K, start: usize, chunk: &mut [MaybeUninit<T>]) {
    crate::simd::run(Fill {
        kernel,
        start,
        chunk,
    });
}

/// One chunk of a [`Chunks`] kernel, as a [`crate::simd::Vectorized`] loop.
struct Fill<'a, K, T> {
    kernel: &'a K,
    start: usize,
    chunk: &'a mut [MaybeUninit<T>],
}

impl<T, K: Chunks<T>> crate::simd::Vectorized for Fill<'_, K, T> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        self.kernel.fill(self.start, self.chunk);
    }
}

/// `f` over `K` dense slices of one length.
pub(crate) struct Zip<'a, A, const K: usize, F> {
    ins: [&'a [A]; K],
    f: F,
}

// SAFETY: the loop zips `out` with input slices of its length.
unsafe impl<A: Copy + Sync, F: Elementwise<A, 1>> Chunks<F::Out> for Zip<'_, A, 1, F> {
    #[inline(always)]
    fn fill(&self, start: usize, out: &mut [MaybeUninit<F::Out>]) {
        let [a] = self.ins.map(|s| &s[start..start + out.len()]);
        for (o, &x) in out.iter_mut().zip(a) {
            o.write(self.f.at([x]));
        }
    }
}

// SAFETY: the loop zips `out` with input slices of its length.
unsafe impl<A: Copy + Sync, F: Elementwise<A, 2>> Chunks<F::Out> for Zip<'_, A, 2, F> {
    #[inline(always)]
    fn fill(&self, start: usize, out: &mut [MaybeUninit<F::Out>]) {
        let [a, b] = self.ins.map(|s| &s[start..start + out.len()]);
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            o.write(self.f.at([x, y]));
        }
    }
}

// SAFETY: the loop zips `out` with input slices of its length.
unsafe impl<A: Copy + Sync, F: Elementwise<A, 3>> Chunks<F::Out> for Zip<'_, A, 3, F> {
    #[inline(always)]
    fn fill(&self, start: usize, out: &mut [MaybeUninit<F::Out>]) {
        let [a, b, c] = self.ins.map(|s| &s[start..start + out.len()]);
        for (o, ((&x, &y), &z)) in out.iter_mut().zip(a.iter().zip(b).zip(c)) {
            o.write(self.f.at([x, y, z]));
        }
    }
}

/// `f(a[i], b[i], ...)` over `K` dense slices of one length.
pub(crate) fn map<A: Copy + Sync, T: Copy + Send, const K: usize, F>(ins: [&[A]; K], f: F) -> Vec<T>
where
    F: Elementwise<A, K, Out = T>,
    for<'a> Zip<'a, A, K, F>: Chunks<T>,
{
    debug_assert!(ins.iter().all(|s| s.len() == ins[0].len()));
    build(ins[0].len(), &Zip { ins, f })
}

/// Values per block of [`Blocks`]: short enough for every operand's block to
/// sit in L1, long enough for an unrolled 8-lane loop.
pub(crate) const BLOCK: usize = 64;

/// `f` over one block: `K` arrays of [`BLOCK`] values in, one out. The fixed
/// length lets the compiler drop bounds checks and vectorise for any `K`.
#[inline(always)]
pub(crate) fn fill_block<A: Copy, F: Elementwise<A, K>, const K: usize>(
    ins: [&[A; BLOCK]; K],
    out: &mut [MaybeUninit<F::Out>; BLOCK],
    f: &F,
) {
    for (j, o) in out.iter_mut().enumerate() {
        o.write(f.at(std::array::from_fn(|k| ins[k][j])));
    }
}

/// `f` over `K` dense slices of one length, for any `K` (the [`Zip`] loops
/// are written out for `K <= 3`): whole blocks through [`fill_block`], then
/// the tail.
pub(crate) struct Blocks<'a, A, const K: usize, F> {
    ins: [&'a [A]; K],
    f: F,
}

// SAFETY: the block loop writes each whole block of `out`, the tail loop
// every element after the last whole block.
unsafe impl<A: Copy + Sync, F: Elementwise<A, K>, const K: usize> Chunks<F::Out>
    for Blocks<'_, A, K, F>
{
    #[inline(always)]
    fn fill(&self, start: usize, out: &mut [MaybeUninit<F::Out>]) {
        let n = out.len();
        let whole = n - n % BLOCK;
        for (b, o) in out[..whole].chunks_exact_mut(BLOCK).enumerate() {
            let at = start + b * BLOCK;
            let ins = self.ins.map(|s| {
                <&[A; BLOCK]>::try_from(&s[at..at + BLOCK]).expect("a block is BLOCK long")
            });
            let o = <&mut [_; BLOCK]>::try_from(o).expect("a block is BLOCK long");
            fill_block(ins, o, &self.f);
        }
        for (j, o) in out.iter_mut().enumerate().skip(whole) {
            o.write(self.f.at(self.ins.map(|s| s[start + j])));
        }
    }
}

/// [`map`] for any number of operands.
pub(crate) fn map_blocks<A: Copy + Sync, T: Copy + Send, const K: usize, F>(
    ins: [&[A]; K],
    f: F,
) -> Vec<T>
where
    F: Elementwise<A, K, Out = T>,
{
    debug_assert!(ins.iter().all(|s| s.len() == ins[0].len()));
    let n = ins.first().map_or(0, |s| s.len());
    build(n, &Blocks { ins, f })
}

/// Keeps freed buffers in the process instead of handing them back to the
/// OS after every op (glibc only; once per process).
///
/// A training step frees and reallocates the same multi-megabyte buffers
/// every step. glibc returns such memory to the kernel (trimming the heap
/// top, or unmapping blocks above its mmap threshold), so the next step's
/// buffers are fresh pages that fault in one by one and are zeroed by the
/// kernel: measured here as a fifth of an elementwise chain's time. Raising
/// both thresholds makes freed buffers reusable at once; the price is that
/// the process keeps its peak heap rather than shrinking after it.
/// `FORMA_MALLOC_DEFAULTS=1` in the environment leaves glibc's settings alone.
pub fn tune_allocator() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if std::env::var_os("FORMA_MALLOC_DEFAULTS").is_none() {
            // glibc's largest allowed mmap threshold (HEAP_MAX_SIZE / 2 on
            // 64-bit): blocks below it come from the reusable heap.
            const MMAP_THRESHOLD: libc::c_int = 32 << 20;
            const TRIM_THRESHOLD: libc::c_int = 1 << 30;
            // SAFETY: `mallopt` only changes allocator parameters; it is
            // called once, before Forma allocates its first buffer.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
                libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_cover_every_element_across_chunks() {
        let n = 2 * PAR_CHUNK + 17;
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| (2 * i) as f32).collect();
        let c: Vec<f32> = vec![1.0; n];
        struct Inc;
        impl Elementwise<f32, 1> for Inc {
            type Out = f32;
            fn at(&self, [x]: [f32; 1]) -> f32 {
                x + 1.0
            }
        }
        struct Sum2;
        impl Elementwise<f32, 2> for Sum2 {
            type Out = f32;
            fn at(&self, [x, y]: [f32; 2]) -> f32 {
                x + y
            }
        }
        struct Fma3;
        impl Elementwise<f32, 3> for Fma3 {
            type Out = f32;
            fn at(&self, [x, y, z]: [f32; 3]) -> f32 {
                x * z - y
            }
        }
        let y = map([&a], Inc);
        let z = map([&a, &b], Sum2);
        let w = map([&a, &b, &c], Fma3);
        for i in [0, 1, PAR_CHUNK - 1, PAR_CHUNK, 2 * PAR_CHUNK, n - 1] {
            assert_eq!(y[i], i as f32 + 1.0);
            assert_eq!(z[i], (3 * i) as f32);
            assert_eq!(w[i], -(i as f32));
        }
        assert_eq!((y.len(), z.len(), w.len()), (n, n, n));
    }

    #[test]
    fn dense_slices_only_for_contiguous_views() {
        let s = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let l = Layout::contiguous(&[2, 3]);
        let [a] = dense_slices([&s[..]], [&l]).unwrap();
        assert_eq!(a, &s[..]);
        let t = Layout::contiguous(&[3, 2]).permute(&[1, 0]);
        assert!(dense_slices([&s[..], &s[..]], [&l, &t]).is_none());
    }
}
