//! Comparisons (eq ne lt le gt ge), `masked_fill` and `where_cond` against
//! PyTorch (`tools/fixtures/cmp.safetensors`): ties, broadcasting, NaN/Inf
//! operands, non-contiguous views, size-0 dims and f64. Masks compare
//! exactly; selected values are copies, so they compare exactly too.

use crate::common;

use common::*;
use forma::core::device::Device;
use forma::core::shape::op::Elementwise;
use forma::core::shape::BroadcastShape;
use forma::core::{Error, Float, Shape, Tensor};
use forma::{where_cond, Dyn, One, C};

type Mask<S1, S2, D> = Tensor<<S1 as BroadcastShape<S2>>::Output, bool, D>;
type CmpFn<S1, S2, E, D> = fn(&Tensor<S1, E, D>, &Tensor<S2, E, D>) -> Mask<S1, S2, D>;
type Named<S1, S2, E, D> = (&'static str, CmpFn<S1, S2, E, D>);

fn ops<S1, S2, E, D>() -> Vec<Named<S1, S2, E, D>>
where
    S1: Elementwise<S2>,
    S2: Shape,
    E: Float,
    D: Device<E>,
{
    let table: &[Named<S1, S2, E, D>] = &[
        ("eq", |a, b| a.eq(b)),
        ("ne", |a, b| a.ne(b)),
        ("lt", |a, b| a.lt(b)),
        ("le", |a, b| a.le(b)),
        ("gt", |a, b| a.gt(b)),
        ("ge", |a, b| a.ge(b)),
    ];
    table.to_vec()
}

fn check_pair<S1, S2, E, D>(fx: &Fixture, a: &Tensor<S1, E, D>, b: &Tensor<S2, E, D>, pair: &str)
where
    S1: Elementwise<S2>,
    S2: Shape,
    E: Float,
    D: Device<E>,
{
    let mut c = Checks::new(fx);
    for (name, f) in ops::<S1, S2, E, D>() {
        c.close(&f(a, b), &format!("{name}.{pair}.out"), EXACT);
    }
    c.finish();
}

device_tests! {
    /// Small integers, so that ties exercise `le`/`ge`/`eq`.
    fn compare_same_shape<D>(dev) {
        let fx = Fixture::load("cmp");
        let a: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("same.in0", dev);
        let b: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("same.in1", dev);
        check_pair(&fx, &a, &b, "same");
    }

    /// [3,1] (One) against [4].
    fn compare_broadcast<D>(dev) {
        let fx = Fixture::load("cmp");
        let a: Tensor<(C<3>, One), f32, D> = fx.tensor("col.in0", dev);
        let b: Tensor<(C<4>,), f32, D> = fx.tensor("col.in1", dev);
        let m: Tensor<(C<3>, C<4>), bool, D> = a.lt(&b);
        assert_eq!(m.dims().to_vec(), vec![3, 4]);
        check_pair(&fx, &a, &b, "col");
    }

    /// NaN compares unequal to everything (`ne` true), -0 == 0, Inf ordering.
    fn compare_special_values<D>(dev) {
        let fx = Fixture::load("cmp");
        let a: Tensor<(C<9>, One), f32, D> = fx.tensor("special.in0", dev);
        let b: Tensor<(One, C<9>), f32, D> = fx.tensor("special.in1", dev);
        check_pair(&fx, &a, &b, "special");
    }

    fn compare_noncontiguous<D>(dev) {
        let fx = Fixture::load("cmp");
        let a: Tensor<(C<4>, C<3>), f32, D> = fx.tensor("nc.in0", dev);
        let b: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("nc.in1", dev);
        check_pair(&fx, &a.t(), &b, "nc");
    }

    fn compare_empty<D>(dev) {
        let fx = Fixture::load("cmp");
        let a: Tensor<(Dyn, C<4>), f32, D> = fx.tensor("empty.in0", dev);
        let b: Tensor<(C<4>,), f32, D> = fx.tensor("empty.in1", dev);
        check_pair(&fx, &a, &b, "empty");
    }

    fn compare_f64<D>(dev) {
        let fx = Fixture::load("cmp");
        let a: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("same64.in0", dev);
        let b: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("same64.in1", dev);
        check_pair(&fx, &a, &b, "same64");
    }

    fn compare_dyn_mismatch_is_a_shape_error<D>(dev) {
        let a: Tensor<(Dyn,), f32, D> = Tensor::zeros_on((Dyn(3),), dev);
        let b: Tensor<(Dyn,), f32, D> = Tensor::zeros_on((Dyn(4),), dev);
        match a.try_lt(&b) {
            Err(Error::Shape(e)) => {
                assert_eq!(e.op, "compare");
                assert_eq!(e.actual, "[4]");
            }
            other => panic!("expected a shape error, got {:?}", other.map(|t| t.dims())),
        }
    }

    /// Full mask, a [4] mask and a [3,1] (One) mask broadcast to [3,4];
    /// fill values -1e9, 2.5, NaN, -Inf; NaN/Inf in the data survive where unmasked.
    fn masked_fill_matches_torch<D>(dev) {
        let fx = Fixture::load("cmp");
        let x: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("mf.x.in0", dev);
        let mut c = Checks::new(&fx);
        let m: Tensor<(C<3>, C<4>), bool, D> = fx.tensor("mf.full.in1", dev);
        c.close(&x.masked_fill(&m, -1e9), "mf.full.out", EXACT);
        let m: Tensor<(C<4>,), bool, D> = fx.tensor("mf.row.in1", dev);
        c.close(&x.masked_fill(&m, 2.5), "mf.row.out", EXACT);
        let m: Tensor<(C<3>, One), bool, D> = fx.tensor("mf.col.in1", dev);
        c.close(&x.masked_fill(&m, f64::NAN), "mf.col.out", EXACT);
        // the mask is `same.in0 > 0`
        let s: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("same.in0", dev);
        let zero: Tensor<(), f32, D> = Tensor::zeros_on((), dev);
        c.close(&x.masked_fill(&s.gt(&zero), f64::NEG_INFINITY), "mf.inf.out", EXACT);
        let xb: Tensor<(C<4>, C<3>), f32, D> = fx.tensor("mf.nc.in0", dev);
        let m: Tensor<(C<3>, C<4>), bool, D> = fx.tensor("mf.nc.in1", dev);
        c.close(&xb.t().masked_fill(&m, 0.0), "mf.nc.out", EXACT);
        let x64: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("mf.x64.in0", dev);
        let m: Tensor<(C<3>, C<4>), bool, D> = fx.tensor("mf.full.in1", dev);
        c.close(&x64.masked_fill(&m, -0.125), "mf.x64.out", EXACT);
        c.finish();
    }

    fn masked_fill_dyn_mismatch_is_a_shape_error<D>(dev) {
        let x: Tensor<(Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(3), Dyn(4)), dev);
        let m: Tensor<(Dyn,), bool, D> = Tensor::full_on((Dyn(3),), true, dev);
        match x.try_masked_fill(&m, 1.0) {
            Err(Error::Shape(e)) => assert_eq!((e.op, e.actual.as_str()), ("masked_fill", "[3]")),
            other => panic!("expected a shape error, got {:?}", other.map(|t| t.dims())),
        }
    }

    /// where(cond [3,4], a [3,4] with NaN/Inf, b [4]); where with every
    /// operand broadcast (cond [3,1], a [1,4], b [3,1]); a transposed `a`; f64; empty.
    fn where_cond_matches_torch<D>(dev) {
        let fx = Fixture::load("cmp");
        let mut c = Checks::new(&fx);

        let cond: Tensor<(C<3>, C<4>), bool, D> = fx.tensor("where.full.in0", dev);
        let a: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("where.full.in1", dev);
        let b: Tensor<(C<4>,), f32, D> = fx.tensor("where.full.in2", dev);
        c.close(&where_cond(&cond, &a, &b), "where.full.out", EXACT);

        let cond: Tensor<(C<3>, One), bool, D> = fx.tensor("where.bcast.in0", dev);
        let a: Tensor<(One, C<4>), f32, D> = fx.tensor("where.bcast.in1", dev);
        let b: Tensor<(C<3>, One), f32, D> = fx.tensor("where.bcast.in2", dev);
        let y: Tensor<(C<3>, C<4>), f32, D> = where_cond(&cond, &a, &b);
        c.close(&y, "where.bcast.out", EXACT);

        let cond: Tensor<(C<3>, C<4>), bool, D> = fx.tensor("where.nc.in0", dev);
        let a: Tensor<(C<4>, C<3>), f32, D> = fx.tensor("where.nc.in1", dev);
        let b: Tensor<(C<3>, C<4>), f32, D> = fx.tensor("where.nc.in2", dev);
        c.close(&where_cond(&cond, &a.t(), &b), "where.nc.out", EXACT);

        let cond: Tensor<(C<3>, C<4>), bool, D> = fx.tensor("where.f64.in0", dev);
        let a: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("where.f64.in1", dev);
        let b: Tensor<(C<3>, C<4>), f64, D> = fx.tensor("where.f64.in2", dev);
        c.close(&where_cond(&cond, &a, &b), "where.f64.out", EXACT);

        let cond: Tensor<(Dyn, C<4>), bool, D> = fx.tensor("where.empty.in0", dev);
        let a: Tensor<(Dyn, C<4>), f32, D> = fx.tensor("where.empty.in1", dev);
        let b: Tensor<(C<4>,), f32, D> = fx.tensor("where.empty.in2", dev);
        c.close(&where_cond(&cond, &a, &b), "where.empty.out", EXACT);
        c.finish();
    }

    fn where_cond_dyn_mismatch_is_a_shape_error<D>(dev) {
        let cond: Tensor<(Dyn,), bool, D> = Tensor::full_on((Dyn(5),), true, dev);
        let a: Tensor<(Dyn,), f32, D> = Tensor::zeros_on((Dyn(3),), dev);
        let b: Tensor<(Dyn,), f32, D> = Tensor::zeros_on((Dyn(3),), dev);
        match forma::try_where_cond(&cond, &a, &b) {
            Err(Error::Shape(e)) => assert_eq!((e.op, e.actual.as_str()), ("where", "[5]")),
            other => panic!("expected a shape error, got {:?}", other.map(|t| t.dims())),
        }
    }
}

#[test]
fn logical_ops_on_masks_broadcast_like_pytorch() {
    // a: (2, 1) = [[T], [F]]; b: (3,) = [T, F, T]. Every pair of values
    // meets once in the (2, 3) result, so each truth table is checked whole.
    let x = forma::Tensor::<(C<2>, One)>::from_vec(vec![1., 0.], (C, One)).unwrap();
    let y = forma::Tensor::<(C<3>,)>::from_vec(vec![1., 0., 1.], (C,)).unwrap();
    let zero = forma::Tensor::<(One,)>::zeros();
    let (a, b) = (x.ne(&zero), y.ne(&zero));
    let and: forma::Tensor<(C<2>, C<3>), bool> = a.logical_and(&b);
    assert_eq!(and.to_vec(), [true, false, true, false, false, false]);
    assert_eq!(
        a.logical_or(&b).to_vec(),
        [true, true, true, true, false, true]
    );
    assert_eq!(
        a.logical_xor(&b).to_vec(),
        [false, true, false, true, false, true]
    );
    assert_eq!(b.logical_not().to_vec(), [false, true, false]);
    // On a strided view (the transpose of a (2, 3) mask).
    assert_eq!(
        and.transpose::<0, 1>().logical_not().to_vec(),
        [false, true, true, true, false, true]
    );
    // `Dyn` sizes that do not broadcast are an error naming both shapes.
    let d = forma::Tensor::<(Dyn,)>::zeros_with((Dyn(4),))
        .eq(&forma::Tensor::<(Dyn,)>::zeros_with((Dyn(4),)));
    let e = forma::Tensor::<(Dyn,)>::zeros_with((Dyn(3),))
        .eq(&forma::Tensor::<(Dyn,)>::zeros_with((Dyn(3),)));
    let err = d.try_logical_and(&e).unwrap_err();
    assert!(matches!(err, Error::Shape(_)), "{err}");
}
