//! Cumulative sums against PyTorch (`tools/fixtures/cumsum.safetensors`):
//! along every axis of rank-2 and rank-3 tensors, on a transposed view, with
//! Inf and NaN in a lane, on empty tensors, in f64, over 300-long lanes in
//! f16 and bf16 (PyTorch accumulates them in f32), and the gradient of
//! `sum(cumsum(x) * w)` along each axis.
//! Tolerances: f32 rtol 1e-5 / atol 1e-6 (sums: `F32_SUM_TOL`), f64 1e-12.

use crate::common;

use common::*;
use forma::core::Tensor;
use forma::{Dyn, C};

device_tests! {
    fn each_axis<D>(dev) {
        let fx = Fixture::load("cumsum");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("x.in0", dev);
        c.close(&x.cumsum::<0>(), "cumsum.x.ax0.out", F32_SUM_TOL);
        c.close(&x.cumsum::<1>(), "cumsum.x.ax1.out", F32_SUM_TOL);
        let x: Tensor<(C<2>, C<3>, C<4>), f32, D> = fx.tensor("x3.in0", dev);
        c.close(&x.cumsum::<0>(), "cumsum.x3.ax0.out", F32_SUM_TOL);
        c.close(&x.cumsum::<1>(), "cumsum.x3.ax1.out", F32_SUM_TOL);
        c.close(&x.cumsum::<2>(), "cumsum.x3.ax2.out", F32_SUM_TOL);
        c.finish();
    }

    /// Stored [4,3], used as `.t()`.
    fn noncontiguous<D>(dev) {
        let fx = Fixture::load("cumsum");
        let mut c = Checks::new(&fx);
        let base: Tensor<(C<4>, C<3>), f32, D> = fx.tensor("nc.in0", dev);
        let x = base.t();
        c.close(&x.cumsum::<0>(), "cumsum.nc.ax0.out", F32_SUM_TOL);
        c.close(&x.cumsum::<1>(), "cumsum.nc.ax1.out", F32_SUM_TOL);
        c.finish();
    }

    /// Rows [1, inf, -inf, 2] (inf, then NaN from inf - inf) and
    /// [nan, 1, 2, 3] (NaN throughout); empty [0, 3] along either axis.
    fn special_and_empty<D>(dev) {
        let fx = Fixture::load("cumsum");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<2>, C<4>), f32, D> = fx.tensor("special.in0", dev);
        c.close(&x.cumsum::<1>(), "cumsum.special.ax1.out", F32_TOL);
        let x: Tensor<(Dyn, C<3>), f32, D> = fx.tensor("empty.in0", dev);
        c.close(&x.cumsum::<0>(), "cumsum.empty.ax0.out", F32_TOL);
        c.close(&x.cumsum::<1>(), "cumsum.empty.ax1.out", F32_TOL);
        c.finish();
    }

    fn other_dtypes<D>(dev) {
        let fx = Fixture::load("cumsum");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<3>, C<5>), f64, D> = fx.tensor("x64.in0", dev);
        c.close(&x.cumsum::<1>(), "cumsum.x64.ax1.out", F64_TOL);
        let x: Tensor<(C<2>, C<300>), half::f16, D> = fx.tensor("f16.in0", dev);
        c.close(&x.cumsum::<1>(), "cumsum.f16.ax1.out", F16_TOL);
        let x: Tensor<(C<2>, C<300>), half::bf16, D> = fx.tensor("bf16.in0", dev);
        c.close(&x.cumsum::<1>(), "cumsum.bf16.ax1.out", BF16_TOL);
        c.finish();
    }

    /// The gradient of `sum(cumsum(x, d) * w)`: the reverse cumulative sum
    /// of `w` along `d`.
    fn gradients<D>(dev) {
        let fx = Fixture::load("cumsum");
        let mut c = Checks::new(&fx);
        let w: Tensor<(C<2>, C<3>, C<4>), f32, D> = fx.tensor("grad.in1", dev);
        let x = || fx.tensor::<(C<2>, C<3>, C<4>), f32, D>("x3.in0", dev).requires_grad();
        let (x0, x1, x2) = (x(), x(), x());
        (&x0.cumsum::<0>() * &w).sum_all().backward();
        (&x1.cumsum::<1>() * &w).sum_all().backward();
        (&x2.cumsum::<2>() * &w).sum_all().backward();
        c.close(&x0.grad().expect("a gradient"), "grad.ax0.out", F32_SUM_TOL);
        c.close(&x1.grad().expect("a gradient"), "grad.ax1.out", F32_SUM_TOL);
        c.close(&x2.grad().expect("a gradient"), "grad.ax2.out", F32_SUM_TOL);
        c.finish();
    }
}
