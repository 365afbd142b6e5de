//! Fast paths for dense operands, and the process-level allocator tuning.
//!
//! When every operand of an elementwise kernel is one contiguous run of its
//! storage, the kernel is a zip over slices: written that way the compiler
//! vectorises it, and the output is written once into uninitialised capacity
//! rather than zero-filled first and overwritten. The strided walk in
//! [`crate::map_strided`] handles everything else.

use crate::PAR_CHUNK;
use forma_core::Layout;
use rayon::prelude::*;
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

/// A new vector of `n` values, `fill` writing every element of each chunk it
/// is given (in parallel for large `n`); `fill(start, chunk)` gets the index
/// of the chunk's first element.
pub(crate) fn build<T: Copy + Send>(
    n: usize,
    fill: impl Fn(usize, &mut [MaybeUninit<T>]) + Sync,
) -> Vec<T> {
    tune_allocator();
    let mut out: Vec<T> = Vec::with_capacity(n);
    let spare = &mut out.spare_capacity_mut()[..n];
    if n >= 2 * PAR_CHUNK {
        spare
            .par_chunks_mut(PAR_CHUNK)
            .enumerate()
            .for_each(|(c, chunk)| fill_chunk(&fill, c * PAR_CHUNK, chunk));
    } else {
        fill_chunk(&fill, 0, spare);
    }
    // SAFETY: `fill` was handed every chunk of the first `n` slots and writes
    // each element of its chunk (the callers below zip the chunk with input
    // slices of the same length); `T: Copy`, so nothing needs dropping if a
    // panic stops us before this line.
    unsafe { out.set_len(n) };
    out
}

/// Runs `fill` on one chunk, compiled for AVX2 and FMA where the CPU has
/// them (see [`vectorized`]).
#[inline]
fn fill_chunk<T, F: Fn(usize, &mut [MaybeUninit<T>])>(
    fill: &F,
    start: usize,
    chunk: &mut [MaybeUninit<T>],
) {
    vectorized(|| fill(start, chunk));
}

/// Runs `f` compiled for AVX2 and FMA where the CPU has them (the build
/// targets baseline x86-64, whose SSE2 has 4 lanes and no `floor`), so the
/// loops inlined into it run 8 lanes wide. The arithmetic is the same either
/// way (no contraction into FMA), so results do not depend on the CPU.
#[inline]
pub(crate) fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the features `call_avx2` is compiled for.
        return unsafe { call_avx2(f) };
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn call_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// `f(a[i])` over a dense slice.
pub(crate) fn map1<A: Copy + Sync, T: Copy + Send>(a: &[A], f: impl Fn(A) -> T + Sync) -> Vec<T> {
    build(a.len(), |start, out| {
        let end = start + out.len();
        for (o, &x) in out.iter_mut().zip(&a[start..end]) {
            o.write(f(x));
        }
    })
}

/// `f(a[i], b[i])` over two dense slices of one length.
pub(crate) fn map2<A: Copy + Sync, B: Copy + Sync, T: Copy + Send>(
    a: &[A],
    b: &[B],
    f: impl Fn(A, B) -> T + Sync,
) -> Vec<T> {
    debug_assert_eq!(a.len(), b.len());
    build(a.len(), |start, out| {
        let end = start + out.len();
        for ((o, &x), &y) in out.iter_mut().zip(&a[start..end]).zip(&b[start..end]) {
            o.write(f(x, y));
        }
    })
}

/// `f(a[i], b[i], c[i])` over three dense slices of one length.
pub(crate) fn map3<A: Copy + Sync, B: Copy + Sync, C: Copy + Sync, T: Copy + Send>(
    a: &[A],
    b: &[B],
    c: &[C],
    f: impl Fn(A, B, C) -> T + Sync,
) -> Vec<T> {
    debug_assert!(a.len() == b.len() && b.len() == c.len());
    build(a.len(), |start, out| {
        let end = start + out.len();
        let abc = a[start..end].iter().zip(&b[start..end]).zip(&c[start..end]);
        for (o, ((&x, &y), &z)) in out.iter_mut().zip(abc) {
            o.write(f(x, y, z));
        }
    })
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
        let y = map1(&a, |x| x + 1.0);
        let z = map2(&a, &b, |x, y| x + y);
        let w = map3(&a, &b, &c, |x, y, z| x * z - y);
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
