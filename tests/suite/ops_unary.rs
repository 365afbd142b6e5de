//! Elementwise unary ops against PyTorch (`tools/fixtures/unary.safetensors`):
//! every row of the unary table on typical, positive and special (NaN, ±Inf,
//! ±0, tiny, huge) inputs, non-contiguous views, size-0 and size-1 dims, and
//! f64/f16/bf16. Tolerances: f32 rtol 1e-5 / atol 1e-6, f64 1e-12, f16 and
//! bf16 two units in the last place.

use crate::common;

use common::*;
use forma::core::device::Device;
use forma::core::{Float, Shape, Tensor};
use forma::{Dyn, One, C};
use half::{bf16, f16};

type UnaryFn<S, E, D> = fn(&Tensor<S, E, D>) -> Tensor<S, E, D>;

/// Every unary op with the parameters `tools/gen_fixtures.py` uses, named as
/// in the fixture keys (`<name>.<input>.out`).
fn ops<S: Shape, E: Float, D: Device<E>>() -> Vec<(&'static str, UnaryFn<S, E, D>)> {
    let table: &[(&'static str, UnaryFn<S, E, D>)] = &[
        ("neg", |x| x.neg()),
        ("exp", |x| x.exp()),
        ("log", |x| x.log()),
        ("log1p", |x| x.log1p()),
        ("sqrt", |x| x.sqrt()),
        ("rsqrt", |x| x.rsqrt()),
        ("recip", |x| x.recip()),
        ("square", |x| x.square()),
        ("abs", |x| x.abs()),
        ("sin", |x| x.sin()),
        ("cos", |x| x.cos()),
        ("tanh", |x| x.tanh()),
        ("sigmoid", |x| x.sigmoid()),
        ("relu", |x| x.relu()),
        ("gelu", |x| x.gelu()),
        ("gelu_tanh", |x| x.gelu_tanh()),
        ("silu", |x| x.silu()),
        ("hardswish", |x| x.hardswish()),
        ("leaky_relu", |x| x.leaky_relu(0.2)),
        ("leaky_relu_default", |x| x.leaky_relu(0.01)),
        ("pow_scalar", |x| x.pow_scalar(2.5)),
        ("pow_scalar_int", |x| x.pow_scalar(3.0)),
        ("pow_scalar_neg", |x| x.pow_scalar(-1.5)),
        ("add_scalar", |x| x.add_scalar(1.5)),
        ("mul_scalar", |x| x.mul_scalar(-2.5)),
        ("div_scalar", |x| x.div_scalar(3.0)),
        ("clamp", |x| x.clamp(-0.5, 0.75)),
        ("clamp_min", |x| x.clamp_min(-0.5)),
        ("clamp_max", |x| x.clamp_max(0.75)),
    ];
    table.to_vec()
}

/// Applies every op to `x` and compares with `<op>.<input>.out`.
fn check_all<S: Shape, E: Float + FixtureElem, D: Device<E>>(
    fx: &Fixture,
    x: &Tensor<S, E, D>,
    input: &str,
    tol: Tol,
) {
    let mut c = Checks::new(fx);
    for (name, f) in ops::<S, E, D>() {
        let y = f(x);
        c.close(&y, &format!("{name}.{input}.out"), tol);
    }
    c.finish();
}

device_tests! {
    /// Values in (-3, 3): negative inputs of log/sqrt/pow give NaN, as in PyTorch.
    fn typical_f32<D>(dev) {
        let fx = Fixture::load("unary");
        let x: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("any.in0", dev);
        check_all(&fx, &x, "any", F32_TOL);
    }

    fn positive_f32<D>(dev) {
        let fx = Fixture::load("unary");
        let x: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("pos.in0", dev);
        check_all(&fx, &x, "pos", F32_TOL);
    }

    /// NaN, ±Inf, ±0, 1e-8, ±100, ±1e30, 88: propagation, overflow, underflow.
    fn special_values_f32<D>(dev) {
        let fx = Fixture::load("unary");
        let x: Tensor<(C<4>, C<4>), f32, D> = fx.tensor("special.in0", dev);
        check_all(&fx, &x, "special", F32_TOL);
    }

    /// A transposed view (stored [4,3], used as `.t()`).
    fn noncontiguous_transpose<D>(dev) {
        let fx = Fixture::load("unary");
        let base: Tensor<(C<4>, C<3>), f32, D> = fx.tensor("nc.in0", dev);
        let x = base.t();
        assert!(!x.is_contiguous());
        check_all(&fx, &x, "nc", F32_TOL);
    }

    /// A view with an offset and a step (stored [3,8], used as `[:, 1::2]`).
    fn noncontiguous_offset_step<D>(dev) {
        let fx = Fixture::load("unary");
        let base: Tensor<(C<3>, C<8>), f32, D> = fx.tensor("ncs.in0", dev);
        let x = base.slice::<1>(1, 8, 2);
        assert_eq!(x.dims().to_vec(), vec![3, 4]);
        assert!(!x.is_contiguous());
        check_all(&fx, &x, "ncs", F32_TOL);
    }

    fn empty_dim<D>(dev) {
        let fx = Fixture::load("unary");
        let x: Tensor<(Dyn, C<3>), f32, D> = fx.tensor("empty.in0", dev);
        assert_eq!(x.numel(), 0);
        check_all(&fx, &x, "empty", F32_TOL);
    }

    fn size_one_dims<D>(dev) {
        let fx = Fixture::load("unary");
        let x: Tensor<(C<1>, C<3>, One), f32, D> = fx.tensor("one.in0", dev);
        check_all(&fx, &x, "one", F32_TOL);
    }

    fn typical_f64<D>(dev) {
        let fx = Fixture::load("unary");
        let x: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("any64.in0", dev);
        check_all(&fx, &x, "any64", F64_TOL);
    }

    fn special_values_f64<D>(dev) {
        let fx = Fixture::load("unary");
        let x: Tensor<(C<4>, C<4>), f64, D> = fx.tensor("special64.in0", dev);
        check_all(&fx, &x, "special64", F64_TOL);
    }

    /// f16 computes in f32 and rounds once, like PyTorch's CPU kernels.
    fn typical_f16<D>(dev) {
        let fx = Fixture::load("unary");
        let x: Tensor<(C<3>, C<4>), f16, D> = fx.tensor("f16.in0", dev);
        check_all(&fx, &x, "f16", F16_TOL);
    }

    fn typical_bf16<D>(dev) {
        let fx = Fixture::load("unary");
        let x: Tensor<(C<3>, C<4>), bf16, D> = fx.tensor("bf16.in0", dev);
        check_all(&fx, &x, "bf16", BF16_TOL);
    }

    /// The scalar operators and `-x` are the table rows.
    fn scalar_operators<D>(dev) {
        let fx = Fixture::load("unary");
        let x: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("any.in0", dev);
        fx.check(&(&x + 1.5f32), "add_scalar.any.out", F32_TOL);
        fx.check(&(&x * -2.5f32), "mul_scalar.any.out", F32_TOL);
        fx.check(&(&x / 3.0f32), "div_scalar.any.out", F32_TOL);
        fx.check(&(-&x), "neg.any.out", F32_TOL);
        // x - 1.5 is x + (-1.5)
        let want = fx.array::<f32>("any.in0").data.iter().map(|v| v - 1.5).collect::<Vec<_>>();
        assert_close(&(x.clone() - 1.5f32).to_vec(), &want, 1e-6, 1e-6);
        let x64: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("any64.in0", dev);
        fx.check(&(x64.clone() + 1.5f64), "add_scalar.any64.out", F64_TOL);
        fx.check(&(x64 / 3.0f64), "div_scalar.any64.out", F64_TOL);
    }

    /// Unary ops return a new row-major tensor and leave the input alone.
    fn results_are_fresh_storage<D>(dev) {
        let fx = Fixture::load("unary");
        let base: Tensor<(C<4>, C<3>), f32, D> = fx.tensor("nc.in0", dev);
        let before = base.to_vec();
        let y = base.t().exp();
        assert!(y.is_contiguous());
        assert!(!y.shares_storage(&base));
        assert_eq!(base.to_vec(), before);
    }
}
