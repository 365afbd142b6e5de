//! Layer normalisation over the last axis, fused: per row, a pass for the
//! mean, one for the biased variance and one writing
//! `(x - mean) * rstd * weight + bias`, all in `E::Acc` with one rounding
//! at the end, rows in parallel for large inputs. Each row's mean and rstd
//! are returned for the backward.

use super::reduce::lane_sum;
use crate::{gather_vec, Cpu};
use forma_core::dtype::Real;
use forma_core::ops::norm::{LayerNormOut, NormKernel};
use forma_core::{Float, Layout, Result};
use num_traits::Float as _;
use std::mem::MaybeUninit;
use std::sync::Mutex;

/// The rows `x` (each `n` long) normalised into `out`, each row's mean and
/// rstd into `stats`.
#[inline(always)]
fn rows<E: Float>(
    x: &[E],
    out: &mut [MaybeUninit<E>],
    stats: &mut [(E, E)],
    n: usize,
    weight: &[E::Acc],
    bias: &[E::Acc],
    eps: E::Acc,
) {
    let len = E::Acc::c(n as f64);
    let rows = x.chunks_exact(n).zip(out.chunks_exact_mut(n)).zip(stats);
    for ((row, o), st) in rows {
        let mean = lane_sum(row, |v: E| v.to_acc()) / len;
        let var = lane_sum(row, |v: E| {
            let d = v.to_acc() - mean;
            d * d
        }) / len;
        let rstd = E::Acc::c(1.0) / (var + eps).sqrt();
        *st = (E::from_acc(mean), E::from_acc(rstd));
        for (((o, &v), &w), &b) in o.iter_mut().zip(row).zip(weight).zip(bias) {
            o.write(E::from_acc((v.to_acc() - mean) * rstd * w + b));
        }
    }
}

/// The arguments of [`rows`], as a loop [`crate::simd::run`] vectorises.
struct Rows<'a, E: Float> {
    x: &'a [E],
    out: &'a mut [MaybeUninit<E>],
    stats: &'a mut [(E, E)],
    n: usize,
    weight: &'a [E::Acc],
    bias: &'a [E::Acc],
    eps: E::Acc,
}

impl<E: Float> crate::simd::Vectorized for Rows<'_, E> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        rows(
            self.x,
            self.out,
            self.stats,
            self.n,
            self.weight,
            self.bias,
            self.eps,
        );
    }
}

/// An `[n]` operand as `n` accumulation-type values; when absent, `n`
/// copies of `identity`.
fn acc_vec<E: Float>(s: Option<(&Vec<E>, &Layout)>, n: usize, identity: f64) -> Vec<E::Acc> {
    match s {
        Some((s, l)) => gather_vec(s, l).iter().map(|v| v.to_acc()).collect(),
        None => vec![E::Acc::c(identity); n],
    }
}

impl<E: Float> NormKernel<E> for Cpu {
    fn layer_norm(
        &self,
        (x, layout): (&Vec<E>, &Layout),
        weight: Option<(&Vec<E>, &Layout)>,
        bias: Option<(&Vec<E>, &Layout)>,
        eps: f64,
    ) -> Result<Option<LayerNormOut<Vec<E>>>> {
        let (Some(&n), numel) = (layout.dims.last(), layout.numel()) else {
            return Ok(None);
        };
        let mut vec = Vec::with_capacity(numel);
        if numel == 0 {
            // No elements: no rows with statistics either.
            return Ok(Some(LayerNormOut {
                out: vec,
                mean: Vec::new(),
                rstd: Vec::new(),
            }));
        }
        let gathered;
        let x = match layout.contiguous_range() {
            Some(r) => &x[r],
            None => {
                gathered = gather_vec(x, layout);
                &gathered[..]
            }
        };
        // A missing weight multiplies by 1 and a missing bias adds -0: both
        // leave every value as it was, bit for bit (`x + -0 == x` for
        // `x = +0` too, where `+0` would turn `-0` into `+0`).
        let (weight, bias) = (acc_vec(weight, n, 1.0), acc_vec(bias, n, -0.0));
        let (weight, bias, eps) = (&weight[..], &bias[..], E::Acc::c(eps));
        let out = &mut vec.spare_capacity_mut()[..numel];
        // Each chunk's statistics, by first row, put in order below.
        let parts = Mutex::new(Vec::new());
        let run = |row0: usize, out: &mut [MaybeUninit<E>]| {
            let x = &x[row0 * n..][..out.len()];
            let mut stats = vec![(E::default(), E::default()); out.len() / n];
            crate::simd::run(Rows {
                x,
                out,
                stats: &mut stats,
                n,
                weight,
                bias,
                eps,
            });
            parts.lock().expect("no task panicked").push((row0, stats));
        };
        crate::par::units_mut(out, n, run);
        // SAFETY: the chunks cover all `numel` slots on row boundaries and
        // `rows` writes every slot of every row; `E: Copy`, so nothing needs
        // dropping on a panic.
        unsafe { vec.set_len(numel) };
        let mut parts = parts.into_inner().expect("no task panicked");
        parts.sort_unstable_by_key(|p| p.0);
        let (mean, rstd) = parts.into_iter().flat_map(|p| p.1).unzip();
        Ok(Some(LayerNormOut {
            out: vec,
            mean,
            rstd,
        }))
    }
}
