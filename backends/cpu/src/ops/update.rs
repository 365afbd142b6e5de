//! Fused in-place updates ([`UpdateKernel`]): one pass over the gradient,
//! the parameter and the rule's buffers, in parallel chunks, when every view
//! is dense. Anything else is declined (`Ok(false)`) and the caller runs the
//! rule as composed ops.

use crate::{Cpu, PAR_CHUNK};
use forma_core::ops::update::{UpdateKernel, UpdateOp};
use forma_core::{Float, Layout, Result};

/// Elements per block: a fixed trip count the compiler vectorises (whole
/// blocks in place, the tail through zero-padded local copies).
const BLOCK: usize = 64;

impl<E: Float> UpdateKernel<E> for Cpu {
    fn update<const N: usize, Op: UpdateOp<N>>(
        &self,
        op: Op,
        grad: &Vec<E>,
        lg: &Layout,
        state: [(&mut Vec<E>, &Layout); N],
    ) -> Result<bool> {
        let Some(rg) = lg.contiguous_range() else {
            return Ok(false);
        };
        let n = rg.len();
        let mut ranges = Vec::with_capacity(N);
        for (s, l) in &state {
            match l.contiguous_range() {
                Some(r) if r.len() == n && r.end <= s.len() => ranges.push(r),
                _ => return Ok(false),
            }
        }
        if rg.end > grad.len() {
            return Ok(false);
        }
        let g = &grad[rg];
        let mut ranges = ranges.into_iter();
        let slices: [&mut [E]; N] = state.map(|(s, _)| {
            let r = ranges.next().expect("one range per state view");
            &mut s[r]
        });
        if n >= 2 * PAR_CHUNK {
            let mut chunks = slices.map(|s| s.chunks_mut(PAR_CHUNK));
            let tasks: Vec<(&[E], [&mut [E]; N])> = g
                .chunks(PAR_CHUNK)
                .map(|gc| {
                    let sc =
                        std::array::from_fn(|k| chunks[k].next().expect("chunks of equal lengths"));
                    (gc, sc)
                })
                .collect();
            crate::par::each(tasks, |(gc, sc)| run_chunk(op, gc, sc));
        } else {
            run_chunk(op, g, slices);
        }
        Ok(true)
    }
}

/// Runs the rule compiled for the widest vectors the CPU has (see
/// [`crate::simd`]): the same arithmetic in every copy.
#[inline]
fn run_chunk<E: Float, const N: usize, Op: UpdateOp<N>>(op: Op, g: &[E], s: [&mut [E]; N]) {
    crate::simd::run(Chunk { op, g, s });
}

/// One chunk of an update, as a [`crate::simd::Vectorized`] loop.
struct Chunk<'a, E, const N: usize, Op> {
    op: Op,
    g: &'a [E],
    s: [&'a mut [E]; N],
}

impl<E: Float, const N: usize, Op: UpdateOp<N>> crate::simd::Vectorized for Chunk<'_, E, N, Op> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        run(self.op, self.g, self.s);
    }
}

/// The rule over one chunk, `BLOCK` elements at a time: whole blocks in
/// place through fixed-size views (which the compiler vectorises, checking
/// at run time that the buffers do not overlap), the tail through the same
/// block on zero-padded local copies.
#[inline(always)]
fn run<E: Float, const N: usize, Op: UpdateOp<N>>(op: Op, g: &[E], mut s: [&mut [E]; N]) {
    let whole = g.len() - g.len() % BLOCK;
    for start in (0..whole).step_by(BLOCK) {
        let gb = <&[E; BLOCK]>::try_from(&g[start..start + BLOCK]).expect("a whole block");
        let sb = s.each_mut().map(|x| {
            <&mut [E; BLOCK]>::try_from(&mut x[start..start + BLOCK]).expect("a whole block")
        });
        block(op, gb, sb);
    }
    let rest = g.len() - whole;
    if rest > 0 {
        // The last partial block, padded with zeros (whose results are not
        // copied back) so that it runs the same fixed-length loop.
        let mut gb = [E::default(); BLOCK];
        gb[..rest].copy_from_slice(&g[whole..]);
        let mut sb = [[E::default(); BLOCK]; N];
        for (b, x) in sb.iter_mut().zip(s.iter()) {
            b[..rest].copy_from_slice(&x[whole..]);
        }
        block(op, &gb, sb.each_mut());
        for (b, x) in sb.iter().zip(s.iter_mut()) {
            x[whole..].copy_from_slice(&b[..rest]);
        }
    }
}

/// The rule over one block in place: widen, apply, round back.
#[inline(always)]
fn block<E: Float, const N: usize, Op: UpdateOp<N>>(
    op: Op,
    g: &[E; BLOCK],
    mut s: [&mut [E; BLOCK]; N],
) {
    for j in 0..BLOCK {
        let mut v: [E::Acc; N] = std::array::from_fn(|k| s[k][j].to_acc());
        op.apply(g[j].to_acc(), &mut v);
        for (b, x) in s.iter_mut().zip(v) {
            b[j] = E::from_acc(x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forma_core::ops::update::Lane;
    use forma_core::Dtype;

    /// `m = 0.5 * m + g; p = p - m / 4` (exact in binary floating point for
    /// the values below).
    #[derive(Clone, Copy)]
    struct Momentum;
    impl UpdateOp<2> for Momentum {
        const NAME: &'static str = "momentum";
        fn apply<R: Lane>(&self, g: R, s: &mut [R; 2]) {
            s[1] = s[1] * R::c(0.5) + g;
            s[0] = s[0] - s[1] / R::c(4.0);
        }
    }

    fn check<E: Float>(n: usize, offset: usize) {
        let e = |v: f64| E::from_f64(v);
        let g: Vec<E> = (0..n).map(|i| e((i % 7) as f64)).collect();
        let mut p: Vec<E> = (0..offset + n).map(|i| e((i % 5) as f64)).collect();
        let mut m: Vec<E> = (0..n).map(|i| e((i % 3) as f64)).collect();
        let lp = Layout {
            offset,
            ..Layout::contiguous(&[n])
        };
        let l = Layout::contiguous(&[n]);
        let ran = Cpu
            .update(Momentum, &g, &l, [(&mut p, &lp), (&mut m, &l)])
            .expect("no failure");
        assert!(ran);
        for i in [0, 1, BLOCK - 1, BLOCK, n / 2, n - 1]
            .into_iter()
            .filter(|&i| i < n)
        {
            let mi = (i % 3) as f64 * 0.5 + (i % 7) as f64;
            let pi = ((i + offset) % 5) as f64 - mi / 4.0;
            assert_eq!(Dtype::to_f64(m[i]), mi, "m[{i}] of {n}");
            assert_eq!(Dtype::to_f64(p[offset + i]), pi, "p[{i}] of {n}");
        }
        // The elements before the view are left alone.
        for (i, x) in p[..offset].iter().enumerate() {
            assert_eq!(Dtype::to_f64(*x), (i % 5) as f64);
        }
    }

    #[test]
    fn updates_every_element_in_place() {
        // A tail block, several blocks, and parallel chunks with a tail.
        for n in [3, 5 * BLOCK + 7, 2 * PAR_CHUNK + BLOCK + 3] {
            check::<f32>(n, 0);
            check::<f64>(n, 2);
            check::<half::bf16>(n, 1);
        }
    }

    #[test]
    fn declines_views_that_are_not_dense() {
        let g = vec![1.0f32; 6];
        let mut p = vec![1.0f32; 6];
        let mut m = vec![0.0f32; 6];
        let dense = Layout::contiguous(&[2, 3]);
        let t = Layout::contiguous(&[3, 2]).permute(&[1, 0]);
        let ran = Cpu
            .update(Momentum, &g, &dense, [(&mut p, &t), (&mut m, &dense)])
            .expect("no failure");
        assert!(!ran);
        assert_eq!(p, [1.0; 6]);
        assert_eq!(m, [0.0; 6]);
    }

    #[test]
    fn the_tensor_entry_declines_shared_storages_and_checks_sizes() {
        use forma_core::{Dyn, Tensor};
        let t = |v: Vec<f32>| Tensor::<(Dyn,), f32, Cpu>::from_vec(v.clone(), (Dyn(v.len()),));
        let g = t(vec![2.0, 4.0]).expect("two values");
        let p = t(vec![1.0, 1.0]).expect("two values");
        let m = t(vec![0.0, 0.0]).expect("two values");
        // The parameter given as its own buffer: declined, nothing written.
        let ran = Tensor::try_fused_update(Momentum, &g, [&p, &p.clone()]).expect("no failure");
        assert!(!ran);
        assert_eq!(p.to_vec(), [1.0, 1.0]);
        let short = t(vec![0.0]).expect("one value");
        assert!(Tensor::try_fused_update(Momentum, &g, [&p, &short]).is_err());
        let ran = Tensor::try_fused_update(Momentum, &g, [&p, &m]).expect("no failure");
        assert!(ran);
        assert_eq!(m.to_vec(), [2.0, 4.0]);
        assert_eq!(p.to_vec(), [0.5, 0.0]);
    }
}
