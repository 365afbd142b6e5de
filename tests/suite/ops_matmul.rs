//! Matrix products against PyTorch's `torch.matmul`
//! (`tools/fixtures/matmul.safetensors`): matrix x matrix, vector promotion
//! on either side, batched products with broadcast batch dims, transposed
//! and permuted operands, size-0 m and k, size-1 dims, NaN/Inf propagation,
//! f64, `Dyn` operands and their runtime shape errors.
//! Tolerances: f32 rtol 1e-5 / atol 1e-5 (sums of products accumulate in a
//! different order than PyTorch's BLAS), f64 1e-12.

use crate::common;

use common::*;
use forma::core::device::Device;
use forma::core::shape::MatmulShape;
use forma::core::{Error, Float, Shape, ShapeError, Tensor};
use forma::{Ax, Dyn, One, C};

/// `a.matmul(b)` against `<case>.out`.
fn mm<S1, S2, E, D>(
    c: &mut Checks,
    a: &Tensor<S1, E, D>,
    b: &Tensor<S2, E, D>,
    case: &str,
    tol: Tol,
) where
    S1: MatmulShape<S2>,
    S2: Shape,
    E: Float + FixtureElem,
    D: Device<E>,
{
    c.close_ok(a.try_matmul(b), &format!("{case}.out"), tol);
}

device_tests! {
    fn matrix_matrix<D>(dev) {
        let fx = Fixture::load("matmul");
        let mut c = Checks::new(&fx);
        let a: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("mm.in0", dev);
        let b: Tensor<(C<4>, C<5>), f32, D> = fx.tensor("mm.in1", dev);
        let y: Tensor<(C<3>, C<5>), f32, D> = a.matmul(&b);
        c.close(&y, "mm.out", F32_SUM_TOL);
        let a: Tensor<(C<4>, C<64>), f32, D> = fx.tensor("wide.in0", dev);
        let b: Tensor<(C<64>, C<6>), f32, D> = fx.tensor("wide.in1", dev);
        mm(&mut c, &a, &b, "wide", F32_SUM_TOL);
        c.finish();
    }

    /// [4]@[4,5] -> [5], [3,4]@[4] -> [3], [4]@[4] -> [], [4]@[2,4,5] -> [2,5],
    /// [2,3,4]@[4] -> [2,3].
    fn vector_promotion<D>(dev) {
        let fx = Fixture::load("matmul");
        let mut c = Checks::new(&fx);
        let v: Tensor<(C<4>,), f32, D> = fx.tensor("vm.in0", dev);
        let m: Tensor<(C<4>, C<5>), f32, D> = fx.tensor("vm.in1", dev);
        let y: Tensor<(C<5>,), f32, D> = v.matmul(&m);
        c.close(&y, "vm.out", F32_SUM_TOL);

        let m: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("mv.in0", dev);
        let v: Tensor<(C<4>,), f32, D> = fx.tensor("mv.in1", dev);
        let y: Tensor<(C<3>,), f32, D> = m.matmul(&v);
        c.close(&y, "mv.out", F32_SUM_TOL);

        let u: Tensor<(C<4>,), f32, D> = fx.tensor("vv.in0", dev);
        let v: Tensor<(C<4>,), f32, D> = fx.tensor("vv.in1", dev);
        let y: Tensor<(), f32, D> = u.matmul(&v);
        c.close(&y, "vv.out", F32_SUM_TOL);

        let v: Tensor<(C<4>,), f32, D> = fx.tensor("v_b.in0", dev);
        let b: Tensor<(C<2>, C<4>, C<5>), f32, D> = fx.tensor("v_b.in1", dev);
        let y: Tensor<(C<2>, C<5>), f32, D> = v.matmul(&b);
        c.close(&y, "v_b.out", F32_SUM_TOL);

        let b: Tensor<(C<2>, C<3>, C<4>), f32, D> = fx.tensor("b_v.in0", dev);
        let v: Tensor<(C<4>,), f32, D> = fx.tensor("b_v.in1", dev);
        let y: Tensor<(C<2>, C<3>), f32, D> = b.matmul(&v);
        c.close(&y, "b_v.out", F32_SUM_TOL);
        c.finish();
    }

    /// [2,3,4]@[2,4,5]; batch dims [2,1]x[3] broadcast to [2,3]; a matrix
    /// broadcast over the other operand's batch, on either side.
    fn batched<D>(dev) {
        let fx = Fixture::load("matmul");
        let mut c = Checks::new(&fx);
        let a: Tensor<(C<2>, C<3>, C<4>), f32, D> = fx.tensor("bmm.in0", dev);
        let b: Tensor<(C<2>, C<4>, C<5>), f32, D> = fx.tensor("bmm.in1", dev);
        mm(&mut c, &a, &b, "bmm", F32_SUM_TOL);

        let a: Tensor<(C<2>, One, C<3>, C<4>), f32, D> = fx.tensor("bcast.in0", dev);
        let b: Tensor<(C<3>, C<4>, C<5>), f32, D> = fx.tensor("bcast.in1", dev);
        let y: Tensor<(C<2>, C<3>, C<3>, C<5>), f32, D> = a.matmul(&b);
        c.close(&y, "bcast.out", F32_SUM_TOL);

        let a: Tensor<(C<2>, C<3>, C<4>), f32, D> = fx.tensor("b3_2.in0", dev);
        let b: Tensor<(C<4>, C<5>), f32, D> = fx.tensor("b3_2.in1", dev);
        mm(&mut c, &a, &b, "b3_2", F32_SUM_TOL);

        let a: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("b2_3.in0", dev);
        let b: Tensor<(C<2>, C<4>, C<5>), f32, D> = fx.tensor("b2_3.in1", dev);
        let y: Tensor<(C<2>, C<3>, C<5>), f32, D> = a.matmul(&b);
        c.close(&y, "b2_3.out", F32_SUM_TOL);
        c.finish();
    }

    /// Transposed operands (stored [4,3] and [5,4], used as `.t()`), and a
    /// permuted batch (stored [3,2,4] as `.permute(1,0,2)`, [2,5,4] as `.transpose(1,2)`).
    fn noncontiguous<D>(dev) {
        let fx = Fixture::load("matmul");
        let mut c = Checks::new(&fx);
        let a: Tensor<(C<4>, C<3>), f32, D> = fx.tensor("nc.in0", dev);
        let b: Tensor<(C<5>, C<4>), f32, D> = fx.tensor("nc.in1", dev);
        mm(&mut c, &a.t(), &b.t(), "nc", F32_SUM_TOL);

        let a: Tensor<(C<3>, C<2>, C<4>), f32, D> = fx.tensor("nc3.in0", dev);
        let b: Tensor<(C<2>, C<5>, C<4>), f32, D> = fx.tensor("nc3.in1", dev);
        let a = a.permute::<(Ax<1>, Ax<0>, Ax<2>)>();
        let b = b.transpose::<1, 2>();
        mm(&mut c, &a, &b, "nc3", F32_SUM_TOL);
        c.finish();
    }

    /// [0,4]@[4,5] -> [0,5]; [3,0]@[0,5] -> zeros [3,5]; [1,4]@[4,1].
    fn empty_and_size_one<D>(dev) {
        let fx = Fixture::load("matmul");
        let mut c = Checks::new(&fx);
        let a: Tensor<(Dyn, C<4>), f32, D> = fx.tensor("empty_m.in0", dev);
        let b: Tensor<(C<4>, C<5>), f32, D> = fx.tensor("empty_m.in1", dev);
        mm(&mut c, &a, &b, "empty_m", F32_SUM_TOL);

        let a: Tensor<(C<3>, Dyn), f32, D> = fx.tensor("empty_k.in0", dev);
        let b: Tensor<(Dyn, C<5>), f32, D> = fx.tensor("empty_k.in1", dev);
        mm(&mut c, &a, &b, "empty_k", F32_SUM_TOL);

        let a: Tensor<(C<1>, C<4>), f32, D> = fx.tensor("ones.in0", dev);
        let b: Tensor<(C<4>, C<1>), f32, D> = fx.tensor("ones.in1", dev);
        mm(&mut c, &a, &b, "ones", F32_SUM_TOL);
        c.finish();
    }

    /// A NaN row stays NaN, an Inf row (times positive values) stays Inf.
    fn nan_inf_propagate<D>(dev) {
        let fx = Fixture::load("matmul");
        let a: Tensor<(C<3>, C<2>), f32, D> = fx.tensor("special.in0", dev);
        let b: Tensor<(C<2>, C<2>), f32, D> = fx.tensor("special.in1", dev);
        fx.check(&a.matmul(&b), "special.out", F32_SUM_TOL);
    }

    fn f64_products<D>(dev) {
        let fx = Fixture::load("matmul");
        let mut c = Checks::new(&fx);
        let a: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("mm64.in0", dev);
        let b: Tensor<(C<4>, C<5>), f64, D> = fx.tensor("mm64.in1", dev);
        mm(&mut c, &a, &b, "mm64", F64_TOL);
        let a: Tensor<(C<2>, C<3>, C<4>), f64, D> = fx.tensor("bmm64.in0", dev);
        let b: Tensor<(C<2>, C<4>, C<5>), f64, D> = fx.tensor("bmm64.in1", dev);
        mm(&mut c, &a, &b, "bmm64", F64_TOL);
        c.finish();
    }

    /// `Dyn` operands of matching sizes multiply like static ones.
    fn dyn_operands<D>(dev) {
        let fx = Fixture::load("matmul");
        let mut c = Checks::new(&fx);
        let a: Tensor<(Dyn, Dyn), f32, D> = fx.tensor("mm.in0", dev);
        let b: Tensor<(Dyn, Dyn), f32, D> = fx.tensor("mm.in1", dev);
        mm(&mut c, &a, &b, "mm", F32_SUM_TOL);
        let a: Tensor<(Dyn, Dyn, Dyn), f32, D> = fx.tensor("bmm.in0", dev);
        let b: Tensor<(Dyn, Dyn, Dyn), f32, D> = fx.tensor("bmm.in1", dev);
        mm(&mut c, &a, &b, "bmm", F32_SUM_TOL);
        c.finish();
    }

    /// Inner sizes and batch sizes are checked at run time for `Dyn` operands.
    fn dyn_mismatch_is_a_shape_error<D>(dev) {
        let a: Tensor<(Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(2), Dyn(3)), dev);
        let b: Tensor<(Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(4), Dyn(5)), dev);
        let err = a.try_matmul(&b).unwrap_err();
        assert_eq!(
            err,
            Error::Shape(ShapeError {
                op: "matmul",
                expected: "[.., 3, _] (the left operand is [2, 3])".into(),
                actual: "[4, 5]".into(),
            })
        );
        assert_eq!(err.to_string(), "matmul: expected shape [.., 3, _] (the left operand is [2, 3]), got [4, 5]");

        let a: Tensor<(Dyn, C<3>, C<4>), f32, D> = Tensor::zeros_on((Dyn(2), C, C), dev);
        let b: Tensor<(Dyn, C<4>, C<5>), f32, D> = Tensor::zeros_on((Dyn(3), C, C), dev);
        assert_eq!(
            a.try_matmul(&b).unwrap_err().to_string(),
            "matmul: expected shape batch dims that broadcast with [2], got [3]"
        );

        let v: Tensor<(Dyn,), f32, D> = Tensor::zeros_on((Dyn(3),), dev);
        let m: Tensor<(Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(4), Dyn(5)), dev);
        assert!(matches!(v.try_matmul(&m), Err(Error::Shape(_))));
    }
}
