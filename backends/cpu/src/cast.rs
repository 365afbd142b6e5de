//! Casts between f32 and bf16 without the general path's trip through f64
//! (`Dtype::cast`): branch-free bit arithmetic, which the strided walk
//! vectorises. Autocast rounds every low-precision operand this way, and
//! the AMX product packs its operands with [`round_bits`].

use crate::collect_strided;
use forma_core::Layout;
use half::bf16;
use std::any::{Any, TypeId};

/// `x` rounded to bf16 (nearest, ties to even; NaN stays a quiet NaN), as
/// `half::bf16::from_f32` rounds, without branches so that loops of it
/// vectorise.
#[inline(always)]
pub(crate) fn round_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let nearest = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x40;
    (if x.is_nan() { nan } else { nearest }) as u16
}

/// `x` rounded to bf16 and widened back to f32.
#[inline(always)]
pub(crate) fn round_f32(x: f32) -> f32 {
    f32::from_bits(u32::from(round_bits(x)) << 16)
}

/// Rounds every value of `xs` to bf16 in place (kept in f32), in a loop
/// compiled for the widest vectors the CPU has.
pub(crate) fn round_in_place(xs: &mut [f32]) {
    struct Round<'a>(&'a mut [f32]);
    impl crate::simd::Vectorized for Round<'_> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            self.0.iter_mut().for_each(|x| *x = round_f32(*x));
        }
    }
    crate::simd::run(Round(xs));
}

/// The cast of a view from `E` to `F` when it is f32 to bf16 or back
/// (`None` for the other pairs); the same values as `Dtype::cast`.
// A `Vec`, not a slice: an unsized `[E]` cannot be downcast through `Any`.
#[allow(clippy::ptr_arg)]
pub(crate) fn fast<E: 'static, F: 'static>(src: &Vec<E>, layout: &Layout) -> Option<Vec<F>> {
    let out: Box<dyn Any> = if let Some(s) = (src as &dyn Any).downcast_ref::<Vec<f32>>() {
        if TypeId::of::<F>() != TypeId::of::<bf16>() {
            return None;
        }
        Box::new(collect_strided([layout], |[o]| {
            bf16::from_bits(round_bits(s[o]))
        }))
    } else if let Some(s) = (src as &dyn Any).downcast_ref::<Vec<bf16>>() {
        if TypeId::of::<F>() != TypeId::of::<f32>() {
            return None;
        }
        Box::new(collect_strided([layout], |[o]| {
            f32::from_bits(u32::from(s[o].to_bits()) << 16)
        }))
    } else {
        return None;
    };
    out.downcast::<Vec<F>>().ok().map(|v| *v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use forma_core::{Dtype, Rng};

    #[test]
    fn rounding_is_halfs_and_the_casts_are_dtype_casts() {
        let mut rng = Rng::seed_from(9);
        let mut xs: Vec<f32> = (0..10_000).map(|_| (rng.normal() * 1e3) as f32).collect();
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
            1.0 + 1.0 / 256.0, // a tie, to even (1.0)
            1.0 + 3.0 / 256.0, // a tie, to even (up)
            f32::from_bits(0x7f7f_ffff),
            f32::from_bits(0x0000_8000),
            f32::from_bits(0x0000_0001),
        ]);
        for &x in &xs {
            let want = bf16::from_f32(x).to_bits();
            assert_eq!(round_bits(x), want, "{x:e} ({:#x})", x.to_bits());
        }
        assert!(bf16::from_bits(round_bits(f32::NAN)).is_nan());
        // Through a transposed view, and back.
        let l = Layout::contiguous(&[100, 100]).swap(0, 1);
        let low: Vec<bf16> = fast(&xs, &l).expect("f32 to bf16");
        let want: Vec<bf16> = crate::collect_strided([&l], |[o]| xs[o].cast::<bf16>());
        assert_eq!(low, want);
        let back: Vec<f32> = fast(&low, &Layout::contiguous(&[100, 100])).expect("bf16 to f32");
        let want: Vec<f32> = low.iter().map(|v| v.cast::<f32>()).collect();
        assert_eq!(back, want);
        assert!(fast::<f32, f64>(&xs, &l).is_none());
    }
}
