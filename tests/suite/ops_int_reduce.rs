//! Reductions of `i64` tensors against PyTorch
//! (`tools/fixtures/int_reduce.safetensors`): `sum`, `prod`, `max` (`amax`)
//! and `min` (`amin`) along each axis, keeping it and over everything, on
//! random values, on values near the int64 limits (sums and products wrap
//! as PyTorch's do) and on small values whose products stay exact. Equal
//! values required.

use crate::common;

use common::*;
use forma::core::Tensor;
use forma::{Dyn, C};

/// `Checks::close` compares through f64, which cannot tell 2^53 from
/// 2^53 + 1: the values are compared as integers too.
fn exact<S: forma::Shape, D: TestDevice>(
    c: &mut Checks,
    fx: &Fixture,
    got: &Tensor<S, i64, D>,
    key: &str,
) {
    c.close(got, key, EXACT);
    let (want, _) = fx.i64(key);
    if got.to_vec() != want {
        c.fail(format!("{key}: got {:?}, want {want:?}", got.to_vec()));
    }
}

device_tests! {
    fn int64_reductions_match_pytorch<D>(dev) {
        let fx = Fixture::load("int_reduce");
        let mut c = Checks::new(&fx);
        macro_rules! case {
            ($name:literal, $S:ty, [$($ax:literal),*]) => {{
                let x: Tensor<$S, i64, D> = fx.tensor(concat!($name, ".in0"), dev);
                macro_rules! op {
                    ($m:ident, $keep:ident, $all:ident, $torch:literal) => {
                        $(
                            exact(&mut c, &fx, &x.$m::<$ax>(), &format!("{}.{}.ax{}", $name, $torch, $ax));
                            exact(&mut c, &fx, &x.$keep::<$ax>(), &format!("{}.{}.ax{}.keep", $name, $torch, $ax));
                        )*
                        exact(&mut c, &fx, &x.$all(), &format!("{}.{}.all", $name, $torch));
                    };
                }
                op!(sum, sum_keepdim, sum_all, "sum");
                op!(prod, prod_keepdim, prod_all, "prod");
                op!(max, max_keepdim, max_all, "amax");
                op!(min, min_keepdim, min_all, "amin");
            }};
        }
        case!("x", (C<3>, C<4>, C<5>), [0, 1, 2]);
        case!("big", (Dyn, C<3>), [0, 1]);
        case!("small", (C<2>, Dyn, C<4>), [0, 1, 2]);
        c.finish();
    }

    fn int64_extremes_of_nothing_are_errors<D>(dev) {
        let empty = Tensor::<(C<2>, Dyn), i64, D>::zeros_on((C, Dyn(0)), dev);
        let msg = empty.try_max::<1>().unwrap_err().to_string();
        assert!(msg.contains("axis 1 is empty"), "{msg}");
        assert!(empty.try_min_all().is_err());
        // A sum of nothing is 0 and a product 1, as in PyTorch.
        assert_eq!(empty.sum::<1>().to_vec(), [0, 0]);
        assert_eq!(empty.prod::<1>().to_vec(), [1, 1]);
        // Reducing the non-empty axis of an empty tensor gives an empty one.
        assert_eq!(empty.max::<0>().dims()[..], [0]);
    }
}
