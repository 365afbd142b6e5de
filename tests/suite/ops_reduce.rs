//! Reductions against PyTorch (`tools/fixtures/reduce.safetensors`): sum,
//! mean, max (amax), min (amin), prod, logsumexp, var and std (unbiased and
//! biased), argmax and argmin, along each axis, with keepdim and over all
//! elements; on a non-contiguous (permuted) view, NaN/Inf rows, ties,
//! size-0 and size-1 axes, and f64. One test per op, each over every case.
//! Tolerances: f32 rtol 1e-5 / atol 1e-6, f64 1e-12, indices exact.

use crate::common;

use common::*;
use forma::core::ops::reduce::ReduceOp;
use forma::core::shape::op::AlongAxis;
use forma::core::{Float, Shape, Tensor};
use forma::{Ax, Dyn, C};

/// Compares `x.<op>::<AX>()` (or the keepdim form) with `<op>.<case>.out`
/// when PyTorch defines it (no max/min/argmax over an empty axis).
fn along<const AX: isize, S, E, D>(
    c: &mut Checks,
    fx: &Fixture,
    x: &Tensor<S, E, D>,
    op: &str,
    case: &str,
    keep: bool,
    tol: Tol,
) where
    S: AlongAxis<AX>,
    E: Float + FixtureElem,
    D: TestDevice + forma::core::device::Device<E>,
{
    let key = format!("{op}.{case}.out");
    if !fx.has(&key) {
        return;
    }
    match (op, keep) {
        ("sum", false) => c.close(&x.sum::<AX>(), &key, tol),
        ("sum", true) => c.close(&x.sum_keepdim::<AX>(), &key, tol),
        ("mean", false) => c.close(&x.mean::<AX>(), &key, tol),
        ("mean", true) => c.close(&x.mean_keepdim::<AX>(), &key, tol),
        ("max", false) => c.close(&x.max::<AX>(), &key, tol),
        ("max", true) => c.close(&x.max_keepdim::<AX>(), &key, tol),
        ("min", false) => c.close(&x.min::<AX>(), &key, tol),
        ("min", true) => c.close(&x.min_keepdim::<AX>(), &key, tol),
        ("prod", false) => c.close(&x.prod::<AX>(), &key, tol),
        ("prod", true) => c.close(&x.prod_keepdim::<AX>(), &key, tol),
        ("logsumexp", false) => c.close(&x.logsumexp::<AX>(), &key, tol),
        ("logsumexp", true) => c.close(&x.logsumexp_keepdim::<AX>(), &key, tol),
        ("var_u", false) => c.close(&x.var::<AX>(true), &key, tol),
        ("var_u", true) => c.close(&x.var_keepdim::<AX>(true), &key, tol),
        ("var_b", false) => c.close(&x.var::<AX>(false), &key, tol),
        ("var_b", true) => c.close(&x.var_keepdim::<AX>(false), &key, tol),
        ("std_u", false) => c.close(&x.std::<AX>(true), &key, tol),
        ("std_u", true) => c.close(&x.std_keepdim::<AX>(true), &key, tol),
        ("std_b", false) => c.close(&x.std::<AX>(false), &key, tol),
        ("std_b", true) => c.close(&x.std_keepdim::<AX>(false), &key, tol),
        ("argmax", false) => c.close(&x.argmax::<AX>(), &key, EXACT),
        ("argmax", true) => c.close(&x.argmax_keepdim::<AX>(), &key, EXACT),
        ("argmin", false) => c.close(&x.argmin::<AX>(), &key, EXACT),
        ("argmin", true) => c.close(&x.argmin_keepdim::<AX>(), &key, EXACT),
        _ => {}
    }
}

/// Compares `x.<op>_all()` with `<op>.<case>.out` when PyTorch defines it.
fn over_all<S, E, D>(
    c: &mut Checks,
    fx: &Fixture,
    x: &Tensor<S, E, D>,
    op: &str,
    case: &str,
    tol: Tol,
) where
    S: Shape,
    E: Float + FixtureElem,
    D: TestDevice + forma::core::device::Device<E>,
{
    let key = format!("{op}.{case}.out");
    if !fx.has(&key) {
        return;
    }
    match op {
        "sum" => c.close(&x.sum_all(), &key, tol),
        "mean" => c.close(&x.mean_all(), &key, tol),
        "max" => c.close(&x.max_all(), &key, tol),
        "min" => c.close(&x.min_all(), &key, tol),
        "prod" => c.close(&x.prod_all(), &key, tol),
        "logsumexp" => c.close(&x.logsumexp_all(), &key, tol),
        "var_u" => c.close(&x.var_all(true), &key, tol),
        "var_b" => c.close(&x.var_all(false), &key, tol),
        "std_u" => c.close(&x.std_all(true), &key, tol),
        "std_b" => c.close(&x.std_all(false), &key, tol),
        "argmax" => c.close(&x.argmax_all(), &key, EXACT),
        "argmin" => c.close(&x.argmin_all(), &key, EXACT),
        _ => {}
    }
}

/// Runs `op` over every case of the fixture file.
fn check_op<D: TestDevice>(dev: &D, op: &str) {
    let fx = Fixture::load("reduce");
    let mut c = Checks::new(&fx);
    let t = F32_TOL;

    // [3,4,5] along each axis, keepdim along 1, all
    let x: Tensor<(C<3>, C<4>, C<5>), f32, D> = fx.tensor("x.in0", dev);
    along::<0, _, _, _>(&mut c, &fx, &x, op, "x.ax0", false, t);
    along::<1, _, _, _>(&mut c, &fx, &x, op, "x.ax1", false, t);
    along::<2, _, _, _>(&mut c, &fx, &x, op, "x.ax2", false, t);
    along::<1, _, _, _>(&mut c, &fx, &x, op, "x.ax1k", true, t);
    over_all(&mut c, &fx, &x, op, "x.all", t);

    // non-contiguous: stored [5,4,3], reduced as base.permute(2,1,0)
    let base: Tensor<(C<5>, C<4>, C<3>), f32, D> = fx.tensor("nc.in0", dev);
    let nc: Tensor<(C<3>, C<4>, C<5>), f32, D> = base.permute::<(Ax<2>, Ax<1>, Ax<0>)>();
    along::<1, _, _, _>(&mut c, &fx, &nc, op, "nc.ax1", false, t);
    along::<2, _, _, _>(&mut c, &fx, &nc, op, "nc.ax2", false, t);
    over_all(&mut c, &fx, &nc, op, "nc.all", t);

    // NaN, +Inf, all -Inf, Inf and -Inf together, +-1000
    let s: Tensor<(C<5>, C<4>), f32, D> = fx.tensor("special.in0", dev);
    along::<0, _, _, _>(&mut c, &fx, &s, op, "special.ax0", false, t);
    along::<1, _, _, _>(&mut c, &fx, &s, op, "special.ax1", false, t);

    // ties: the first extreme wins
    let ties: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("ties.in0", dev);
    along::<0, _, _, _>(&mut c, &fx, &ties, op, "ties.ax0", false, t);
    along::<1, _, _, _>(&mut c, &fx, &ties, op, "ties.ax1", false, t);

    // [0,3]: an empty reduction along 0, an empty result along 1
    let e: Tensor<(Dyn, C<3>), f32, D> = fx.tensor("empty.in0", dev);
    along::<0, _, _, _>(&mut c, &fx, &e, op, "empty.ax0", false, t);
    along::<1, _, _, _>(&mut c, &fx, &e, op, "empty.ax1", false, t);
    over_all(&mut c, &fx, &e, op, "empty.all", t);

    // [4,1] along the size-1 axis
    let one: Tensor<(C<4>, C<1>), f32, D> = fx.tensor("one.in0", dev);
    along::<1, _, _, _>(&mut c, &fx, &one, op, "one.ax1", false, t);
    along::<1, _, _, _>(&mut c, &fx, &one, op, "one.ax1k", true, t);

    // f64
    let x64: Tensor<(C<3>, C<4>, C<5>), f64, D> = fx.tensor("x64.in0", dev);
    along::<2, _, _, _>(&mut c, &fx, &x64, op, "x64.ax2", false, F64_TOL);
    along::<0, _, _, _>(&mut c, &fx, &x64, op, "x64.ax0k", true, F64_TOL);
    over_all(&mut c, &fx, &x64, op, "x64.all", F64_TOL);

    // every PyTorch result of this op in the file was compared
    let stored = fx
        .keys()
        .iter()
        .filter(|k| k.starts_with(&format!("{op}.")) && k.ends_with(".out"))
        .count();
    if c.count() != stored {
        c.fail(format!(
            "{op}: compared {} results but the fixture holds {stored}",
            c.count()
        ));
    }
    c.finish();
}

device_tests! {
    fn sum<D>(dev) { check_op(dev, "sum") }
    fn mean<D>(dev) { check_op(dev, "mean") }
    /// `max` is PyTorch's `amax`: NaN wins.
    fn max<D>(dev) { check_op(dev, "max") }
    fn min<D>(dev) { check_op(dev, "min") }
    fn prod<D>(dev) { check_op(dev, "prod") }
    /// Stable on ±1000 and Inf; an all -Inf row gives -Inf, an empty one -Inf.
    fn logsumexp<D>(dev) { check_op(dev, "logsumexp") }
    fn var_unbiased<D>(dev) { check_op(dev, "var_u") }
    fn var_biased<D>(dev) { check_op(dev, "var_b") }
    fn std_unbiased<D>(dev) { check_op(dev, "std_u") }
    fn std_biased<D>(dev) { check_op(dev, "std_b") }
    /// First maximum; NaN counts as the maximum.
    fn argmax<D>(dev) { check_op(dev, "argmax") }
    /// First minimum; NaN counts as the minimum.
    fn argmin<D>(dev) { check_op(dev, "argmin") }

    /// Keepdim gives a broadcasting `One`: `x - x.mean_keepdim::<1>()` centres rows.
    fn keepdim_broadcasts_back<D>(dev) {
        let fx = Fixture::load("reduce");
        let x: Tensor<(C<3>, C<4>, C<5>), f32, D> = fx.tensor("x.in0", dev);
        let centred: Tensor<(C<3>, C<4>, C<5>), f32, D> = &x - &x.mean_keepdim::<1>();
        let zeros = centred.sum::<1>().to_vec();
        assert_close(&zeros, &[0.0; 15], 0.0, 1e-5);
    }

    /// max/min/argmax/argmin over an empty axis (or of an empty tensor) are
    /// errors, as in PyTorch; the plain forms panic.
    fn extremes_of_empty_axis_are_errors<D>(dev) {
        let e: Tensor<(Dyn, C<3>), f32, D> = Tensor::zeros_on((Dyn(0), C), dev);
        assert!(e.try_reduce::<0>(ReduceOp::Max).is_err());
        assert!(e.try_reduce::<0>(ReduceOp::Min).is_err());
        assert!(e.try_reduce_keepdim::<0>(ReduceOp::Max).is_err());
        assert!(e.try_reduce_all(ReduceOp::Max).is_err());
        assert!(e.try_reduce_all(ReduceOp::Min).is_err());
        // The named forms: `try_` returns PyTorch's refusal as an error.
        assert!(e.try_max::<0>().is_err());
        assert!(e.try_min_keepdim::<0>().is_err());
        assert!(e.try_max_all().is_err());
        assert!(e.try_argmax::<0>().is_err());
        assert!(e.try_argmin::<0>().is_err());
        assert!(e.try_argmax_all().is_err());
        assert!(e.try_argmin_all().is_err());
        assert_eq!(e.try_sum::<0>().unwrap().to_vec(), vec![0.0; 3]);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.argmax::<0>()));
        assert!(r.is_err(), "argmax over an empty axis must panic");
        // an empty *result* is fine
        assert_eq!(e.try_reduce::<1>(ReduceOp::Max).unwrap().dims().to_vec(), vec![0]);
    }
}
