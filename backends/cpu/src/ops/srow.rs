//! One-row f32 products, `dst = a @ b` for a single row `a` (a token's
//! activations when a model generates with its KV cache), reading `b` in
//! place.
//!
//! The blocked product packs `b` before it multiplies: for one row of `a`
//! that is a copy of the whole weight for one multiply-add per element,
//! and a decoding step is a chain of such products (GPT-2 small's packing
//! took 33% of its generation time, the kernel 14%). Here `b` is streamed
//! once: with rows contiguous (`x @ w`, GPT-2's `Conv1D`) each row of `b`
//! is added into the output, scaled by its element of `a`; with columns
//! contiguous (`x @ w.t()`, a linear layer, a tied LM head) each output is
//! a dot product, summed in 16 lanes. The lanes are explicit, so the bits
//! are the same on every CPU that runs it (AVX2 or AVX-512 copies).

use super::sgemm::View;
use crate::simd::{run, Vectorized};
use std::mem::MaybeUninit;

/// Output columns per task.
const TASK: usize = 256;

/// Multiply-adds below which the product stays on one thread.
const PAR_WORK: usize = 1 << 16;

/// Lanes of a dot product's partial sums.
const LANES: usize = 16;

/// Whether [`srow`] computes this product: one row of `a`, and `b` with
/// contiguous rows, or with contiguous columns when `a` is contiguous too.
pub(crate) fn fits(m: usize, n: usize, k: usize, a: &View<'_>, b: &View<'_>) -> bool {
    m == 1 && n > 0 && k >= 16 && (b.cs == 1 || (b.rs == 1 && a.cs == 1))
}

/// `dst = a @ b` (one row of `n`, written in full) for a `1 x k` `a`, plus
/// `bias[j]` on column `j` when given (after the sum); `parallel` lets a
/// large product split its columns between threads.
///
/// # Panics
/// If [`fits`] does not hold, if `dst` is not `n` long or if an operand
/// does not fit its storage.
pub(crate) fn srow(
    dst: &mut [MaybeUninit<f32>],
    n: usize,
    k: usize,
    a: View<'_>,
    b: View<'_>,
    bias: Option<&[f32]>,
    parallel: bool,
) {
    assert!(fits(1, n, k, &a, &b), "srow: operands it does not take");
    assert_eq!(dst.len(), n, "srow destination length");
    a.check(1, k);
    b.check(k, n);
    let chunk = if parallel && n.saturating_mul(k) >= PAR_WORK {
        TASK
    } else {
        n
    };
    crate::par::chunks_mut(dst, chunk, |c, out| {
        let part = Part {
            a: &a,
            b: &b,
            k,
            j0: c * chunk,
            out,
            bias,
        };
        if b.cs == 1 {
            run(Rows(part));
        } else {
            run(Dots(part));
        }
    });
}

/// Columns `j0..j0 + out.len()` of the product.
struct Part<'a, 'o> {
    a: &'a View<'a>,
    b: &'a View<'a>,
    k: usize,
    j0: usize,
    out: &'o mut [MaybeUninit<f32>],
    bias: Option<&'a [f32]>,
}

impl Part<'_, '_> {
    /// Writes the sums, each plus its bias.
    #[inline(always)]
    fn write(self, sums: impl Iterator<Item = f32>) {
        for (j, (o, s)) in self.out.iter_mut().zip(sums).enumerate() {
            o.write(self.bias.map_or(s, |b| s + b[self.j0 + j]));
        }
    }
}

/// `b` with contiguous rows: the output part accumulates `a[p] * b[p, ..]`
/// for `p` in order.
struct Rows<'a, 'o>(Part<'a, 'o>);

impl Vectorized for Rows<'_, '_> {
    type Out = ();

    #[inline(always)]
    fn run(self) {
        let p = self.0;
        let w = p.out.len();
        let mut acc = vec![0.0f32; w];
        for q in 0..p.k {
            let x = p.a.data[p.a.off + q * p.a.cs];
            let row = &p.b.data[p.b.off + q * p.b.rs + p.j0..][..w];
            for (s, &v) in acc.iter_mut().zip(row) {
                *s = v.mul_add(x, *s);
            }
        }
        p.write(acc.into_iter());
    }
}

/// `b` with contiguous columns: each output is the dot product of `a` and
/// its column, in [`LANES`] partial sums added pairwise at the end.
struct Dots<'a, 'o>(Part<'a, 'o>);

impl Vectorized for Dots<'_, '_> {
    type Out = ();

    #[inline(always)]
    fn run(self) {
        let p = self.0;
        let x = &p.a.data[p.a.off..][..p.k];
        let (b, j0, k) = (p.b, p.j0, p.k);
        // A plain loop, not a closure: a closure is compiled on its own,
        // without the wide copy's features (its `mul_add` a libm call).
        let mut sums = Vec::with_capacity(p.out.len());
        for j in j0..j0 + p.out.len() {
            sums.push(dot(x, &b.data[b.off + j * b.cs..][..k]));
        }
        p.write(sums.into_iter());
    }
}

/// `x . y` over [`LANES`] partial sums (lane `l` takes the elements at
/// `l` modulo [`LANES`]), then the tail, then the lanes added pairwise.
#[inline(always)]
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (xs, ys) = (x.chunks_exact(LANES), y.chunks_exact(LANES));
    let (xt, yt) = (xs.remainder(), ys.remainder());
    for (a, b) in xs.zip(ys) {
        for l in 0..LANES {
            acc[l] = a[l].mul_add(b[l], acc[l]);
        }
    }
    for (l, (&a, &b)) in xt.iter().zip(yt).enumerate() {
        acc[l] = a.mul_add(b, acc[l]);
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use forma_core::Rng;

    /// Both layouts of `b` against an f64 reference: tails of the depth
    /// and of the lanes, a strided `a`, offsets, one and several tasks.
    #[test]
    fn matches_the_reference() {
        if !crate::simd::has_avx2() {
            return;
        }
        let mut rng = Rng::seed_from(23);
        for &(n, k) in &[(1, 16), (9, 17), (300, 33), (2304, 768), (513, 100)] {
            for rows in [true, false] {
                // `b` as `k x n` with padded rows, or as the transpose of an
                // `n x k` weight with padded rows; `a` strided when `b` has
                // contiguous rows.
                let (ld, acs) = if rows { (n + 3, 2) } else { (k + 5, 1) };
                let b_len = 1 + if rows { k * ld } else { n * ld };
                let bs: Vec<f32> = (0..b_len).map(|_| rng.normal() as f32).collect();
                let a: Vec<f32> = (0..3 + k * acs).map(|_| rng.normal() as f32).collect();
                let bias: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
                let av = View {
                    data: &a,
                    off: 3,
                    rs: k * acs,
                    cs: acs,
                };
                let bv = View {
                    data: &bs,
                    off: 1,
                    rs: if rows { ld } else { 1 },
                    cs: if rows { 1 } else { ld },
                };
                for parallel in [false, true] {
                    let mut dst = vec![MaybeUninit::new(f32::NAN); n];
                    srow(&mut dst, n, k, av, bv, Some(&bias), parallel);
                    for (j, d) in dst.iter().enumerate() {
                        // SAFETY: `srow` writes every element.
                        let got = f64::from(unsafe { d.assume_init() });
                        let want: f64 = (0..k)
                            .map(|q| {
                                f64::from(a[3 + q * acs]) * f64::from(bs[1 + q * bv.rs + j * bv.cs])
                            })
                            .sum::<f64>()
                            + f64::from(bias[j]);
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()) * (k as f64).sqrt(),
                            "n {n} k {k} rows {rows} parallel {parallel} column {j}: {got} vs {want}"
                        );
                    }
                }
            }
        }
        // The threaded split gives the same bits.
        let (n, k) = (2304, 768);
        let a: Vec<f32> = (0..k).map(|_| rng.normal() as f32).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.normal() as f32).collect();
        let av = View {
            data: &a,
            off: 0,
            rs: k,
            cs: 1,
        };
        let bv = View {
            data: &b,
            off: 0,
            rs: n,
            cs: 1,
        };
        let bits = |parallel| {
            let mut dst = vec![MaybeUninit::new(0.0f32); n];
            srow(&mut dst, n, k, av, bv, None, parallel);
            // SAFETY: `srow` writes every element.
            dst.iter()
                .map(|d| unsafe { d.assume_init() }.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(false), bits(true));
    }
}
