//! Cumulative sums along one axis ([`CumsumKernel`]): the input gathered
//! row-major as `[outer, n, inner]`, each outer block scanned along `n` with
//! `inner` running sums side by side (contiguous reads and writes whatever
//! the axis), in `E::Acc`, each output rounded once. Outer blocks run in
//! parallel.

use crate::{gather_vec, Cpu};
use forma_core::ops::cumsum::CumsumKernel;
use forma_core::{Float, Layout, Result};

impl<E: Float> CumsumKernel<E> for Cpu {
    fn cumsum(&self, x: &Vec<E>, layout: &Layout, axis: usize, reverse: bool) -> Result<Vec<E>> {
        let dims = &layout.dims[..];
        let (n, inner) = (dims[axis], dims[axis + 1..].iter().product::<usize>());
        let x = gather_vec(x, layout);
        let mut out = vec![E::default(); x.len()];
        let block = n * inner;
        if block == 0 {
            return Ok(out);
        }
        crate::par::units_mut(&mut out, block, |first, o| {
            let mut acc = vec![E::Acc::default(); inner];
            for (b, ob) in o.chunks_exact_mut(block).enumerate() {
                let xb = &x[(first + b) * block..][..block];
                acc.fill(E::Acc::default());
                for k in 0..n {
                    let k = if reverse { n - 1 - k } else { k };
                    let (xr, or) = (&xb[k * inner..][..inner], &mut ob[k * inner..][..inner]);
                    for ((a, &v), y) in acc.iter_mut().zip(xr).zip(or) {
                        *a = *a + v.to_acc();
                        *y = E::from_acc(*a);
                    }
                }
            }
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_each_lane_forwards_and_backwards() {
        // [2, 3, 2]: lanes along axis 1 are (0, 2, 4), (1, 3, 5), ...
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let l = Layout::contiguous(&[2, 3, 2]);
        let y = Cpu.cumsum(&x, &l, 1, false).unwrap();
        assert_eq!(y, [0., 1., 2., 4., 6., 9., 6., 7., 14., 16., 24., 27.]);
        let r = Cpu.cumsum(&x, &l, 1, true).unwrap();
        assert_eq!(r, [6., 9., 6., 8., 4., 5., 24., 27., 18., 20., 10., 11.]);
    }

    #[test]
    fn reads_strided_views() {
        // The transpose of [[0, 1, 2], [3, 4, 5]] scanned along its rows.
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let t = Layout::contiguous(&[2, 3]).permute(&[1, 0]);
        let y = Cpu.cumsum(&x, &t, 1, false).unwrap();
        assert_eq!(y, [0., 3., 1., 5., 2., 7.]);
    }

    #[test]
    fn accumulates_half_types_in_f32() {
        // 2048 + 1 + 1 in f16 steps (spacing 2 there) would stay at 2048;
        // PyTorch's kernel accumulates in f32 and rounds each output.
        use half::f16;
        let x = [2048.0, 1.0, 1.0].map(f16::from_f32).to_vec();
        let y = Cpu.cumsum(&x, &Layout::contiguous(&[3]), 0, false).unwrap();
        assert_eq!(
            y.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
            [2048., 2048., 2050.]
        );
    }
}
