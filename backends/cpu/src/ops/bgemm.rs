//! bf16 products with f32 sums on Intel AMX tiles (`tdpbf16ps`), for CPUs
//! that have them (Sapphire Rapids and later), chosen at run time.
//!
//! One `tdpbf16ps` multiplies a 16 x 32 tile of bf16 by a 32 x 16 one and
//! adds the 16 x 16 f32 products to an accumulator tile: 8192 multiply-adds
//! per instruction, where an AVX-512 FMA does 16. The operands are packed
//! first, as the tiles read them: the left one in 16-row blocks of 16 x 32
//! values, the right one in 16-column blocks in the pairs layout the
//! instruction takes (two consecutive depths of one column side by side).
//! Packing is also where an f32 operand is rounded to bf16 (autocast's
//! cast, fused into the copy), and where padding to whole tiles is added
//! (zeros, which add nothing). A block of 32 x 32 outputs keeps its four
//! accumulator tiles for the whole depth, so each output is written once,
//! its sum in f32, then the bias (if any) and the rounding (if asked).
//!
//! Sums are accumulated in f32 in a fixed order for given sizes (depth in
//! chunks of 32, pairs within), whatever the threads: the same inputs give
//! the same bits on every AMX CPU. Like every AMX and AVX-512 BF16
//! instruction, `tdpbf16ps` treats subnormal inputs and results as zero.
//!
//! On a CPU with AVX-512 BF16 but no tiles (AMD Zen 4, Intel Cooper Lake)
//! the same packed operands can feed `vdpbf16ps` instead ([`block_dp`]):
//! each instruction multiplies a broadcast pair of one left row's depths by
//! a packed pair row of 16 right columns, 32 multiply-adds. It runs by
//! default on AMD's CPUs (on Zen 4 twice the f32 kernel's rate), and on
//! Intel's only when `FORMA_BF16_DOT=1` asks: there (the instruction has
//! an f32 FMA pair's throughput) it is slower than the f32 kernel.
//!
//! Linux hands the tile state to a process only when asked
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), which [`available`] does once; each
//! thread loads the tile configuration before it uses the tiles and
//! releases it after ([`Tiles`]). `FORMA_AMX=0` in the environment turns the
//! kernel off (the products then widen to f32, as on other CPUs).

use super::matmul::Operand;
use crate::cast::{round_bits, round_f32};
use half::bf16;
use std::any::TypeId;
use std::arch::asm;
use std::arch::x86_64::{
    __m512, __m512i, _mm256_mask_storeu_epi16, _mm256_maskz_loadu_epi16, _mm512_add_epi32,
    _mm512_add_ps, _mm512_and_si512, _mm512_castps_si512, _mm512_castsi256_si512,
    _mm512_castsi512_ps, _mm512_cmp_ps_mask, _mm512_cvtepi32_epi16, _mm512_cvtepu16_epi32,
    _mm512_inserti64x4, _mm512_mask_blend_epi32, _mm512_mask_storeu_ps, _mm512_maskz_loadu_epi16,
    _mm512_maskz_loadu_ps, _mm512_or_si512, _mm512_set1_epi32, _mm512_setzero_si512,
    _mm512_shuffle_i32x4, _mm512_slli_epi32, _mm512_srli_epi32, _mm512_storeu_si512,
    _mm512_unpackhi_epi32, _mm512_unpackhi_epi64, _mm512_unpacklo_epi32, _mm512_unpacklo_epi64,
    _CMP_UNORD_Q,
};
use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

/// Rows of a tile, and columns of an f32 tile.
const T: usize = 16;
/// Depth of one tile product: 32 bf16 values in a 64-byte tile row.
const KC: usize = 32;
/// 16-bit values in one packed tile (1 KiB).
const TILE: usize = T * KC;
/// Bytes of packed left operand kept hot across the right operand's
/// column panels (a part of the 2 MiB L2 of the CPUs with AMX).
const A_BLOCK_BYTES: usize = 512 << 10;

/// Which bf16 instructions the products run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AMX tiles (`tdpbf16ps`).
    Amx,
    /// AVX-512 BF16 (`vdpbf16ps`: 16 lanes, each a pair of products),
    /// where there are no tiles (AMD Zen 4, Intel Cooper Lake).
    Avx512Bf16,
}

/// The bf16 instructions this process runs products on (the tile state
/// asked for once; `FORMA_AMX=0` leaves the tiles out; AVX-512 BF16 as
/// [`dot_wanted`] says), or `None`: products widen to f32.
pub(crate) fn isa() -> Option<Isa> {
    static ISA: OnceLock<Option<Isa>> = OnceLock::new();
    // Every CPU with either has AVX-512, which packing uses.
    *ISA.get_or_init(|| {
        if !crate::simd::has_avx512() {
            return None;
        }
        let amx_allowed = std::env::var("FORMA_AMX").map_or(true, |v| v != "0");
        if amx_allowed && detect() {
            Some(Isa::Amx)
        } else if dot_wanted() && std::arch::is_x86_feature_detected!("avx512bf16") {
            Some(Isa::Avx512Bf16)
        } else {
            None
        }
    })
}

/// Whether products run on `vdpbf16ps` where the CPU has it and no tiles:
/// `FORMA_BF16_DOT=1` or `0` says; unset, on AMD's CPUs and not on
/// Intel's. On Zen 4 (two threads, the f32 kernel at 183-199 GFLOP/s) it
/// ran bf16 products at 284 / 366 / 386 GFLOP/s (512 / 1024 / 2048
/// square, twice the f32 rate at the larger two); on an Intel Xeon with
/// the tiles left out it reached 150-165 against the f32 kernel's
/// 246-274, so products widen to f32 there.
fn dot_wanted() -> bool {
    match std::env::var("FORMA_BF16_DOT").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => !crate::simd::is_intel(),
    }
}

/// Whether [`bgemm`] runs on this CPU.
pub(crate) fn available() -> bool {
    isa().is_some()
}

#[cfg(target_os = "linux")]
fn detect() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    if __cpuid(0).eax < 7 {
        return false;
    }
    // CPUID.7.0:EDX bit 22 AMX-BF16, bit 24 AMX-TILE; CPUID.1:ECX bit 27
    // OSXSAVE (XGETBV usable).
    let edx = __cpuid_count(7, 0).edx;
    if (edx >> 22) & 1 == 0 || (edx >> 24) & 1 == 0 || (__cpuid(1).ecx >> 27) & 1 == 0 {
        return false;
    }
    // SAFETY: OSXSAVE is set, so XGETBV runs; it reads a register.
    let xcr0 = unsafe { xgetbv0() };
    // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS saves tile state.
    if (xcr0 >> 17) & 3 != 3 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    const SYS_ARCH_PRCTL: i64 = 158;
    let ret: i64;
    // SAFETY: the `arch_prctl` system call with these arguments asks for
    // permission to use the tile data state; it reads and writes no memory
    // of ours, and `syscall` clobbers only rcx and r11 (declared).
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn detect() -> bool {
    false
}

#[cfg(target_os = "linux")]
#[target_feature(enable = "xsave")]
fn xgetbv0() -> u64 {
    // SAFETY: the caller checked OSXSAVE; `xsave` is enabled here.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}

/// A value packed as bf16: bf16 as it is, f32 rounded to the nearest
/// (ties to even), as `half::bf16::from_f32` does.
pub(crate) trait ToBf16: Copy + Send + Sync + 'static {
    /// The bf16 bits of the value.
    fn bits(self) -> u16;
}

impl ToBf16 for bf16 {
    #[inline(always)]
    fn bits(self) -> u16 {
        self.to_bits()
    }
}

impl ToBf16 for f32 {
    #[inline(always)]
    fn bits(self) -> u16 {
        round_bits(self)
    }
}

/// What a product's f32 sums are stored as: f32, or bf16 (each sum
/// rounded to the nearest as it is written, as [`round_bits`] rounds).
pub(crate) trait SumOut: Copy + Send + Sync + 'static {
    /// Whether the sums are stored as bf16.
    const BF16: bool;
    /// One sum as stored.
    fn from_sum(v: f32) -> Self;
}

impl SumOut for f32 {
    const BF16: bool = false;
    #[inline(always)]
    fn from_sum(v: f32) -> f32 {
        v
    }
}

impl SumOut for bf16 {
    const BF16: bool = true;
    #[inline(always)]
    fn from_sum(v: f32) -> bf16 {
        bf16::from_bits(round_bits(v))
    }
}

/// A 64-byte aligned buffer of packed 16-bit values, taken from the
/// calling thread's spares (its contents unspecified: the packers write
/// every value, padding included) and given back when dropped, so that a
/// product does not fault in fresh pages for its packed operands.
struct Packed {
    buf: Vec<u16>,
    skip: usize,
    len: usize,
}

thread_local! {
    /// Buffers of finished products on this thread, for the next (at most
    /// two: a product packs two operands).
    static SPARE: RefCell<Vec<Vec<u16>>> = const { RefCell::new(Vec::new()) };
}

impl Packed {
    fn new(len: usize) -> Self {
        let need = len + 32;
        let spare = SPARE.with(|s| {
            let mut s = s.borrow_mut();
            let fit = s.iter().position(|b| b.len() >= need);
            fit.map(|i| s.swap_remove(i))
        });
        let buf = spare.unwrap_or_else(|| vec![0u16; need]);
        let skip = buf.as_ptr().align_offset(64);
        Packed { buf, skip, len }
    }

    fn slice_mut(&mut self) -> &mut [u16] {
        &mut self.buf[self.skip..self.skip + self.len]
    }

    fn ptr(&self) -> *const u16 {
        self.buf[self.skip..].as_ptr()
    }
}

impl Drop for Packed {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        // Keeps the two largest.
        let _ = SPARE.try_with(|s| {
            let mut s = s.borrow_mut();
            s.push(buf);
            s.sort_by_key(|b| std::cmp::Reverse(b.len()));
            s.truncate(2);
        });
    }
}

/// Packs `a` (`m x k`) as 16-row blocks, each `chunks` tiles of 16 x 32.
fn pack_a<A: ToBf16>(a: &Operand<'_, A>, m: usize, k: usize, chunks: usize) -> Packed {
    let mut p = Packed::new(m.div_ceil(T) * chunks * TILE);
    crate::par::units_mut(p.slice_mut(), chunks * TILE, |first, out| {
        for (bi, block) in out.chunks_mut(chunks * TILE).enumerate() {
            let r0 = (first + bi) * T;
            // SAFETY: `bgemm` checked `available()`, which includes AVX-512.
            unsafe { pack_a_block(a, r0, T.min(m - r0), k, block) };
        }
    });
    p
}

/// One 16-row block of [`pack_a`]: rows `r0..r0 + rows` of `a`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn pack_a_block<A: ToBf16>(
    a: &Operand<'_, A>,
    r0: usize,
    rows: usize,
    k: usize,
    block: &mut [u16],
) {
    if rows < T || !k.is_multiple_of(KC) {
        // The padding (rows past the edge, depths past `k`) adds nothing.
        block.fill(0);
    }
    if a.cs == 1 || k == 1 {
        // Rows read along memory, 32 values a tile row (rounded 16 at a
        // time, the depths past `k` zero).
        for r in 0..rows {
            let start = a.off + (r0 + r) * a.rs;
            for c in 0..k.div_ceil(KC) {
                let v = pairs(a.data, start + c * KC, KC.min(k - c * KC));
                let dst = &mut block[c * TILE + r * KC..][..KC];
                // SAFETY: 32 values (64 bytes) inside `dst`.
                unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) };
            }
        }
    } else if a.rs == 1 {
        // A transposed view (the `g^T` of a weight's gradient): the 16
        // rows of one depth are adjacent; read them so, a tile at a time,
        // and transpose the tile in registers.
        for c in 0..k.div_ceil(KC) {
            let depth = KC.min(k - c * KC);
            let mut tile = [[0u16; T]; KC];
            for (d, t) in tile[..depth].iter_mut().enumerate() {
                let start = a.off + r0 + (c * KC + d) * a.cs;
                for (t, &v) in t.iter_mut().zip(&a.data[start..start + rows]) {
                    *t = v.bits();
                }
            }
            let dst = &mut block[c * TILE..][..TILE];
            for r in 0..T {
                for d in 0..KC {
                    dst[r * KC + d] = tile[d][r];
                }
            }
        }
    } else {
        // Any other strides: element by element.
        for kk in 0..k {
            let (c, d) = (kk / KC, kk % KC);
            for r in 0..rows {
                block[c * TILE + r * KC + d] = a.data[a.off + (r0 + r) * a.rs + kk * a.cs].bits();
            }
        }
    }
}

/// Packs `b` (`k x n`) as 16-column blocks, each `chunks` tiles in the
/// pairs layout: depth `2q + s` of column `j` at `q * 32 + j * 2 + s`.
fn pack_b<B: ToBf16>(b: &Operand<'_, B>, k: usize, n: usize, chunks: usize) -> Packed {
    let mut p = Packed::new(n.div_ceil(T) * chunks * TILE);
    crate::par::units_mut(p.slice_mut(), chunks * TILE, |first, out| {
        // Depth tiles outermost: the 32 rows of one tile are read for every
        // block of the task while they are hot. A block at a time walked
        // all `k` rows for 32 bytes each, a new page per row once a row
        // is 4 KB (perf, a 2048-square bf16 product on an Intel Xeon:
        // packing `b` went from 14.6% of the samples to 11.6%).
        for c in 0..chunks {
            for (bi, block) in out.chunks_mut(chunks * TILE).enumerate() {
                let c0 = (first + bi) * T;
                // SAFETY: as in `pack_a`.
                unsafe { pack_b_block(b, c0, T.min(n - c0), k, c, block) };
            }
        }
    });
    p
}

/// Depth tile `c` of one 16-column block of [`pack_b`]: columns `c0..c0 +
/// cols` of `b`, depths `32 c..32 (c + 1)`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn pack_b_block<B: ToBf16>(
    b: &Operand<'_, B>,
    c0: usize,
    cols: usize,
    k: usize,
    c: usize,
    block: &mut [u16],
) {
    let depths = c * KC..k.min((c + 1) * KC);
    if cols < T || depths.len() < KC {
        // The padding (columns past the edge, depths past `k`) adds nothing.
        block[c * TILE..][..TILE].fill(0);
    }
    let at = |kk: usize| (kk / KC) * TILE + ((kk % KC) / 2) * KC + kk % 2;
    if b.cs == 1 {
        // Rows read along memory: the block's columns of a pair of rows
        // (of one row, the last of an odd depth) interleaved in a vector,
        // the columns past the edge zero.
        for kk in depths.step_by(2) {
            let start = b.off + kk * b.rs + c0;
            let lo = lanes(b.data, start, cols);
            let v = if kk + 1 < k {
                let hi = lanes(b.data, start + b.rs, cols);
                _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi))
            } else {
                lo
            };
            let dst = &mut block[at(kk)..][..KC];
            // SAFETY: 32 values (64 bytes) inside `dst`.
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) };
        }
    } else if b.rs == 1 {
        // A transposed view (a linear layer's weight): each column's depths
        // are adjacent; read up to 32 of them a column as pairs, then
        // transpose the 16 x 16 pairs in registers (the columns and depths
        // past the edges zero).
        let depth = depths.len();
        let rows: [__m512i; T] = std::array::from_fn(|j| {
            if j < cols {
                pairs(b.data, b.off + (c0 + j) * b.cs + c * KC, depth)
            } else {
                _mm512_setzero_si512()
            }
        });
        let dst = &mut block[c * TILE..][..TILE];
        for (q, v) in transpose(rows).into_iter().enumerate() {
            let at = &mut dst[q * KC..][..KC];
            // SAFETY: 32 values (64 bytes) inside `dst`.
            unsafe { _mm512_storeu_si512(at.as_mut_ptr().cast(), v) };
        }
    } else {
        // Any other strides: element by element.
        for j in 0..cols {
            let col = b.off + (c0 + j) * b.cs;
            for kk in depths.clone() {
                block[at(kk) + 2 * j] = b.data[col + kk * b.rs].bits();
            }
        }
    }
}

/// The `count` (at most 32) values `data[at..at + count]` as bf16 pairs,
/// zeros after them: lane `q` holds the bits of value `2q` in its low half
/// and of value `2q + 1` in its high half (an f32 rounded as
/// [`round_bits`] rounds, NaN included).
///
/// # Panics
/// If `data` has fewer than `at + count` values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn pairs<B: ToBf16>(data: &[B], at: usize, count: usize) -> __m512i {
    let src = &data[at..at + count];
    if TypeId::of::<B>() == TypeId::of::<f32>() {
        let lo = _mm512_cvtepi32_epi16(lanes(data, at, count.min(T)));
        let hi = _mm512_cvtepi32_epi16(lanes(data, at + T.min(count), count.saturating_sub(T)));
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    } else {
        debug_assert_eq!(TypeId::of::<B>(), TypeId::of::<bf16>());
        // SAFETY: `B` is `bf16` (the other `ToBf16`), 16 bits of plain
        // data; the mask reads the first `count` of them, inside `src`.
        unsafe { _mm512_maskz_loadu_epi16(mask(count), src.as_ptr().cast()) }
    }
}

/// The `count` (at most 16) values `data[at..at + count]` as bf16 bits,
/// each in the low half of a 32-bit lane, zero lanes after them (an f32
/// rounded as [`round_bits`] rounds).
///
/// # Panics
/// If `data` has fewer than `at + count` values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn lanes<B: ToBf16>(data: &[B], at: usize, count: usize) -> __m512i {
    let src = &data[at..at + count];
    let m = mask(count) as u16;
    if TypeId::of::<B>() == TypeId::of::<f32>() {
        // SAFETY: `B` is `f32`; the mask reads the first `count` floats,
        // inside `src`.
        round16(unsafe { _mm512_maskz_loadu_ps(m, src.as_ptr().cast::<f32>()) })
    } else {
        // SAFETY: `B` is `bf16`, 16 bits of plain data; the mask reads the
        // first `count`, inside `src`.
        _mm512_cvtepu16_epi32(unsafe { _mm256_maskz_loadu_epi16(m, src.as_ptr().cast()) })
    }
}

/// The first `count` (at most 32) bits set.
#[inline(always)]
fn mask(count: usize) -> u32 {
    debug_assert!(count <= 32);
    ((1u64 << count) - 1) as u32
}

/// [`round_bits`] on 16 lanes: the bf16 bits in each lane's low half.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn round16(v: __m512) -> __m512i {
    let b = _mm512_castps_si512(v);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let nearest = _mm512_srli_epi32::<16>(_mm512_add_epi32(
        b,
        _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb),
    ));
    let nan = _mm512_or_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(0x40));
    _mm512_mask_blend_epi32(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v), nearest, nan)
}

/// The 16 x 16 transpose of 32-bit lanes: lane `j` of result `q` is lane
/// `q` of `rows[j]`. Pairs of rows interleave by lanes, then by pairs of
/// lanes (each group of four rows is then in 4 x 4 blocks, one a 128-bit
/// lane), then the 128-bit lanes move across the groups.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn transpose(rows: [__m512i; T]) -> [__m512i; T] {
    // `v[g][w]`, 128-bit lane `l`: rows `4g..4g + 4` of column `4l + w`.
    let v: [[__m512i; 4]; 4] = std::array::from_fn(|g| {
        let r = &rows[4 * g..4 * g + 4];
        let (t0, t1) = (
            _mm512_unpacklo_epi32(r[0], r[1]),
            _mm512_unpackhi_epi32(r[0], r[1]),
        );
        let (t2, t3) = (
            _mm512_unpacklo_epi32(r[2], r[3]),
            _mm512_unpackhi_epi32(r[2], r[3]),
        );
        [
            _mm512_unpacklo_epi64(t0, t2),
            _mm512_unpackhi_epi64(t0, t2),
            _mm512_unpacklo_epi64(t1, t3),
            _mm512_unpackhi_epi64(t1, t3),
        ]
    });
    let mut out = [_mm512_setzero_si512(); T];
    for w in 0..4 {
        // Lanes 0, 2 (0x88) and 1, 3 (0xdd) of each of two sources.
        let x = _mm512_shuffle_i32x4::<0x88>(v[0][w], v[1][w]);
        let y = _mm512_shuffle_i32x4::<0xdd>(v[0][w], v[1][w]);
        let z = _mm512_shuffle_i32x4::<0x88>(v[2][w], v[3][w]);
        let u = _mm512_shuffle_i32x4::<0xdd>(v[2][w], v[3][w]);
        out[w] = _mm512_shuffle_i32x4::<0x88>(x, z);
        out[4 + w] = _mm512_shuffle_i32x4::<0x88>(y, u);
        out[8 + w] = _mm512_shuffle_i32x4::<0xdd>(x, z);
        out[12 + w] = _mm512_shuffle_i32x4::<0xdd>(y, u);
    }
    out
}

/// The tile configuration of this kernel: tiles 0-7 all 16 rows of 64
/// bytes (0-3 accumulators, 4-5 left blocks, 6-7 right blocks).
#[repr(C, align(64))]
struct Config([u8; 64]);

/// The tiles configured on this thread; released when dropped.
struct Tiles(());

impl Tiles {
    fn load() -> Self {
        let mut cfg = Config([0; 64]);
        cfg.0[0] = 1; // palette 1
        for t in 0..8 {
            cfg.0[16 + 2 * t] = (KC * 2) as u8; // bytes per row
            cfg.0[48 + t] = T as u8; // rows
        }
        // SAFETY: the caller runs on AMX (`isa()` said so: the only way
        // here is `bgemm_on` with `Isa::Amx`); the configuration is a valid
        // palette-1 one, read from an aligned 64-byte buffer.
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
        Tiles(())
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `load`.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// Where one block of outputs goes: row-major with `ld` values a row (f32
/// sums, or bf16 ones as `Out<bf16>`).
#[derive(Clone, Copy)]
struct Out<T = f32> {
    ptr: *mut T,
    ld: usize,
    m: usize,
    n: usize,
}

// SAFETY: threads write disjoint blocks of the output through it.
unsafe impl<T> Send for Out<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Out<T> {}

/// A 32 x 32 block of f32 sums on its way to the output (a bf16 one, or
/// an f32 one with an epilogue).
#[repr(C, align(64))]
struct Staged([f32; 4 * T * T]);

/// Multiplies `MR` packed left blocks by `NR` packed right blocks over
/// `chunks` depth tiles and stores the `16 MR x 16 NR` sums at output row
/// `r0`, column `c0` (clipped to the output).
///
/// # Safety
/// The tiles are loaded on this thread (`Tiles`); `a[i]` and `b[j]` (for
/// `i < MR`, `j < NR`) point at `chunks` packed tiles each; `out` is valid
/// for writes of its `m x n` floats, and no other thread writes this block.
#[inline(always)]
unsafe fn block<const MR: usize, const NR: usize>(
    a: [*const u16; 2],
    b: [*const u16; 2],
    chunks: usize,
    out: Out,
    r0: usize,
    c0: usize,
) {
    const S: usize = KC * 2;
    // SAFETY (every asm! below): tile instructions on the configured
    // tiles; the loads read one packed tile each (within the caller's
    // buffers), the stores write 16 rows of 64 bytes inside `out` or `tmp`.
    unsafe {
        asm!("tilezero tmm0", options(nostack, nomem));
        if NR == 2 {
            asm!("tilezero tmm1", options(nostack, nomem));
        }
        if MR == 2 {
            asm!("tilezero tmm2", options(nostack, nomem));
            if NR == 2 {
                asm!("tilezero tmm3", options(nostack, nomem));
            }
        }
        for c in 0..chunks {
            let o = c * TILE;
            asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) a[0].add(o), s = in(reg) S, options(nostack, readonly));
            if MR == 2 {
                asm!("tileloadd tmm5, [{p} + {s}*1]", p = in(reg) a[1].add(o), s = in(reg) S, options(nostack, readonly));
            }
            asm!("tileloadd tmm6, [{p} + {s}*1]", p = in(reg) b[0].add(o), s = in(reg) S, options(nostack, readonly));
            if NR == 2 {
                asm!("tileloadd tmm7, [{p} + {s}*1]", p = in(reg) b[1].add(o), s = in(reg) S, options(nostack, readonly));
            }
            asm!("tdpbf16ps tmm0, tmm4, tmm6", options(nostack, nomem));
            if NR == 2 {
                asm!("tdpbf16ps tmm1, tmm4, tmm7", options(nostack, nomem));
            }
            if MR == 2 {
                asm!("tdpbf16ps tmm2, tmm5, tmm6", options(nostack, nomem));
                if NR == 2 {
                    asm!("tdpbf16ps tmm3, tmm5, tmm7", options(nostack, nomem));
                }
            }
        }
        let mut tmp = [0f32; T * T];
        macro_rules! store {
            ($tile:literal, $i:expr, $j:expr) => {{
                let (r, c) = (r0 + $i * T, c0 + $j * T);
                if r + T <= out.m && c + T <= out.n {
                    let p = out.ptr.add(r * out.ld + c);
                    asm!(concat!("tilestored [{p} + {s}*1], tmm", $tile), p = in(reg) p, s = in(reg) out.ld * 4, options(nostack));
                } else {
                    asm!(concat!("tilestored [{p} + {s}*1], tmm", $tile), p = in(reg) tmp.as_mut_ptr(), s = in(reg) T * 4, options(nostack));
                    for i in 0..T.min(out.m - r) {
                        let row = out.ptr.add((r + i) * out.ld + c);
                        std::ptr::copy_nonoverlapping(tmp.as_ptr().add(i * T), row, T.min(out.n - c));
                    }
                }
            }};
        }
        store!("0", 0, 0);
        if NR == 2 && c0 + T < out.n {
            store!("1", 0, 1);
        }
        if MR == 2 && r0 + T < out.m {
            store!("2", 1, 0);
            if NR == 2 && c0 + T < out.n {
                store!("3", 1, 1);
            }
        }
    }
}

/// The AVX-512 BF16 form of [`block`] for one 16-row left block: `16 x
/// 16 NR` sums, eight rows at a time in 8 NR accumulators of 16 lanes.
/// Each `vdpbf16ps` multiplies one row's pair of depths (broadcast) by a
/// packed pair row of the right block, which is laid out for it as for
/// the tiles.
///
/// # Safety
/// The CPU has AVX-512 F and BF16; `a` and `b[j]` (`j < NR`) point at
/// `chunks` packed tiles each; `out` as for [`block`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn block_dp<const NR: usize>(
    a: *const u16,
    b: [*const u16; 2],
    chunks: usize,
    out: Out,
    r0: usize,
    c0: usize,
) {
    use std::arch::x86_64::{
        __m512, __m512bh, __m512i, _mm512_dpbf16_ps, _mm512_loadu_si512, _mm512_set1_epi32,
        _mm512_setzero_ps,
    };
    /// 32 bf16 bit patterns as the vector type `vdpbf16ps` takes.
    #[inline(always)]
    fn bh(v: __m512i) -> __m512bh {
        // SAFETY: both are 64 bytes of plain bits, any pattern valid.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }
    const H: usize = T / 2;
    // Each row's sums go straight to the output (clipped by masks): with
    // a copy through an array of the block's own, 512-square products ran
    // at 284 GFLOP/s on Zen 4 (2 threads), without it at 402.
    let cols = (NR * T).min(out.n - c0);
    let rows = T.min(out.m - r0);
    for half in 0..2 {
        if half * H >= rows {
            break;
        }
        let mut acc: [[__m512; 2]; H] = [[_mm512_setzero_ps(); 2]; H];
        for c in 0..chunks {
            let at = c * TILE;
            for q in 0..KC / 2 {
                // SAFETY (the loads): inside the packed tiles, as the
                // caller promises; vectors of 32 bf16 bit patterns are
                // `__m512bh` values, unaligned loads.
                let (b0, b1) = unsafe {
                    let b0 = bh(_mm512_loadu_si512(b[0].add(at + q * KC).cast()));
                    let b1 = if NR == 2 {
                        bh(_mm512_loadu_si512(b[1].add(at + q * KC).cast()))
                    } else {
                        b0
                    };
                    (b0, b1)
                };
                for (r, acc) in acc.iter_mut().enumerate() {
                    let row = half * H + r;
                    // SAFETY: as above; the pair is two adjacent depths.
                    let pair =
                        unsafe { a.add(at + row * KC + 2 * q).cast::<i32>().read_unaligned() };
                    let va = bh(_mm512_set1_epi32(pair));
                    acc[0] = _mm512_dpbf16_ps(acc[0], va, b0);
                    if NR == 2 {
                        acc[1] = _mm512_dpbf16_ps(acc[1], va, b1);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate().take(rows - half * H) {
            // SAFETY: a row inside `out` (clipped).
            let row = unsafe { out.ptr.add((r0 + half * H + r) * out.ld + c0) };
            for (j, &v) in acc.iter().enumerate().take(NR) {
                if j * T >= cols {
                    break;
                }
                let keep = mask(T.min(cols - j * T)) as u16;
                // SAFETY: the lanes kept are inside `out` (clipped), a
                // block no other thread writes.
                unsafe { _mm512_mask_storeu_ps(row.add(j * T), keep, v) };
            }
        }
    }
}

/// `dst = a @ b` for an `m x k` `a` and a `k x n` `b`, each value rounded
/// to bf16 as it is packed, the products summed in f32; then `bias[j]`
/// added to column `j` (when given) and the result rounded to bf16 (when
/// `round`, kept in f32; always, when `dst` is bf16: each block's sums
/// are rounded as they are written, without an f32 copy of the output).
/// `dst` is row-major `m x n`, written in full.
/// Runs on the threads when `parallel` and the product is large.
///
/// # Panics
/// If the CPU has no AMX bf16 tiles ([`available`]), `dst` is not `m * n`
/// long, `bias` not `n`, or an operand does not fit its storage.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bgemm<A: ToBf16, B: ToBf16, O: SumOut>(
    dst: &mut [MaybeUninit<O>],
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_, A>,
    b: Operand<'_, B>,
    bias: Option<&[f32]>,
    round: bool,
    parallel: bool,
) {
    let isa = isa().expect("the CPU has no bf16 products (AMX or AVX-512 BF16)");
    bgemm_on(isa, dst, m, n, k, a, Rhs::Plain(b), bias, round, parallel);
}

/// A right operand (`k x n`) packed once as [`bgemm`] packs it, for
/// products that share it (a weight in inference): the same bits as
/// packing it on every call.
pub(crate) struct PackedB {
    k: usize,
    n: usize,
    packed: Packed,
}

impl PackedB {
    /// Packs `b` (`k x n`).
    ///
    /// # Panics
    /// If the CPU has no bf16 products ([`available`]).
    pub(crate) fn new<B: ToBf16>(b: Operand<'_, B>, k: usize, n: usize) -> Self {
        assert!(
            available(),
            "the CPU has no bf16 products (AMX or AVX-512 BF16)"
        );
        let b = b.clamped(k, n);
        PackedB {
            k,
            n,
            packed: pack_b(&b, k, n, k.div_ceil(KC)),
        }
    }

    /// Depth and columns.
    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }
}

/// [`bgemm`] with its right operand packed beforehand.
///
/// # Panics
/// If `b` is not `k x n` (`k` from `a`'s columns), or as for [`bgemm`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn bgemm_packed<A: ToBf16, O: SumOut>(
    dst: &mut [MaybeUninit<O>],
    m: usize,
    a: Operand<'_, A>,
    b: &PackedB,
    bias: Option<&[f32]>,
    round: bool,
    parallel: bool,
) {
    let isa = isa().expect("the CPU has no bf16 products (AMX or AVX-512 BF16)");
    let (k, n) = b.dims();
    bgemm_on::<A, f32, O>(isa, dst, m, n, k, a, Rhs::Packed(b), bias, round, parallel);
}

/// The right operand of a product: as it is, or packed beforehand.
enum Rhs<'a, B> {
    Plain(Operand<'a, B>),
    Packed(&'a PackedB),
}

/// [`bgemm`] on the instructions `isa`, which the caller checked this CPU
/// runs (the tests take each that it does).
#[allow(clippy::too_many_arguments)]
fn bgemm_on<A: ToBf16, B: ToBf16, O: SumOut>(
    isa: Isa,
    dst: &mut [MaybeUninit<O>],
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_, A>,
    b: Rhs<'_, B>,
    bias: Option<&[f32]>,
    round: bool,
    parallel: bool,
) {
    assert_eq!(dst.len(), m * n, "bgemm destination length");
    if let Rhs::Packed(p) = &b {
        assert_eq!(p.dims(), (k, n), "bgemm packed operand's sizes");
    }
    if let Some(v) = bias {
        assert_eq!(v.len(), n, "bgemm bias length");
    }
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for row in dst.chunks_exact_mut(n) {
            for (j, d) in row.iter_mut().enumerate() {
                let v = bias.map_or(0.0, |b| b[j]);
                d.write(O::from_sum(if round { round_f32(v) } else { v }));
            }
        }
        return;
    }
    let chunks = k.div_ceil(KC);
    let a = a.clamped(m, k);
    let pa = pack_a(&a, m, k, chunks);
    let owned;
    let pb = match b {
        Rhs::Plain(b) => {
            owned = pack_b(&b.clamped(k, n), k, n, chunks);
            &owned
        }
        Rhs::Packed(p) => &p.packed,
    };
    // The output, as `O`: f32 written in place by the tiles when nothing
    // follows them, else through a staged block per 32 x 32.
    let out = Out::<O> {
        ptr: dst.as_mut_ptr().cast(),
        ld: n,
        m,
        n,
    };
    // Where the tiles go: the output, or a staged block when an epilogue
    // follows. The tiles' stores stay in L1 there; reading them back from
    // the output cost 25% of a biased 1024 x 2048 x 512 product (0.48 ms
    // of 1.96; staged: 0.18).
    let staged_out = O::BF16 || bias.is_some() || round;
    // The output as the tiles store to it in place (`O` is f32 whenever
    // nothing is staged).
    let direct = Out {
        ptr: out.ptr.cast::<f32>(),
        ld: n,
        m,
        n,
    };
    // Row panels and column panels of 32 (two tiles).
    let (rp, cp) = (m.div_ceil(2 * T), n.div_ceil(2 * T));
    // Row panels whose packed left blocks stay hot while every column
    // panel passes.
    let hot = (A_BLOCK_BYTES / (2 * T * chunks.max(1) * KC * 2)).max(1);
    let threads = if parallel && m * n * k >= 1 << 20 {
        crate::par::threads()
    } else {
        1
    };
    // Tasks: column ranges when there are enough column panels, else row
    // ranges; four a thread, so that a helper that wakes late still finds
    // work (with one task a thread, the caller ran both halves of a
    // 2048-square product on its own in some runs: half the speed).
    let by_cols = cp >= threads * 2 || cp >= rp;
    let tasks = if threads > 1 {
        (4 * threads).min(if by_cols { cp } else { rp })
    } else {
        1
    };
    let (pa_ptr, pb_ptr) = (pa.ptr() as usize, pb.ptr() as usize);
    let task = |t: usize| {
        let (cols, rows) = if by_cols {
            (cp * t / tasks..cp * (t + 1) / tasks, 0..rp)
        } else {
            (0..cp, rp * t / tasks..rp * (t + 1) / tasks)
        };
        let _tiles = (isa == Isa::Amx).then(Tiles::load);
        let (pa, pb) = (pa_ptr as *const u16, pb_ptr as *const u16);
        let blk = chunks * TILE;
        let (mb, nb) = (m.div_ceil(T), n.div_ceil(T));
        let mut staged = Staged([0.0; 4 * T * T]);
        let staging = Out {
            ptr: staged.0.as_mut_ptr(),
            ld: 2 * T,
            m: 2 * T,
            n: 2 * T,
        };
        let mut hot_start = rows.start;
        while hot_start < rows.end {
            let hot_end = (hot_start + hot).min(rows.end);
            for j in cols.clone() {
                for i in hot_start..hot_end {
                    let (ti, tj) = (2 * i, 2 * j);
                    // SAFETY: the packed buffers hold `mb` and `nb` blocks
                    // of `blk` values; blocks past them are not read (MR,
                    // NR 1). Tasks own disjoint panels of `out`. The
                    // CPU has AVX-512 (`available()`), for the epilogue.
                    unsafe {
                        let ap = [pa.add(ti * blk), pa.add((ti + 1).min(mb - 1) * blk)];
                        let bp = [pb.add(tj * blk), pb.add((tj + 1).min(nb - 1) * blk)];
                        let (r0, c0) = (ti * T, tj * T);
                        let (o, or, oc) = if staged_out {
                            (staging, 0, 0)
                        } else {
                            (direct, r0, c0)
                        };
                        match (isa, ti + 1 < mb, tj + 1 < nb) {
                            (Isa::Amx, true, true) => block::<2, 2>(ap, bp, chunks, o, or, oc),
                            (Isa::Amx, true, false) => block::<2, 1>(ap, bp, chunks, o, or, oc),
                            (Isa::Amx, false, true) => block::<1, 2>(ap, bp, chunks, o, or, oc),
                            (Isa::Amx, false, false) => block::<1, 1>(ap, bp, chunks, o, or, oc),
                            (Isa::Avx512Bf16, two_rows, two_cols) => {
                                for (t, &a) in ap.iter().enumerate().take(1 + usize::from(two_rows))
                                {
                                    let or = or + t * T;
                                    if two_cols {
                                        block_dp::<2>(a, bp, chunks, o, or, oc);
                                    } else {
                                        block_dp::<1>(a, bp, chunks, o, or, oc);
                                    }
                                }
                            }
                        }
                        // The epilogue on the block just staged.
                        if staged_out {
                            epilogue(&staged, out, r0, c0, bias, round);
                        }
                    }
                }
            }
            hot_start = hot_end;
        }
    };
    if tasks > 1 {
        crate::par::run(tasks, &task);
    } else {
        task(0);
    }
    drop(pa);
}

/// Writes the staged sums of the 32 x 32 output block at row `r0`,
/// column `c0` (clipped to the output), the bias (if any) added: to an
/// f32 output rounded to bf16 when `round`, to a bf16 one always (the
/// same bits as rounding in f32 and a cast).
///
/// # Safety
/// The CPU has AVX-512 (as for `pack_a`); the block is inside `out`, and
/// no other thread touches it.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
unsafe fn epilogue<O: SumOut>(
    staged: &Staged,
    out: Out<O>,
    r0: usize,
    c0: usize,
    bias: Option<&[f32]>,
    round: bool,
) {
    let cols = (2 * T).min(out.n - c0);
    for i in 0..(2 * T).min(out.m - r0) {
        for h in 0..cols.div_ceil(T) {
            let keep = mask(T.min(cols - h * T)) as u16;
            // SAFETY: the lanes kept are inside the staged row, the output
            // row (clipped) and the bias (`n` long), as the caller promises;
            // `O` is bf16 (16 bits) or f32, as `O::BF16` says.
            unsafe {
                let mut v = _mm512_maskz_loadu_ps(keep, staged.0.as_ptr().add(i * 2 * T + h * T));
                if let Some(b) = bias {
                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, b.as_ptr().add(c0 + h * T)));
                }
                let row = out.ptr.add((r0 + i) * out.ld + c0 + h * T);
                if O::BF16 {
                    _mm256_mask_storeu_epi16(row.cast(), keep, _mm512_cvtepi32_epi16(round16(v)));
                } else {
                    if round {
                        v = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(round16(v)));
                    }
                    _mm512_mask_storeu_ps(row.cast(), keep, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forma_core::Rng;

    /// `a @ b (+ bias)` in f64 from the bf16-rounded operands.
    fn reference(
        m: usize,
        n: usize,
        k: usize,
        a: &Operand<'_, f32>,
        b: &Operand<'_, f32>,
        bias: Option<&[f32]>,
    ) -> Vec<f64> {
        let r = |x: f32| f64::from(round_f32(x));
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = bias.map_or(0.0, |b| f64::from(b[j]));
                for p in 0..k {
                    s += r(a.data[a.off + i * a.rs + p * a.cs])
                        * r(b.data[b.off + p * b.rs + j * b.cs]);
                }
                out[i * n + j] = s;
            }
        }
        out
    }

    /// How the test operands are stored.
    #[derive(Clone, Copy, Debug)]
    enum Store {
        /// Row-major.
        Rows,
        /// The other way round, read transposed (the `g^T @ x` and
        /// `x @ w^T` of a linear layer).
        Transposed,
        /// Every other element of a row-major matrix twice as wide.
        Sparse,
    }

    /// The bf16 instructions this CPU runs (both on one with AMX).
    fn isas() -> Vec<Isa> {
        let mut v = Vec::new();
        if isa() == Some(Isa::Amx) {
            v.push(Isa::Amx);
        }
        if crate::simd::has_avx512() && std::arch::is_x86_feature_detected!("avx512bf16") {
            v.push(Isa::Avx512Bf16);
        }
        if v.is_empty() {
            eprintln!("no AMX or AVX-512 BF16 on this CPU: the kernels are not run here");
        }
        v
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        isa: Isa,
        m: usize,
        n: usize,
        k: usize,
        store: Store,
        bias: bool,
        round: bool,
        parallel: bool,
    ) {
        let mut rng = Rng::seed_from(m as u64 * 7919 + n as u64 * 31 + k as u64);
        let av: Vec<f32> = (0..2 * m * k + 3).map(|_| rng.normal() as f32).collect();
        let bv: Vec<f32> = (0..2 * k * n + 5).map(|_| rng.normal() as f32).collect();
        let biasv: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
        let ((ars, acs), (brs, bcs)) = match store {
            Store::Rows => ((k, 1), (n, 1)),
            Store::Transposed => ((1, m), (1, k)),
            Store::Sparse => ((2 * k, 2), (2 * n, 2)),
        };
        let a = Operand {
            data: &av,
            off: 3,
            rs: ars,
            cs: acs,
        };
        let b = Operand {
            data: &bv,
            off: 5,
            rs: brs,
            cs: bcs,
        };
        let bias = bias.then_some(&biasv[..]);
        let mut dst = vec![MaybeUninit::new(f32::NAN); m * n];
        bgemm_on(
            isa,
            &mut dst,
            m,
            n,
            k,
            a,
            Rhs::Plain(b),
            bias,
            round,
            parallel,
        );
        let want = reference(m, n, k, &a, &b, bias);
        for (e, (d, w)) in dst.iter().zip(&want).enumerate() {
            // SAFETY: bgemm wrote every element.
            let d = f64::from(unsafe { d.assume_init() });
            // f32 sums of k products of magnitude ~1, then a bf16 rounding.
            let tol = if round { w.abs() / 128.0 } else { 0.0 } + 1e-5 * (k as f64).max(1.0);
            assert!(
                (d - w).abs() <= tol,
                "{isa:?} {m}x{n}x{k} ({store:?}, bias {}, round {round}) at {e}: {d} vs {w}",
                bias.is_some()
            );
            if round {
                assert_eq!(
                    round_f32(d as f32),
                    d as f32,
                    "a rounded output is bf16-exact"
                );
            }
        }
        // A bf16 output holds the same sums, rounded as they are written.
        let mut half = vec![MaybeUninit::new(bf16::NAN); m * n];
        bgemm_on(
            isa,
            &mut half,
            m,
            n,
            k,
            a,
            Rhs::Plain(b),
            bias,
            round,
            parallel,
        );
        for (e, (h, d)) in half.iter().zip(&dst).enumerate() {
            // SAFETY: bgemm wrote every element of both.
            let (h, d) = unsafe { (h.assume_init(), d.assume_init()) };
            assert_eq!(
                h.to_bits(),
                round_bits(d),
                "{isa:?} {m}x{n}x{k} bf16 out at {e}"
            );
        }
    }

    #[test]
    fn products_match_f64_sums_of_the_rounded_operands() {
        for isa in isas() {
            for &(m, n, k) in &[
                (1, 1, 1),
                (16, 16, 32),
                (17, 15, 33),
                (33, 47, 31),
                (2, 70, 100),
                (64, 64, 64),
                (100, 3, 257),
                (5, 33, 0),
            ] {
                for store in [Store::Rows, Store::Transposed, Store::Sparse] {
                    run(isa, m, n, k, store, false, false, false);
                    run(isa, m, n, k, store, true, true, false);
                }
            }
            // Large enough to split over threads, both ways.
            run(isa, 300, 70, 200, Store::Transposed, true, false, true);
            run(isa, 70, 300, 200, Store::Rows, false, true, true);
        }
    }

    #[test]
    fn every_packing_path_lays_out_the_same_bits() {
        if !crate::simd::has_avx512() {
            eprintln!("no AVX-512 on this CPU: packing is not run here");
            return;
        }
        // Whole tiles and cut ones (35 columns, 71 depths), with values
        // that round to even, NaN and infinities among them.
        let (k, n) = (71, 35);
        let mut rng = Rng::seed_from(17);
        let mut vals: Vec<f32> = (0..k * n).map(|_| (rng.normal() * 1e3) as f32).collect();
        vals[3] = 1.0 + 1.0 / 256.0;
        vals[40] = f32::NAN;
        vals[77] = f32::NEG_INFINITY;
        vals[500] = f32::from_bits(0x7f7f_ffff);
        let at = |kk: usize, j: usize| vals[kk * n + j];
        // Row-major, transposed (column-major) and every other element.
        let rows = vals.clone();
        let cols: Vec<f32> = (0..n * k).map(|i| at(i % k, i / k)).collect();
        let mut sparse = vec![0f32; 2 * k * n];
        for kk in 0..k {
            for j in 0..n {
                sparse[2 * (kk * n + j)] = at(kk, j);
            }
        }
        let chunks = k.div_ceil(KC);
        fn packed<B: ToBf16>(data: &[B], rs: usize, cs: usize, k: usize, n: usize) -> Vec<u16> {
            let b = Operand {
                data,
                off: 0,
                rs,
                cs,
            };
            let p = pack_b(&b, k, n, k.div_ceil(KC));
            let len = n.div_ceil(T) * k.div_ceil(KC) * TILE;
            // SAFETY: `pack_b` filled `len` values from `ptr`.
            unsafe { std::slice::from_raw_parts(p.ptr(), len) }.to_vec()
        }
        // Packed buffers are reused: a first product of whole tiles (the
        // same buffer length) leaves no zeros where the padding goes.
        let ones = vec![1f32; 96 * 48];
        let full = packed(&ones, 48, 1, 96, 48);
        assert!(full.iter().all(|&v| v == bf16::ONE.to_bits()));
        let want = packed(&rows, n, 1, k, n);
        let low = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
        // Every value lands where the pairs layout says, rounded.
        for kk in 0..k {
            for j in 0..n {
                let p = (j / T) * chunks * TILE + (kk / KC) * TILE + ((kk % KC) / 2) * KC;
                let got = want[p + 2 * (j % T) + kk % 2];
                let x = at(kk, j);
                if x.is_nan() {
                    assert!(bf16::from_bits(got).is_nan());
                } else {
                    assert_eq!(got, bf16::from_f32(x).to_bits(), "depth {kk}, column {j}");
                }
            }
        }
        assert_eq!(packed(&cols, 1, k, k, n), want, "transposed f32");
        assert_eq!(packed(&low(&cols), 1, k, k, n), want, "transposed bf16");
        assert_eq!(packed(&sparse, 2 * n, 2, k, n), want, "strided f32");
        assert_eq!(packed(&low(&rows), n, 1, k, n), want, "row-major bf16");
    }

    /// A right operand packed once gives the bits of packing it in each
    /// product, for products of different heights sharing it.
    #[test]
    fn a_packed_operand_gives_the_bits_of_packing_it_each_time() {
        for isa in isas() {
            let (n, k) = (50, 70);
            let mut rng = Rng::seed_from(11);
            // `x @ w^T`: the right operand is a row-major `[n, k]` weight
            // read transposed, as a linear layer's is.
            let wv: Vec<f32> = (0..n * k).map(|_| rng.normal() as f32).collect();
            let biasv: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
            let w = Operand {
                data: &wv,
                off: 0,
                rs: 1,
                cs: k,
            };
            let packed = PackedB::new(w, k, n);
            for m in [1, 17, 40] {
                let av: Vec<f32> = (0..m * k).map(|_| rng.normal() as f32).collect();
                let a = Operand {
                    data: &av,
                    off: 0,
                    rs: k,
                    cs: 1,
                };
                let go = |rhs: Rhs<'_, f32>| {
                    let mut dst = vec![MaybeUninit::new(0f32); m * n];
                    bgemm_on(isa, &mut dst, m, n, k, a, rhs, Some(&biasv), true, true);
                    // SAFETY: bgemm wrote every element.
                    dst.iter()
                        .map(|d| unsafe { d.assume_init() }.to_bits())
                        .collect::<Vec<_>>()
                };
                assert_eq!(go(Rhs::Packed(&packed)), go(Rhs::Plain(w)), "{isa:?} m {m}");
            }
        }
    }

    #[test]
    fn threads_do_not_change_the_bits() {
        for isa in isas() {
            threads_on(isa);
        }
    }

    fn threads_on(isa: Isa) {
        let (m, n, k) = (130, 260, 300);
        let mut rng = Rng::seed_from(5);
        let av: Vec<f32> = (0..m * k).map(|_| rng.normal() as f32).collect();
        let bv: Vec<f32> = (0..k * n).map(|_| rng.normal() as f32).collect();
        let a = Operand {
            data: &av,
            off: 0,
            rs: k,
            cs: 1,
        };
        let b = Operand {
            data: &bv,
            off: 0,
            rs: n,
            cs: 1,
        };
        let go = |parallel| {
            let mut dst = vec![MaybeUninit::new(0f32); m * n];
            bgemm_on(
                isa,
                &mut dst,
                m,
                n,
                k,
                a,
                Rhs::Plain(b),
                None,
                false,
                parallel,
            );
            // SAFETY: bgemm wrote every element.
            dst.iter()
                .map(|d| unsafe { d.assume_init() }.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(go(false), go(true));
    }
}
