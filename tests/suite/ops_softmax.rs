//! Softmax and log-softmax against PyTorch (`tools/fixtures/softmax.safetensors`):
//! along every axis of rank-2 and rank-3 tensors, on a transposed view, on
//! extreme rows (±1000, -Inf entries, an all -Inf row -> NaN, +Inf -> NaN,
//! NaN), on size-0 and size-1 axes, and in f64.
//! Tolerances: f32 rtol 1e-5 / atol 1e-6, f64 1e-12.

use crate::common;

use common::*;
use forma::core::device::Device;
use forma::core::shape::op::AlongAxis;
use forma::core::{Float, Tensor};
use forma::{Dyn, C};

/// Compares softmax and log-softmax along `AX` with `<op>.<case>.ax<AX>.out`.
fn both<const AX: isize, S, E, D>(c: &mut Checks, x: &Tensor<S, E, D>, case: &str, tol: Tol)
where
    S: AlongAxis<AX>,
    E: Float + FixtureElem,
    D: Device<E>,
{
    c.close(
        &x.softmax::<AX>(),
        &format!("softmax.{case}.ax{AX}.out"),
        tol,
    );
    c.close(
        &x.log_softmax::<AX>(),
        &format!("log_softmax.{case}.ax{AX}.out"),
        tol,
    );
}

device_tests! {
    fn rank2_each_axis<D>(dev) {
        let fx = Fixture::load("softmax");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("x.in0", dev);
        both::<0, _, _, _>(&mut c, &x, "x", F32_TOL);
        both::<1, _, _, _>(&mut c, &x, "x", F32_TOL);
        c.finish();
    }

    fn rank3_each_axis<D>(dev) {
        let fx = Fixture::load("softmax");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<2>, C<3>, C<4>), f32, D> = fx.tensor("x3.in0", dev);
        both::<0, _, _, _>(&mut c, &x, "x3", F32_TOL);
        both::<1, _, _, _>(&mut c, &x, "x3", F32_TOL);
        both::<2, _, _, _>(&mut c, &x, "x3", F32_TOL);
        c.finish();
    }

    /// Stored [4,3], used as `.t()`.
    fn noncontiguous<D>(dev) {
        let fx = Fixture::load("softmax");
        let mut c = Checks::new(&fx);
        let base: Tensor<(C<4>, C<3>), f32, D> = fx.tensor("nc.in0", dev);
        let x = base.t();
        both::<0, _, _, _>(&mut c, &x, "nc", F32_TOL);
        both::<1, _, _, _>(&mut c, &x, "nc", F32_TOL);
        c.finish();
    }

    /// Rows [1000,1000,-inf], [-1000]*3, [-inf]*3 (NaN), [inf,0,1] (NaN),
    /// [nan,1,2] (NaN), [1000,0,-1000], [88,89,90].
    fn extreme_inputs<D>(dev) {
        let fx = Fixture::load("softmax");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<7>, C<3>), f32, D> = fx.tensor("extreme.in0", dev);
        both::<1, _, _, _>(&mut c, &x, "extreme", F32_TOL);
        let x: Tensor<(C<7>, C<3>), f64, D> = fx.tensor("extreme64.in0", dev);
        both::<1, _, _, _>(&mut c, &x, "extreme64", F64_TOL);
        c.finish();
    }

    /// [0,4] along either axis, [2,0] along the empty axis.
    fn empty_dims<D>(dev) {
        let fx = Fixture::load("softmax");
        let mut c = Checks::new(&fx);
        let x: Tensor<(Dyn, C<4>), f32, D> = fx.tensor("empty.in0", dev);
        both::<0, _, _, _>(&mut c, &x, "empty", F32_TOL);
        both::<1, _, _, _>(&mut c, &x, "empty", F32_TOL);
        let x: Tensor<(C<2>, Dyn), f32, D> = fx.tensor("empty_ax.in0", dev);
        both::<1, _, _, _>(&mut c, &x, "empty_ax", F32_TOL);
        c.finish();
    }

    /// Along a size-1 axis: ones and zeros.
    fn size_one_axis<D>(dev) {
        let fx = Fixture::load("softmax");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<3>, C<1>), f32, D> = fx.tensor("one.in0", dev);
        both::<1, _, _, _>(&mut c, &x, "one", F32_TOL);
        c.finish();
    }

    fn rank2_f64<D>(dev) {
        let fx = Fixture::load("softmax");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("x64.in0", dev);
        both::<0, _, _, _>(&mut c, &x, "x64", F64_TOL);
        both::<1, _, _, _>(&mut c, &x, "x64", F64_TOL);
        c.finish();
    }

    /// The documented example: [1000, 1000, -inf] -> [0.5, 0.5, 0] exactly.
    fn rows_sum_to_one<D>(dev) {
        let x: Tensor<(C<1>, C<3>), f32, D> =
            Tensor::from_vec_on(vec![1000., 1000., f32::NEG_INFINITY], (C, C), dev).unwrap();
        assert_eq!(x.softmax::<1>().to_vec(), vec![0.5, 0.5, 0.0]);
        let fx = Fixture::load("softmax");
        let x: Tensor<(C<2>, C<3>, C<4>), f32, D> = fx.tensor("x3.in0", dev);
        let sums = x.softmax::<2>().to_vec().chunks(4).map(|r| r.iter().sum::<f32>()).collect::<Vec<_>>();
        assert_close(&sums, &[1.0; 6], 0.0, 1e-6);
    }
}
