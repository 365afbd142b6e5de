//! Sorting against PyTorch (`tools/fixtures/sort.safetensors`): `sort`
//! (stable) along each axis of a rank-3 tensor in both directions, `topk`
//! largest and smallest, NaN and ties, and the gradient of `sum(values * w)`.
//! Values and gradients exact (a permutation moves values without arithmetic);
//! indices equal.

use crate::common;

use common::*;
use forma::core::Tensor;
use forma::{Dyn, C};

type X = (C<3>, C<4>, C<5>);

fn check_indices<S: forma::Shape, D: TestDevice>(
    c: &mut Checks,
    fx: &Fixture,
    got: &Tensor<S, i64, D>,
    key: &str,
) {
    let (want, dims) = fx.i64(key);
    if got.dims()[..] != dims[..] || got.to_vec() != want {
        c.fail(format!("{key}: got {:?}, want {want:?}", got.to_vec()));
    }
}

device_tests! {
    fn sort_each_axis<D>(dev) {
        let fx = Fixture::load("sort");
        let mut c = Checks::new(&fx);
        macro_rules! axis {
            ($ax:literal) => {
                for desc in [false, true] {
                    let name = format!("sort.ax{}.{}", $ax, if desc { "desc" } else { "asc" });
                    let x: Tensor<X, f32, D> = fx.tensor::<X, f32, D>("x.in0", dev).requires_grad();
                    let (v, i) = x.sort::<$ax>(desc);
                    c.close(&v, &format!("{name}.values"), EXACT);
                    check_indices(&mut c, &fx, &i, &format!("{name}.indices"));
                    let w: Tensor<X, f32, D> = fx.tensor(&format!("{name}.w"), dev);
                    (&v * &w).sum_all().backward();
                    c.close(&x.grad().expect("a gradient"), &format!("{name}.grad"), EXACT);
                    check_indices(&mut c, &fx, &x.argsort::<$ax>(desc), &format!("{name}.indices"));
                }
            };
        }
        axis!(0);
        axis!(1);
        axis!(2);
        c.finish();
    }

    fn topk<D>(dev) {
        let fx = Fixture::load("sort");
        let mut c = Checks::new(&fx);
        for (k, largest) in [(2, true), (3, false), (5, true)] {
            let name = format!("topk.k{k}.{}", if largest { "largest" } else { "smallest" });
            let x: Tensor<X, f32, D> = fx.tensor::<X, f32, D>("x.in0", dev).requires_grad();
            let (v, i) = x.topk::<2>(k, largest);
            c.close(&v, &format!("{name}.values"), EXACT);
            check_indices(&mut c, &fx, &i, &format!("{name}.indices"));
            let w: Tensor<(C<3>, C<4>, Dyn), f32, D> = fx.tensor(&format!("{name}.w"), dev);
            (&v * &w).sum_all().backward();
            c.close(&x.grad().expect("a gradient"), &format!("{name}.grad"), EXACT);
        }
        let x: Tensor<X, f32, D> = fx.tensor("x.in0", dev);
        let err = x.try_topk::<2>(6, true).unwrap_err().to_string();
        assert!(err.contains("k = 6 is larger than axis 2 of size 5"), "{err}");
        c.finish();
    }

    /// NaN above every number; ties in input order.
    fn nan_and_ties<D>(dev) {
        let fx = Fixture::load("sort");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<2>, C<8>), f32, D> = fx.tensor("special.in0", dev);
        for (desc, tag) in [(false, "asc"), (true, "desc")] {
            let (v, i) = x.sort::<1>(desc);
            c.close(&v, &format!("special.{tag}.values"), EXACT);
            check_indices(&mut c, &fx, &i, &format!("special.{tag}.indices"));
        }
        c.finish();
    }
}
