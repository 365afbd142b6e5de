//! Loops compiled for the widest vectors the CPU has.
//!
//! The build targets baseline x86-64, whose SSE2 has 4 lanes and no `floor`.
//! A hot loop written once as a [`Vectorized`] value is compiled three times
//! (AVX-512, AVX2 with FMA, baseline) and [`run`] picks the copy this CPU can
//! execute. The arithmetic is the same in every copy (Rust does not contract
//! `a * b + c` into FMA, and an explicit `mul_add` is exactly rounded
//! everywhere: one instruction in the wide copies, which enable FMA, a libm
//! call in the baseline one), so results do not depend on the CPU, only the
//! lane width does.

/// A loop to run vectorised. `run` must be `#[inline(always)]`, as must
/// everything it calls in the hot path: a function that is not inlined into
/// the wide copy runs with the baseline's 4 lanes.
pub(crate) trait Vectorized {
    /// What the loop returns.
    type Out;
    /// The loop itself.
    fn run(self) -> Self::Out;
}

/// Runs `v` compiled for the widest vector extension this CPU has.
#[inline]
pub(crate) fn run<V: Vectorized>(v: V) -> V::Out {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: the CPU has the features `avx512` is compiled for.
            return unsafe { avx512(v) };
        }
        if has_avx2() {
            // SAFETY: the CPU has the features `avx2` is compiled for.
            return unsafe { avx2(v) };
        }
    }
    v.run()
}

/// Whether this CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// Whether this CPU has the AVX-512 subsets the wide copies use (those of
/// every AVX-512 CPU since Skylake-SP), beside AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx512() -> bool {
    has_avx2()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// Whether this CPU is Intel's (its `cpuid` vendor string), for the few
/// choices measured to go the other way on Intel's cores than on AMD's.
#[cfg(target_arch = "x86_64")]
pub(crate) fn is_intel() -> bool {
    static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *INTEL.get_or_init(|| {
        let r = std::arch::x86_64::__cpuid(0);
        let vendor: Vec<u8> = [r.ebx, r.edx, r.ecx]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        vendor == b"GenuineIntel"
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn avx512<V: Vectorized>(v: V) -> V::Out {
    v.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn avx2<V: Vectorized>(v: V) -> V::Out {
    v.run()
}

#[cfg(test)]
mod tests {
    use super::*;
    use forma_core::dtype::Real;

    /// An exp-heavy loop (the shape of softmax, plus a `floor`) over a
    /// length that is not a multiple of any lane width.
    struct Softmaxish<'a>(&'a [f32]);

    impl Vectorized for Softmaxish<'_> {
        type Out = Vec<u32>;
        #[inline(always)]
        fn run(self) -> Vec<u32> {
            let max = self.0.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let e: Vec<f32> = self.0.iter().map(|&x| (x - max).exp_fast()).collect();
            let s: f32 = e.iter().sum();
            e.iter()
                .zip(self.0)
                .map(|(&v, &x)| (v / s + x.floor() * 0.5).to_bits())
                .collect()
        }
    }

    #[test]
    fn every_copy_computes_the_same_bits() {
        let x: Vec<f32> = (0..1003)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173)
            .collect();
        let base = Softmaxish(&x).run();
        // Not a degenerate loop: the values differ and are finite.
        assert!(base.iter().all(|&b| f32::from_bits(b).is_finite()));
        assert_ne!(base[0], base[1]);
        #[cfg(target_arch = "x86_64")]
        {
            if has_avx2() {
                // SAFETY: checked just above.
                assert_eq!(base, unsafe { avx2(Softmaxish(&x)) });
            }
            if has_avx512() {
                // SAFETY: checked just above.
                assert_eq!(base, unsafe { avx512(Softmaxish(&x)) });
            }
        }
        assert_eq!(base, run(Softmaxish(&x)));
    }
}
