//! Element types. [`Dtype`] is every type a tensor can hold; [`Float`] the ones
//! that compute (f32, f64, f16, bf16). Half types compute in f32 ([`Float::Acc`]),
//! so a sum over f16 accumulates in f32 like PyTorch's.

use half::{bf16, f16};
use std::fmt::{Debug, Display};

/// The runtime tag of a dtype, for messages, printing and checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float, the default.
    F32,
    /// 64-bit float.
    F64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// 64-bit signed integer (indices, class labels).
    I64,
    /// 32-bit unsigned integer.
    U32,
    /// Boolean (masks).
    Bool,
}

impl DType {
    /// PyTorch's name for the dtype (`float32`, `int64`, ...).
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I64 => "int64",
            DType::U32 => "uint32",
            DType::Bool => "bool",
        }
    }

    /// Whether values of this dtype are floating point.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.torch_name())
    }
}

/// A type a tensor can hold.
pub trait Dtype:
    Copy + Debug + Display + Default + PartialEq + PartialOrd + Send + Sync + 'static
{
    /// The runtime tag.
    const DTYPE: DType;
    /// Converts to f64 (exact for every float dtype and for integers up to 2^53).
    fn to_f64(self) -> f64;
    /// Converts from f64 the way `torch.Tensor.to` does: round for floats,
    /// truncate toward zero for integers, non-zero is `true` for bool.
    fn from_f64(v: f64) -> Self;
    /// The exact value of an integer dtype (`None` for floats and bool).
    fn to_i64(self) -> Option<i64> {
        None
    }
    /// Converts from an integer; an `i64` beyond 2^53 must not round through
    /// f64 on its way to f32, so the float types override this.
    fn from_i64(v: i64) -> Self {
        Self::from_f64(v as f64)
    }
    /// Converts between dtypes with a single rounding, like `tensor.to(dtype)`.
    fn cast<F: Dtype>(self) -> F {
        match self.to_i64() {
            Some(i) => F::from_i64(i),
            None => F::from_f64(self.to_f64()),
        }
    }
}

macro_rules! dtype_impl {
    ($t:ty, $tag:ident, |$x:ident| $to:expr, |$v:ident| $from:expr $(, $extra:item)*) => {
        impl Dtype for $t {
            const DTYPE: DType = DType::$tag;
            #[inline]
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
            #[inline]
            fn from_f64($v: f64) -> Self {
                $from
            }
            $($extra)*
        }
    };
}

dtype_impl!(
    f32,
    F32,
    |x| x as f64,
    |v| v as f32,
    fn from_i64(v: i64) -> Self {
        v as f32
    }
);
dtype_impl!(f64, F64, |x| x, |v| v);
dtype_impl!(f16, F16, |x| x.to_f64(), |v| f16::from_f64(v));
dtype_impl!(bf16, BF16, |x| x.to_f64(), |v| bf16::from_f64(v));
dtype_impl!(
    i64,
    I64,
    |x| x as f64,
    |v| v as i64,
    fn to_i64(self) -> Option<i64> {
        Some(self)
    },
    fn from_i64(v: i64) -> Self {
        v
    }
);
dtype_impl!(
    u32,
    U32,
    |x| x as f64,
    |v| v as u32,
    fn to_i64(self) -> Option<i64> {
        Some(self as i64)
    },
    fn from_i64(v: i64) -> Self {
        v as u32
    }
);
dtype_impl!(
    bool,
    Bool,
    |x| if x { 1.0 } else { 0.0 },
    |v| v != 0.0,
    fn from_i64(v: i64) -> Self {
        v != 0
    }
);

/// The arithmetic every float kernel uses, implemented by the accumulation
/// types (f32, f64).
pub trait Real:
    num_traits::Float + Copy + Send + Sync + Debug + Default + std::iter::Sum + 'static
{
    /// Conversion from f64 constants.
    fn c(v: f64) -> Self;
    /// `erf`, for the exact GELU.
    fn erf(self) -> Self;
    /// `erf` to an absolute error (f32: 4e-7), which is what `1 + erf(x)`
    /// needs (GELU); much cheaper than [`Real::erf`] in f32. f64 gives
    /// [`Real::erf`].
    fn erf_abs(self) -> Self;
    /// `exp` in a form a loop can vectorise: in f32 no libm call (within 2
    /// ulp, with gradual underflow to exactly 0 at `-inf`, overflow to
    /// `inf`, NaN kept); f64 uses std's.
    fn exp_fast(self) -> Self;
    /// `tanh` in a form a loop can vectorise: in f32 no libm call (a series
    /// below 0.25 in magnitude, `(1 - e) / (1 + e)` with `e = e^(-2|x|)`
    /// above; within 2e-7 relative, `±1` at `±inf`, NaN kept); f64 uses
    /// std's.
    fn tanh_fast(self) -> Self;
}

impl Real for f32 {
    #[inline(always)]
    fn c(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn erf(self) -> Self {
        erf_f32(self)
    }
    #[inline(always)]
    fn erf_abs(self) -> Self {
        erf_rational_f32(self)
    }
    #[inline(always)]
    fn exp_fast(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn tanh_fast(self) -> Self {
        tanh_f32(self)
    }
}

impl Real for f64 {
    #[inline(always)]
    fn c(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn erf(self) -> Self {
        libm_erf(self)
    }
    #[inline(always)]
    fn erf_abs(self) -> Self {
        libm_erf(self)
    }
    #[inline(always)]
    fn exp_fast(self) -> Self {
        self.exp()
    }
    #[inline(always)]
    fn tanh_fast(self) -> Self {
        self.tanh()
    }
}

/// `c[0] t^(n-1) + ... + c[n-2] t + c[n-1]` by Horner's rule, one fused
/// multiply-add per step. An FMA is exactly rounded, so every CPU computes
/// the same bits. Forma's CPU kernels run these polynomials in loops
/// compiled with FMA enabled (`forma-cpu`'s `simd::run`), where each step is
/// one instruction; code compiled for baseline x86-64 calls libm's `fmaf`
/// instead, which is correct but slow.
#[inline(always)]
fn horner(t: f32, c: &[f32]) -> f32 {
    let mut acc = c[0];
    for &ci in &c[1..] {
        acc = acc.mul_add(t, ci);
    }
    acc
}

/// `erf(x) = x P(x^2) / Q(x^2)` on `|x| <= 4` (clamped: `erf(4)` rounds
/// to 1 in f32), a (6, 4) rational fitted for minimal relative error by
/// `tools/fit_erf.py`: absolute and relative error below 4e-7 in f32
/// arithmetic (the fit itself is within 7e-8; the rest is rounding). No
/// `exp` and one division: a short enough dependency chain for a
/// vectorised GELU to run at memory speed, where the exp-based form of
/// [`erf_f32`] is bound by its latency.
#[inline(always)]
#[allow(clippy::excessive_precision)] // the fitted f32 values, as printed by the tool
fn erf_rational_f32(x: f32) -> f32 {
    // Selects rather than `min`, which would turn NaN into 4: NaN fails
    // the comparison and flows through.
    let ax = x.abs();
    let ax = if ax > 4.0 { 4.0 } else { ax };
    let t = ax * ax;
    let p = horner(
        t,
        &[
            1.911_088_53e-8,
            -1.942_324_84e-6,
            1.472_889_56e-4,
            3.990_669_74e-3,
            5.152_518_30e-2,
            2.071_274_97e-1,
            1.128_379_11,
        ],
    );
    let q = horner(
        t,
        &[
            1.021_136_76e-3,
            1.495_826_34e-2,
            1.179_716_81e-1,
            5.168_932_08e-1,
            1.0,
        ],
    );
    // Near the clamp, rounding can leave the quotient a few ulp above 1.
    let y = ax * p / q;
    (if y > 1.0 { 1.0 } else { y }).copysign(x)
}

/// Abramowitz and Stegun 7.1.26, `erf(x) = 1 - t (a1 + t (a2 + ...))
/// exp(-x^2)` with `t = 1 / (1 + p |x|)`, sign restored: absolute error
/// below 3e-7 everywhere, but no relative bound near 0 (see [`erf_f32`]).
#[inline(always)]
fn erf_tail_f32(x: f32) -> f32 {
    let ax = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * ax);
    let poly = ((((1.061_405_4 * t - 1.453_152) * t + 1.421_413_8) * t - 0.284_496_72) * t
        + 0.254_829_6)
        * t;
    (1.0 - poly * exp_f32(-ax * ax)).copysign(x)
}

/// `erf` in f32 without a libm call or a branch, so a loop over it
/// vectorises; [`libm_erf`] serves f64. Below `|x| = 0.6` the Maclaurin
/// series to `x^13`; above, Abramowitz and Stegun 7.1.26 (`1 - t (a1 + t
/// (a2 + ...)) exp(-x^2)`, `t = 1 / (1 + p |x|)`, the form PyTorch's
/// vectorised GELU uses), whose cancellation near 0 the series avoids.
/// Absolute error below 3e-7, relative below 5e-7 for `|x| < 0.6`.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let ax = x.abs();
    let tail = erf_tail_f32(ax);
    let x2 = ax * ax;
    let series = ((((((1.0 / 9360.0 * x2 - 1.0 / 1320.0) * x2 + 1.0 / 216.0) * x2 - 1.0 / 42.0)
        * x2
        + 0.1)
        * x2
        - 1.0 / 3.0)
        * x2
        + 1.0)
        * ax
        * std::f32::consts::FRAC_2_SQRT_PI;
    // A select, not a branch: both sides are computed.
    let y = if ax < 0.6 { series } else { tail };
    y.copysign(x)
}

/// `exp` in f32 without a libm call, so it vectorises. Cephes' `expf`:
/// `x = n ln 2 + r`, a degree-6 polynomial for `e^r`, and `2^n` applied as
/// two normal powers of two written into exponent bits, so results below
/// `2^-126` underflow gradually (to exactly 0 at `-inf`) and those above
/// `f32::MAX` become `inf`. Within 2 ulp over the normal range; NaN stays NaN.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    // Round to nearest with the 1.5 * 2^23 trick: a plain add, unlike
    // `round()`, which is a libm call without SSE4.1.
    const ROUND: f32 = 12_582_912.0;
    // e^-104 is below half the smallest subnormal, e^89 above f32::MAX.
    let x = x.clamp(-104.0, 89.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    // Cody and Waite's two-part ln 2: `n * 0.693_359_4` is exact.
    let r = n.mul_add(2.121_944_4e-4, n.mul_add(-0.693_359_4, x));
    let p = horner(
        r,
        &[
            1.987_569_1e-4,
            1.398_2e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ],
    );
    let p = (p * r).mul_add(r, r) + 1.0;
    // n is in [-150, 129], read as an integer from `t`'s low mantissa bits
    // (a float-to-int `as` would not vectorise: it saturates and maps NaN);
    // split so each factor is a normal 2^k.
    let n = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let half = n >> 1;
    let pow = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    p * pow(half) * pow(n - half)
}

/// `tanh` in f32 without a libm call, so it vectorises. Below 0.25 in
/// magnitude the Taylor series to `x^9` (the next term is under 1e-8
/// relative there); above, `(1 - e) / (1 + e)` with `e = e^(-2|x|)` from
/// [`exp_f32`], where `1 - e` loses at most a few ulp (`e <= 0.61`). Both
/// sides are computed and one selected, so a loop of it has no branch.
#[inline(always)]
fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let x2 = x * x;
    let series = x * horner(
        x2,
        &[62.0 / 2835.0, -17.0 / 315.0, 2.0 / 15.0, -1.0 / 3.0, 1.0],
    );
    let e = exp_f32(-2.0 * a);
    let tail = ((1.0 - e) / (1.0 + e)).copysign(x);
    if a < 0.25 {
        series
    } else {
        tail
    }
}

/// `erf` to double precision (W. J. Cody's rational approximations, as in
/// most C libraries); Rust's std has no `erf`.
#[allow(clippy::excessive_precision)] // the published coefficients, digit for digit
pub fn libm_erf(x: f64) -> f64 {
    let ax = x.abs();
    let r = if ax < 0.5 {
        let t = x * x;
        let p = [
            3.209_377_589_138_469_4e3,
            3.774_852_376_853_020_2e2,
            1.138_641_541_510_501_6e2,
            3.161_123_743_870_565_6,
            1.857_777_061_846_031_5e-1,
        ];
        let q = [
            2.844_236_833_439_170_6e3,
            1.282_616_526_077_372_3e3,
            2.440_246_379_344_441_7e2,
            2.360_129_095_234_412_1e1,
            1.0,
        ];
        let num = (((p[4] * t + p[3]) * t + p[2]) * t + p[1]) * t + p[0];
        let den = (((q[4] * t + q[3]) * t + q[2]) * t + q[1]) * t + q[0];
        return x * num / den;
    } else if ax < 4.0 {
        let p = [
            1.230_339_354_797_997_2e3,
            2.051_078_377_826_071_5e3,
            1.712_047_612_634_070_6e3,
            8.819_522_212_417_691e2,
            2.986_351_381_974_001_3e2,
            6.611_919_063_714_163e1,
            8.883_149_794_388_376,
            5.641_884_969_886_701e-1,
            2.153_115_354_744_038_5e-8,
        ];
        let q = [
            1.230_339_354_803_749_5e3,
            3.439_367_674_143_721_6e3,
            4.362_619_090_143_247e3,
            3.290_799_235_733_459_7e3,
            1.621_389_574_566_690_3e3,
            5.371_811_018_620_098_5e2,
            1.176_939_508_913_125e2,
            1.574_492_611_070_983_5e1,
            1.0,
        ];
        let mut num = p[8];
        let mut den = q[8];
        for i in (0..8).rev() {
            num = num * ax + p[i];
            den = den * ax + q[i];
        }
        1.0 - (-ax * ax).exp() * num / den
    } else if ax.is_nan() {
        return f64::NAN;
    } else {
        let p = [
            -6.587_491_615_298_378e-4,
            -1.608_378_514_874_227_5e-2,
            -1.257_817_261_112_292_6e-1,
            -3.603_448_999_498_044_5e-1,
            -3.053_266_349_612_323_4e-1,
            -1.631_538_713_730_709_7e-2,
        ];
        let q = [
            2.335_204_976_268_691_8e-3,
            6.051_834_131_244_132e-2,
            5.279_051_029_514_284e-1,
            1.872_952_849_923_460_4,
            2.568_520_192_289_822,
            1.0,
        ];
        let z = 1.0 / (ax * ax);
        let mut num = p[5];
        let mut den = q[5];
        for i in (0..5).rev() {
            num = num * z + p[i];
            den = den * z + q[i];
        }
        let r = z * num / den;
        let frac_1_sqrt_pi = 0.564_189_583_547_756_3;
        1.0 - (-ax * ax).exp() / ax * (frac_1_sqrt_pi + r)
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// A floating-point dtype: what differentiable ops compute on.
pub trait Float: Dtype + num_traits::Float {
    /// The type arithmetic happens in (f32 for f16/bf16/f32, f64 for f64).
    type Acc: Real;
    /// Widens to the accumulation type.
    fn to_acc(self) -> Self::Acc;
    /// Narrows from the accumulation type (round to nearest).
    fn from_acc(v: Self::Acc) -> Self;
}

macro_rules! float_impl {
    ($t:ty, $acc:ty, |$x:ident| $to:expr, |$v:ident| $from:expr) => {
        impl Float for $t {
            type Acc = $acc;
            #[inline(always)]
            fn to_acc(self) -> $acc {
                let $x = self;
                $to
            }
            #[inline(always)]
            fn from_acc($v: $acc) -> Self {
                $from
            }
        }
    };
}

float_impl!(f32, f32, |x| x, |v| v);
float_impl!(f64, f64, |x| x, |v| v);
float_impl!(f16, f32, |x| x.to_f32(), |v| f16::from_f32(v));
float_impl!(bf16, f32, |x| x.to_f32(), |v| bf16::from_f32(v));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Values from a table of erf to 16 digits.
        let cases = [
            (0.0, 0.0),
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (-3.0, -0.999_977_909_503_001_4),
            (5.0, 0.999_999_999_998_462_5),
        ];
        for (x, want) in cases {
            assert!(
                (libm_erf(x) - want).abs() < 1e-15,
                "erf({x}) = {} want {want}",
                libm_erf(x)
            );
        }
        assert!(libm_erf(f64::NAN).is_nan());
    }

    #[test]
    fn erf_f32_is_within_its_bound_everywhere() {
        let (mut worst, mut worst_rel) = (0.0f64, 0.0f64);
        for i in -60_000..=60_000 {
            let x = (i as f32 * 1e-4) as f64;
            let (got, want) = (erf_f32(x as f32) as f64, libm_erf(x));
            worst = worst.max((got - want).abs());
            if x != 0.0 && x.abs() < 0.6 {
                worst_rel = worst_rel.max(((got - want) / want).abs());
            }
        }
        assert!(worst < 3e-7, "max |erf_f32 - erf| = {worst}");
        assert!(worst_rel < 5e-7, "max relative error near 0: {worst_rel}");
        assert_eq!(erf_f32(0.0), 0.0);
        assert_eq!(erf_f32(20.0), 1.0);
        assert_eq!(erf_f32(-20.0), -1.0);
        assert!(erf_f32(f32::NAN).is_nan());
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
    }

    #[test]
    fn erf_rational_f32_is_within_its_bound_everywhere() {
        let mut worst = 0.0f64;
        for i in -50_000..=50_000 {
            let x = (i as f32 * 1e-4) as f64;
            let (got, want) = (erf_rational_f32(x as f32) as f64, libm_erf(x));
            // Relative, which also bounds the absolute error (|erf| <= 1).
            if x != 0.0 {
                worst = worst.max(((got - want) / want).abs());
            }
        }
        assert!(
            worst < 4e-7,
            "max relative error of erf_rational_f32: {worst}"
        );
        // Tiny arguments keep their relative precision.
        for x in [1e-30f32, 1e-10, 3e-5] {
            let want = x as f64 * std::f64::consts::FRAC_2_SQRT_PI;
            assert!(
                (erf_rational_f32(x) as f64 / want - 1.0).abs() < 2e-7,
                "{x}"
            );
        }
        assert_eq!(erf_rational_f32(0.0), 0.0);
        assert!(erf_rational_f32(-0.0).is_sign_negative());
        // Past the clamp, exactly ±1 (so `1 + erf` is exactly 0 for GELU).
        for x in [4.0f32, 4.5, 20.0, f32::INFINITY] {
            assert_eq!(erf_rational_f32(x), 1.0);
            assert_eq!(erf_rational_f32(-x), -1.0);
        }
        assert!(erf_rational_f32(f32::NAN).is_nan());
    }

    #[test]
    fn exp_f32_is_within_two_ulp() {
        for i in -8_700..=8_700 {
            let x = i as f32 * 1e-2;
            let (got, want) = (exp_f32(x), (x as f64).exp());
            let rel = ((got as f64 - want) / want).abs();
            assert!(rel < 2.5e-7, "exp({x}) = {got}, want {want}");
        }
        // The ends: gradual underflow, overflow, and the special values.
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-104.0), 0.0);
        // A subnormal result keeps what precision its bits allow.
        let sub = exp_f32(-90.0) as f64;
        assert!((sub / (-90f64).exp() - 1.0).abs() < 1e-5, "{sub}");
        assert!(exp_f32(88.5) as f64 / 88.5f64.exp() - 1.0 < 1e-6);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn tanh_f32_is_within_its_bound_everywhere() {
        let mut worst = 0f64;
        for i in -40_000..=40_000 {
            // Dense near 0 (where the series meets the exp form), sparse out to 10.
            let x = (i as f32 * 2.5e-4).powi(3).clamp(-10.0, 10.0);
            let (got, want) = (tanh_f32(x), (x as f64).tanh());
            if want != 0.0 {
                worst = worst.max(((got as f64 - want) / want).abs());
            }
        }
        assert!(worst < 2e-7, "tanh within {worst:e} relative");
        assert_eq!(tanh_f32(0.0), 0.0);
        assert_eq!(tanh_f32(1e-30), 1e-30);
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh_f32(-20.0), -1.0);
        assert!(tanh_f32(f32::NAN).is_nan());
    }

    #[test]
    fn casts_follow_torch_rules() {
        assert_eq!(i64::from_f64(-2.7), -2);
        assert!(bool::from_f64(0.5));
        assert_eq!(
            f16::from_f64(1.0 / 3.0).to_f64(),
            f16::from_f32(1.0 / 3.0).to_f64()
        );
    }
}
