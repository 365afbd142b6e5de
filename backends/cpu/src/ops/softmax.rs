//! Softmax along one axis.
//!
//! Each lane (the elements of the axis for one position of the others) is
//! computed as a contiguous slice with the axis last, like the reductions in
//! [`super::reduce`]; when the axis is not the last one the result is moved
//! back to the input's axis order. Arithmetic is in `E::Acc` (f32 for half
//! types) with one rounding at the end. The formula is PyTorch's: subtract the
//! lane maximum, so an all `-inf` lane, or one holding `+inf` or NaN, gives NaN.

use super::reduce::{axis_last_perm, lane_max, lane_sum};
use crate::strided::StridedIter;
use crate::{gather_vec, Cpu};
use forma_core::dtype::Real;
use forma_core::ops::softmax::SoftmaxKernel;
use forma_core::{Float, Layout, Result};
use num_traits::Float as _;
use std::mem::MaybeUninit;

/// Softmax of one lane into `out`; `scratch` holds the exponentials in
/// `E::Acc` so they are rounded only once.
#[inline(always)]
fn softmax_lane<E: Float>(x: &[E], out: &mut [MaybeUninit<E>], scratch: &mut Vec<E::Acc>) {
    let m = lane_max(x);
    // Lanes share one length, so this sizes the scratch once.
    scratch.resize(x.len(), E::Acc::default());
    for (e, v) in scratch.iter_mut().zip(x) {
        *e = (v.to_acc() - m).exp_fast();
    }
    let s = lane_sum(scratch, |e| e);
    for (o, &e) in out.iter_mut().zip(scratch.iter()) {
        o.write(E::from_acc(e / s));
    }
}

/// Log-softmax of one lane: `x - m - ln(sum(exp(x - m)))`, in that order.
#[inline(always)]
fn log_softmax_lane<E: Float>(x: &[E], out: &mut [MaybeUninit<E>]) {
    let m = lane_max(x);
    let ls = lane_sum(x, |v: E| (v.to_acc() - m).exp_fast()).ln();
    for (o, &v) in out.iter_mut().zip(x) {
        o.write(E::from_acc(v.to_acc() - m - ls));
    }
}

/// Softmax (or log-softmax) of each `(lane, out)` pair one task is given.
#[inline(always)]
fn lanes<'a, E: Float>(
    log: bool,
    n: usize,
    pairs: impl Iterator<Item = (&'a [E], &'a mut [MaybeUninit<E>])>,
) {
    let mut scratch = Vec::with_capacity(n);
    for (x, o) in pairs {
        if log {
            log_softmax_lane(x, o);
        } else {
            softmax_lane(x, o, &mut scratch);
        }
    }
}

/// The arguments of [`lanes`], as a loop [`crate::simd::run`] vectorises
/// for the CPU it runs on (a closure that large would not be inlined into
/// the wide copy; a function marked `inline(always)` is).
struct Lanes<I> {
    log: bool,
    n: usize,
    pairs: I,
}

impl<'a, E: Float, I: Iterator<Item = (&'a [E], &'a mut [MaybeUninit<E>])>> crate::simd::Vectorized
    for Lanes<I>
{
    type Out = ();
    #[inline(always)]
    fn run(self) {
        lanes(self.log, self.n, self.pairs);
    }
}

/// [`lanes`], vectorised for the CPU it runs on.
fn run_lanes<'a, E: Float>(
    log: bool,
    n: usize,
    pairs: impl Iterator<Item = (&'a [E], &'a mut [MaybeUninit<E>])>,
) {
    crate::simd::run(Lanes { log, n, pairs });
}

/// Softmax (or log-softmax) over every lane of `axis`, writing the outputs
/// row-major with the axis moved last.
fn map_lanes_into<E: Float>(x: &[E], layout: &Layout, axis: usize, log: bool) -> Vec<E> {
    let n = layout.dims[axis];
    let numel = layout.numel();
    let mut vec = Vec::with_capacity(numel);
    if numel == 0 {
        return vec;
    }
    // Written once, into uninitialised memory (zero-filling first cost a
    // `memset` pass over every output).
    let out = &mut vec.spare_capacity_mut()[..numel];
    if n == 1 || layout.strides[axis] == 1 {
        let outer = layout.remove_axis(axis);
        let run = |start: usize, chunk: &mut [MaybeUninit<E>]| {
            let mut it = StridedIter::new(&outer, start);
            let pairs = chunk.chunks_exact_mut(n).map(|o| {
                let b = it.next_offset();
                (&x[b..b + n], o)
            });
            run_lanes(log, n, pairs);
        };
        crate::par::units_mut(out, n, run);
    } else {
        let buf = gather_vec(x, &layout.permute(&axis_last_perm(layout.rank(), axis)));
        crate::par::units_mut(out, n, |first, o| {
            let b = &buf[first * n..][..o.len()];
            run_lanes(log, n, b.chunks_exact(n).zip(o.chunks_exact_mut(n)));
        });
    }
    // SAFETY: the lanes cover all `numel` slots (`numel / n` lanes of `n`
    // each, chunked on lane boundaries) and each lane function writes every
    // slot of its lane; `E: Copy`, so nothing needs dropping on a panic.
    unsafe { vec.set_len(numel) };
    vec
}

impl<E: Float> SoftmaxKernel<E> for Cpu {
    fn softmax(&self, x: &Vec<E>, layout: &Layout, axis: usize, log: bool) -> Result<Vec<E>> {
        let moved = map_lanes_into(x, layout, axis, log);
        let rank = layout.rank();
        if axis + 1 == rank || layout.numel() == 0 {
            return Ok(moved);
        }
        // `moved` has the axis last; view it in the input's axis order.
        let perm = axis_last_perm(rank, axis);
        let moved_dims: Vec<usize> = perm.iter().map(|&d| layout.dims[d]).collect();
        let back: Vec<usize> = (0..rank)
            .map(|d| match d.cmp(&axis) {
                std::cmp::Ordering::Less => d,
                std::cmp::Ordering::Equal => rank - 1,
                std::cmp::Ordering::Greater => d - 1,
            })
            .collect();
        Ok(gather_vec(
            &moved,
            &Layout::contiguous(&moved_dims).permute(&back),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    const NINF: f32 = f32::NEG_INFINITY;

    fn sm(x: &[f32], log: bool) -> Vec<f32> {
        Cpu.softmax(&x.to_vec(), &Layout::contiguous(&[x.len()]), 0, log)
            .unwrap()
    }

    /// Reference softmax of a view along `axis`, in f64, row-major output.
    fn naive(x: &[f32], l: &Layout, axis: usize, log: bool) -> Vec<f64> {
        let dims = l.dims.to_vec();
        let at = |idx: &[usize]| {
            x[l.offset
                + idx
                    .iter()
                    .zip(l.strides.iter())
                    .map(|(i, s)| i * s)
                    .sum::<usize>()] as f64
        };
        let ravel = |idx: &[usize]| idx.iter().zip(&dims).fold(0, |acc, (i, d)| acc * d + i);
        let outer: Vec<usize> = l.remove_axis(axis).dims.to_vec();
        let mut out = vec![0.0; dims.iter().product()];
        for o in 0..outer.iter().product() {
            let mut idx = vec![0; outer.len()];
            let mut r = o;
            for d in (0..outer.len()).rev() {
                idx[d] = r % outer[d];
                r /= outer[d];
            }
            idx.insert(axis, 0);
            let lane: Vec<f64> = (0..dims[axis])
                .map(|k| {
                    idx[axis] = k;
                    at(&idx)
                })
                .collect();
            let m = lane.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = lane.iter().map(|u| (u - m).exp()).sum();
            for (k, v) in lane.iter().enumerate() {
                idx[axis] = k;
                out[ravel(&idx)] = if log {
                    v - m - s.ln()
                } else {
                    (v - m).exp() / s
                };
            }
        }
        out
    }

    fn check(x: &[f32], l: &Layout) {
        for axis in 0..l.rank() {
            for log in [false, true] {
                let got = Cpu.softmax(&x.to_vec(), l, axis, log).unwrap();
                let want = naive(x, l, axis, log);
                assert_eq!(got.len(), want.len());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (*g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0),
                        "axis {axis} log {log} at {i} of {l:?}: got {g}, want {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn by_hand() {
        let s = sm(&[0., 2f32.ln(), 3f32.ln()], false);
        let want = [1. / 6., 2. / 6., 3. / 6.];
        for (g, w) in s.iter().zip(want) {
            assert!((g - w).abs() < 1e-7, "{s:?}");
        }
        let l = sm(&[0., 2f32.ln(), 3f32.ln()], true);
        for (g, w) in l.iter().zip(want) {
            assert!((g - w.ln()).abs() < 1e-6, "{l:?}");
        }
        // Rows along axis 1, columns along axis 0.
        let x = vec![1.0f32, 1., 2., 2.];
        let lay = Layout::contiguous(&[2, 2]);
        assert_eq!(Cpu.softmax(&x, &lay, 1, false).unwrap(), vec![0.5; 4]);
        let c = Cpu.softmax(&x, &lay, 0, false).unwrap();
        let (a, b) = (1. / (1. + 1f32.exp()), 1f32.exp() / (1. + 1f32.exp()));
        for (g, w) in c.iter().zip([a, a, b, b]) {
            assert!((g - w).abs() < 1e-7, "{c:?}");
        }
    }

    #[test]
    fn every_axis_of_views_matches_reference() {
        let x: Vec<f32> = (0..24).map(|i| ((i * 7) % 11) as f32 * 0.5 - 2.0).collect();
        let c = Layout::contiguous(&[2, 3, 4]);
        check(&x, &c);
        check(&x, &c.swap(0, 2));
        check(&x, &c.permute(&[1, 2, 0]));
        check(&x, &c.narrow(2, 1, 2));
        check(&x, &c.narrow(1, 1, 2).swap(1, 2));
        check(
            &x[..3],
            &Layout::contiguous(&[3, 1]).broadcast_to(&[2, 3, 4]),
        );
    }

    #[test]
    fn large_inputs_take_the_parallel_paths() {
        let x: Vec<f32> = (0..140_000)
            .map(|i| ((i % 89) as f32 - 44.0) / 8.0)
            .collect();
        for dims in [[2000, 70], [70, 2000], [2, 70_000]] {
            check(&x, &Layout::contiguous(&dims));
            check(&x, &Layout::contiguous(&[dims[1], dims[0]]).swap(0, 1));
        }
    }

    #[test]
    fn extremes() {
        assert_eq!(sm(&[1000., 1000., NINF], false), vec![0.5, 0.5, 0.0]);
        let l = sm(&[1000., 1000., NINF], true);
        assert!((l[0] + 2f32.ln()).abs() < 1e-6 && l[0] == l[1], "{l:?}");
        assert_eq!(l[2], NINF);
        assert_eq!(sm(&[-1000., 0., NINF], false), vec![0.0, 1.0, 0.0]);
        // An all -inf lane: (-inf) - (-inf) = NaN, as in PyTorch.
        assert!(sm(&[NINF; 3], false).iter().all(|v| v.is_nan()));
        assert!(sm(&[NINF; 3], true).iter().all(|v| v.is_nan()));
        // +inf: PyTorch's max-subtract formula gives NaN for the whole lane
        // (exp(inf - inf) = NaN poisons the sum): softmax([0, inf]) = [nan, nan].
        assert!(sm(&[f32::INFINITY, 1.], false).iter().all(|v| v.is_nan()));
        assert!(sm(&[0., f32::INFINITY], true).iter().all(|v| v.is_nan()));
        // NaN poisons its lane only.
        let x = vec![f32::NAN, 1., 1., 1.];
        let r = Cpu
            .softmax(&x, &Layout::contiguous(&[2, 2]), 1, false)
            .unwrap();
        assert!(r[0].is_nan() && r[1].is_nan());
        assert_eq!(&r[2..], &[0.5, 0.5]);
        // A single element: 1 (log 0), NaN for ±inf.
        assert_eq!(sm(&[-7.], false), vec![1.0]);
        assert_eq!(sm(&[-7.], true), vec![0.0]);
        assert!(sm(&[NINF], false)[0].is_nan());
    }

    #[test]
    fn empty() {
        let x: Vec<f32> = vec![];
        let l = Layout::contiguous(&[0, 3]);
        assert!(Cpu.softmax(&x, &l, 1, false).unwrap().is_empty());
        assert!(Cpu.softmax(&x, &l, 0, true).unwrap().is_empty());
    }

    #[test]
    fn half_types() {
        let x: Vec<f16> = [1000., 1000., f32::NEG_INFINITY]
            .iter()
            .map(|&v| f16::from_f32(v))
            .collect();
        let r = Cpu
            .softmax(&x, &Layout::contiguous(&[3]), 0, false)
            .unwrap();
        assert_eq!(r, vec![f16::from_f32(0.5), f16::from_f32(0.5), f16::ZERO]);
        // 4096 equal entries: each exactly 1/4096 (f32 sum of the exponentials).
        let b = vec![bf16::from_f32(3.0); 4096];
        let r = Cpu
            .softmax(&b, &Layout::contiguous(&[4096]), 0, false)
            .unwrap();
        assert!(r.iter().all(|&v| v == bf16::from_f32(1.0 / 4096.0)));
        let r = Cpu
            .softmax(&b, &Layout::contiguous(&[4096]), 0, true)
            .unwrap();
        assert!(r.iter().all(|&v| v == bf16::from_f32(-(4096f32.ln()))));
    }
}
