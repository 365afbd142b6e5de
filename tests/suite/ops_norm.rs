//! `layer_norm` over the last axis: the fused kernel (which runs with and
//! without the tape) against the same formula written as composed ops here
//! (PyTorch's values and gradients are checked in
//! `nn_layer_parity::normalisation`, the fused backward by gradcheck in
//! `grad_ops::gradcheck_fused_forward`), with
//! and without the weight and the bias, on a transposed view, in f64, on
//! rows long enough to run in parallel; and the errors for a weight of the
//! wrong size and a scalar input.
//! Tolerances: f32 rtol/atol 1e-5 (row sums), f64 1e-12.

use crate::common;

use common::*;
use forma::core::device::Device;
use forma::core::tape::no_grad;
use forma::core::{Dtype, Float, Tensor};
use forma::{Dyn, Rng, C};

/// The fused result (no tape; and on the tape, which must agree) and the
/// formula as composed ops: `(x - mean) / sqrt(var + eps) * w + b`.
fn both<E: Float, D: Device<E>>(
    x: &Tensor<(Dyn, Dyn), E, D>,
    w: Option<&Tensor<(Dyn,), E, D>>,
    b: Option<&Tensor<(Dyn,), E, D>>,
) -> (Vec<E>, Vec<E>) {
    let fused = {
        let _g = no_grad();
        x.layer_norm(w, b, 1e-5).to_vec()
    };
    let taped = x.clone().requires_grad().layer_norm(w, b, 1e-5).to_vec();
    assert_eq!(
        taped
            .iter()
            .map(|v| Dtype::to_f64(*v).to_bits())
            .collect::<Vec<_>>(),
        fused
            .iter()
            .map(|v| Dtype::to_f64(*v).to_bits())
            .collect::<Vec<_>>(),
        "the taped forward is the fused kernel"
    );
    let _g = no_grad();
    let rstd = x.var_keepdim::<1>(false).add_scalar(1e-5).rsqrt();
    let mut y = &(x - &x.mean_keepdim::<1>()) * &rstd;
    if let Some(w) = w {
        y = &y * w;
    }
    if let Some(b) = b {
        y = &y + b;
    }
    (fused, y.to_vec())
}

device_tests! {
    fn fused_matches_composed<D>(dev) {
        let mut rng = Rng::seed_from(7);
        for (rows, n) in [(3, 6), (5, 384), (256, 384), (2, 40_000)] {
            let x = Tensor::<(Dyn, Dyn), f32, D>::normal_on((Dyn(rows), Dyn(n)), 0.0, 1.0, &mut rng, dev)
                .add_scalar(3.0);
            let w = Tensor::<(Dyn,), f32, D>::normal_on((Dyn(n),), 0.0, 1.0, &mut rng, dev);
            let b = Tensor::<(Dyn,), f32, D>::normal_on((Dyn(n),), 0.0, 1.0, &mut rng, dev);
            for (wi, bi) in [(Some(&w), Some(&b)), (Some(&w), None), (None, Some(&b)), (None, None)] {
                let (f, c) = both(&x, wi, bi);
                assert_close(&f, &c, 1e-5, 1e-5);
            }
            // Each row of the plain normalisation has mean 0 and variance 1.
            let (f, _) = both(&x, None, None);
            for row in f.chunks(n) {
                let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
                assert!(mean.abs() < 1e-4 && (var - 1.0).abs() < 1e-3, "{rows}x{n}: {mean} {var}");
            }
        }
    }

    fn transposed_view_and_f64<D>(dev) {
        let mut rng = Rng::seed_from(8);
        let x = Tensor::<(Dyn, Dyn), f64, D>::normal_on((Dyn(7), Dyn(5)), 0.0, 1.0, &mut rng, dev);
        let xt: Tensor<(Dyn, Dyn), f64, D> = x.t();
        let w = Tensor::<(Dyn,), f64, D>::normal_on((Dyn(7),), 0.0, 1.0, &mut rng, dev);
        let b = Tensor::<(Dyn,), f64, D>::normal_on((Dyn(7),), 0.0, 1.0, &mut rng, dev);
        let (f, c) = both(&xt, Some(&w), Some(&b));
        assert_close(&f, &c, 1e-12, 1e-12);
        // The same as normalising a dense copy.
        let (d, _) = both(&xt.contiguous(), Some(&w), Some(&b));
        assert_close(&f, &d, 1e-12, 1e-12);
    }

    fn typed_shapes_keep_their_type<D>(dev) {
        let mut rng = Rng::seed_from(9);
        let x = Tensor::<(C<2>, C<3>, C<4>), f32, D>::normal_on((C, C, C), 0.0, 1.0, &mut rng, dev);
        let y: Tensor<(C<2>, C<3>, C<4>), f32, D> = x.layer_norm(None, None, 1e-5);
        let flat = x.reshape::<(C<6>, C<4>)>().into_dyn();
        let (f, _) = both(&flat, None, None);
        assert_close(&y.to_vec(), &f, 1e-6, 1e-6);
    }

    fn bad_sizes_are_errors<D>(dev) {
        let x = Tensor::<(Dyn, Dyn), f32, D>::zeros_on((Dyn(2), Dyn(4)), dev);
        let w = Tensor::<(Dyn,), f32, D>::zeros_on((Dyn(3),), dev);
        let e = x.try_layer_norm(Some(&w), None, 1e-5).unwrap_err().to_string();
        assert!(e.contains("a weight of [4]") && e.contains("[3]"), "{e}");
        let e = x.try_layer_norm(None, Some(&w), 1e-5).unwrap_err().to_string();
        assert!(e.contains("a bias of [4]"), "{e}");
        let s = Tensor::<(), f32, D>::zeros_on((), dev);
        let e = s.try_layer_norm(None, None, 1e-5).unwrap_err().to_string();
        assert!(e.contains("rank 1 or more"), "{e}");
    }
}
