//! Elementwise binary ops (add sub mul div pow maximum minimum fmax fmin) against
//! PyTorch (`tools/fixtures/binary.safetensors`): same shapes, broadcasting
//! with `One` dims on either side, lower rank on either side, rank-0
//! operands, every pair of special values (NaN, ±Inf, ±0), non-contiguous
//! views, size-0 and static size-1 dims, `Dyn` operands that broadcast at run
//! time, f64; the `+ - * /` operators; runtime shape errors.
//! Tolerances: f32 rtol 1e-5 / atol 1e-6, f64 1e-12.

use crate::common;

use common::*;
use forma::core::device::Device;
use forma::core::shape::op::Elementwise;
use forma::core::shape::BroadcastShape;
use forma::core::{Error, Float, Shape, ShapeError, Tensor};
use forma::{Dyn, One, C};

type Out<S1, S2, E, D> = Tensor<<S1 as BroadcastShape<S2>>::Output, E, D>;
type BinaryFn<S1, S2, E, D> = fn(&Tensor<S1, E, D>, &Tensor<S2, E, D>) -> Out<S1, S2, E, D>;
type Named<S1, S2, E, D> = (&'static str, BinaryFn<S1, S2, E, D>);

/// Every binary op, named as in the fixture keys (`<op>.<pair>.out`).
fn ops<S1, S2, E, D>() -> Vec<Named<S1, S2, E, D>>
where
    S1: Elementwise<S2>,
    S2: Shape,
    E: Float,
    D: Device<E>,
{
    let table: &[Named<S1, S2, E, D>] = &[
        ("add", |a, b| a.add(b)),
        ("sub", |a, b| a.sub(b)),
        ("mul", |a, b| a.mul(b)),
        ("div", |a, b| a.div(b)),
        ("pow", |a, b| a.pow(b)),
        ("maximum", |a, b| a.maximum(b)),
        ("minimum", |a, b| a.minimum(b)),
        ("fmax", |a, b| a.fmax(b)),
        ("fmin", |a, b| a.fmin(b)),
    ];
    table.to_vec()
}

/// Loads `<pair>.in0`/`.in1`, lets `view` build the operands, applies every
/// op and compares with `<op>.<pair>.out`.
fn check_pair<S1, S2, E, D>(
    fx: &Fixture,
    a: &Tensor<S1, E, D>,
    b: &Tensor<S2, E, D>,
    pair: &str,
    tol: Tol,
) where
    S1: Elementwise<S2>,
    S2: Shape,
    E: Float + FixtureElem,
    D: Device<E>,
{
    let mut c = Checks::new(fx);
    for (name, f) in ops::<S1, S2, E, D>() {
        c.close(&f(a, b), &format!("{name}.{pair}.out"), tol);
    }
    c.finish();
}

device_tests! {
    fn same_shape<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("same.in0", dev);
        let b: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("same.in1", dev);
        check_pair(&fx, &a, &b, "same", F32_TOL);
    }

    /// [2,3,4] op [3,1]: the trailing size-1 dim is `One` and stretches.
    fn broadcast_one_dim<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(C<2>, C<3>, C<4>), f32, D> = fx.tensor("col.in0", dev);
        let b: Tensor<(C<3>, One), f32, D> = fx.tensor("col.in1", dev);
        let y: Tensor<(C<2>, C<3>, C<4>), f32, D> = a.add(&b);
        fx.check(&y, "add.col.out", F32_TOL);
        check_pair(&fx, &a, &b, "col", F32_TOL);
    }

    /// [4] op [2,3,4]: the lower-rank operand on the left.
    fn broadcast_lower_rank_left<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(C<4>,), f32, D> = fx.tensor("row.in0", dev);
        let b: Tensor<(C<2>, C<3>, C<4>), f32, D> = fx.tensor("row.in1", dev);
        check_pair(&fx, &a, &b, "row", F32_TOL);
    }

    /// [3,1] op [1,4] -> [3,4]: `One` on both sides.
    fn broadcast_outer<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(C<3>, One), f32, D> = fx.tensor("outer.in0", dev);
        let b: Tensor<(One, C<4>), f32, D> = fx.tensor("outer.in1", dev);
        let y: Tensor<(C<3>, C<4>), f32, D> = a.mul(&b);
        assert_eq!(y.dims().to_vec(), vec![3, 4]);
        check_pair(&fx, &a, &b, "outer", F32_TOL);
    }

    /// Rank-0 operands on the right and on the left.
    fn broadcast_scalar_shaped<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(C<2>, C<3>), f32, D> = fx.tensor("scalar_r.in0", dev);
        let s: Tensor<(), f32, D> = fx.tensor("scalar_r.in1", dev);
        check_pair(&fx, &a, &s, "scalar_r", F32_TOL);
        let s: Tensor<(), f32, D> = fx.tensor("scalar_l.in0", dev);
        let b: Tensor<(C<2>, C<3>), f32, D> = fx.tensor("scalar_l.in1", dev);
        check_pair(&fx, &s, &b, "scalar_l", F32_TOL);
    }

    /// All 81 pairs of NaN, ±Inf, ±0, ±1, 2.5, -0.5 ([9,1] op [1,9]).
    fn special_values<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(C<9>, One), f32, D> = fx.tensor("special.in0", dev);
        let b: Tensor<(One, C<9>), f32, D> = fx.tensor("special.in1", dev);
        check_pair(&fx, &a, &b, "special", F32_TOL);
    }

    /// a stored [4,3] used as `.t()`; b stored [3,8] used as `[:, 1::2]`.
    fn noncontiguous<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(C<4>, C<3>), f32, D> = fx.tensor("nc.in0", dev);
        let b: Tensor<(C<3>, C<8>), f32, D> = fx.tensor("nc.in1", dev);
        let (a, b) = (a.t(), b.slice::<1>(1, 8, 2));
        assert!(!a.is_contiguous() && !b.is_contiguous());
        check_pair(&fx, &a, &b, "nc", F32_TOL);
    }

    /// [0,4] op [1,4] -> [0,4].
    fn empty_dim<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(Dyn, C<4>), f32, D> = fx.tensor("empty.in0", dev);
        let b: Tensor<(One, C<4>), f32, D> = fx.tensor("empty.in1", dev);
        check_pair(&fx, &a, &b, "empty", F32_TOL);
    }

    /// A static `C<1>` is an ordinary size: [1,3] op [1,3].
    fn static_size_one<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(C<1>, C<3>), f32, D> = fx.tensor("ones.in0", dev);
        let b: Tensor<(C<1>, C<3>), f32, D> = fx.tensor("ones.in1", dev);
        check_pair(&fx, &a, &b, "ones", F32_TOL);
    }

    /// `Dyn` operands whose sizes ([3,1] and [1,4]) broadcast at run time.
    fn dyn_runtime_broadcast<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(Dyn, Dyn), f32, D> = fx.tensor("dyn.in0", dev);
        let b: Tensor<(Dyn, Dyn), f32, D> = fx.tensor("dyn.in1", dev);
        let y = a.try_add(&b).unwrap();
        assert_eq!(y.shape(), (Dyn(3), Dyn(4)));
        check_pair(&fx, &a, &b, "dyn", F32_TOL);
    }

    fn same_shape_f64<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("same64.in0", dev);
        let b: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("same64.in1", dev);
        check_pair(&fx, &a, &b, "same64", F64_TOL);
    }

    fn broadcast_f64<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(C<2>, C<3>, C<4>), f64, D> = fx.tensor("col64.in0", dev);
        let b: Tensor<(C<3>, One), f64, D> = fx.tensor("col64.in1", dev);
        check_pair(&fx, &a, &b, "col64", F64_TOL);
    }

    fn special_values_f64<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(C<9>, One), f64, D> = fx.tensor("special64.in0", dev);
        let b: Tensor<(One, C<9>), f64, D> = fx.tensor("special64.in1", dev);
        check_pair(&fx, &a, &b, "special64", F64_TOL);
    }

    /// `+ - * /` on references and values are the table rows.
    fn operators_match_methods<D>(dev) {
        let fx = Fixture::load("binary");
        let a: Tensor<(C<2>, C<3>, C<4>), f32, D> = fx.tensor("col.in0", dev);
        let b: Tensor<(C<3>, One), f32, D> = fx.tensor("col.in1", dev);
        fx.check(&(&a + &b), "add.col.out", F32_TOL);
        fx.check(&(&a - b.clone()), "sub.col.out", F32_TOL);
        fx.check(&(a.clone() * &b), "mul.col.out", F32_TOL);
        fx.check(&(a.clone() / b.clone()), "div.col.out", F32_TOL);
        fx.check(&a.try_sub(&b).unwrap(), "sub.col.out", F32_TOL);
        fx.check(&a.try_pow(&b).unwrap(), "pow.col.out", F32_TOL);
        fx.check(&a.try_maximum(&b).unwrap(), "maximum.col.out", F32_TOL);
        fx.check(&a.try_minimum(&b).unwrap(), "minimum.col.out", F32_TOL);
    }

    /// `Dyn` sizes that do not broadcast: a `ShapeError` naming both shapes
    /// from every `try_` form, and a panic with the same message from the plain form.
    fn dyn_mismatch_is_a_shape_error<D>(dev) {
        let a: Tensor<(Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(2), Dyn(3)), dev);
        let b: Tensor<(Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(2), Dyn(4)), dev);
        let err = a.try_add(&b).unwrap_err();
        assert_eq!(
            err,
            Error::Shape(ShapeError {
                op: "add",
                expected: "a shape that broadcasts with [2, 3]".into(),
                actual: "[2, 4]".into(),
            })
        );
        assert_eq!(err.to_string(), "add: expected shape a shape that broadcasts with [2, 3], got [2, 4]");
        for (name, r) in [
            ("sub", a.try_sub(&b)),
            ("mul", a.try_mul(&b)),
            ("div", a.try_div(&b)),
            ("pow", a.try_pow(&b)),
            ("maximum", a.try_maximum(&b)),
            ("minimum", a.try_minimum(&b)),
        ] {
            match r {
                Err(Error::Shape(e)) => assert_eq!((e.op, e.actual.as_str()), (name, "[2, 4]")),
                other => panic!("{name}: expected a shape error, got {:?}", other.map(|t| t.dims())),
            }
        }
        // A static operand against a Dyn one is checked at run time too.
        let s: Tensor<(C<2>, C<3>), f32, D> = Tensor::zeros_on((C, C), dev);
        assert!(matches!(s.try_add(&b), Err(Error::Shape(_))));
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.add(&b))).unwrap_err();
        let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert_eq!(msg, "add: expected shape a shape that broadcasts with [2, 3], got [2, 4]");
    }

    /// A static size that a `Dyn` operand would stretch at run time (`C<1>`
    /// meeting a `Dyn` of 4) is refused, in both operand orders and in the
    /// comparisons, `where_cond` and fused expressions: the result's type
    /// states the static size, so a stretched result would make it lie.
    /// Stretching `One`, or a `Dyn` of 1 against the static size, still works.
    fn a_static_size_is_not_stretched_by_a_dyn_operand<D>(dev) {
        let s: Tensor<(C<3>, C<1>), f32, D> = Tensor::ones_on((C, C), dev);
        let d: Tensor<(Dyn, Dyn), f32, D> = Tensor::ones_on((Dyn(1), Dyn(4)), dev);
        let expected = "add: expected shape [3, 1] (the result's static sizes: a static size 1 does not stretch, `One` does), got [3, 4]";
        assert_eq!(s.try_add(&d).map(|t| t.dims()).unwrap_err().to_string(), expected);
        assert_eq!(d.try_add(&s).map(|t| t.dims()).unwrap_err().to_string(), expected);
        assert!(matches!(s.try_lt(&d), Err(Error::Shape(_))));
        let cond: Tensor<(C<3>, C<1>), bool, D> = s.gt(&s);
        assert!(matches!(forma::try_where_cond(&cond, &s, &d), Err(Error::Shape(_))));
        assert!(matches!(forma::try_fused((&s, &d), |(a, b)| a + b), Err(Error::Shape(_))));
        // What the types allow: a Dyn of 1 stretched to the static size, and `One`.
        let d1: Tensor<(Dyn, Dyn), f32, D> = Tensor::ones_on((Dyn(3), Dyn(1)), dev);
        let y: Tensor<(C<3>, C<1>), f32, D> = s.try_add(&d1).unwrap();
        assert_eq!(y.to_vec(), [2.0; 3]);
        let one: Tensor<(C<3>, One), f32, D> = Tensor::ones_on((C, One), dev);
        let wide: Tensor<(Dyn, Dyn), f32, D> = Tensor::ones_on((Dyn(1), Dyn(4)), dev);
        let z = one.try_add(&wide).unwrap();
        assert_eq!(&*z.dims(), &[3, 4]);
        // matmul's batch dims broadcast the same way.
        let a: Tensor<(C<1>, C<2>, C<3>), f32, D> = Tensor::ones_on((C, C, C), dev);
        let b: Tensor<(Dyn, C<3>, C<2>), f32, D> = Tensor::ones_on((Dyn(5), C, C), dev);
        assert!(matches!(a.try_matmul(&b), Err(Error::Shape(e)) if e.op == "matmul"));
    }
}
