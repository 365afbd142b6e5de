//! `linear` (`x @ w.t() + b`): without the tape, where the backend adds the
//! bias inside the product, the same bits as the product and then the
//! add, on every route the CPU product takes (dot products for thin
//! products, the narrow and the transposed tiles, several depth blocks,
//! two threads), on strided and transposed views, batched and vector
//! inputs, f64 and an empty depth; with the tape, the gradients of the
//! composed form; the shape errors. PyTorch's values, with and without the
//! tape, are checked in `nn_layer_parity::linear`.

use crate::common;

use common::*;
use forma::core::device::Device;
use forma::core::tape::no_grad;
use forma::core::{Float, Tensor};
use forma::{Dyn, Rng, C};

/// `x.linear(w, b)` without the tape, and the product plus the bias as two
/// ops, as bits.
fn fused_and_apart<E: Float, D: Device<E>>(
    x: &Tensor<(Dyn, Dyn), E, D>,
    w: &Tensor<(Dyn, Dyn), E, D>,
    b: &Tensor<(Dyn,), E, D>,
) -> (Vec<E>, Vec<E>) {
    let _g = no_grad();
    let fused = x.linear(w, Some(b)).to_vec();
    let apart = (&x.matmul(&w.t()) + b).to_vec();
    (fused, apart)
}

fn same_bits<E: Float>(a: &[E], b: &[E], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        // Widening to f64 is exact and keeps every value apart.
        let (x, y) = (x.to_f64().unwrap(), y.to_f64().unwrap());
        assert!(x.to_bits() == y.to_bits(), "{what} at {i}: {x} vs {y}");
    }
}

device_tests! {
    fn bias_inside_the_product_gives_the_same_bits<D>(dev) {
        let mut rng = Rng::seed_from(11);
        // (rows, in, out): small; thin (dot products); a narrow output;
        // 16 rows (computed transposed); several depth blocks; two threads.
        for (m, k, n) in [(3, 5, 4), (4, 384, 1152), (300, 64, 10), (16, 384, 1152),
                          (70, 1000, 33), (512, 384, 384)] {
            let x = Tensor::<(Dyn, Dyn), f32, D>::normal_on((Dyn(m), Dyn(k)), 0.0, 1.0, &mut rng, dev);
            let w = Tensor::<(Dyn, Dyn), f32, D>::normal_on((Dyn(n), Dyn(k)), 0.0, 1.0, &mut rng, dev);
            let b = Tensor::<(Dyn,), f32, D>::normal_on((Dyn(n),), 0.0, 1.0, &mut rng, dev);
            let (f, a) = fused_and_apart(&x, &w, &b);
            same_bits(&f, &a, &format!("{m}x{k} -> {n}"));
            // And the bias did reach every element: without it, the product alone.
            let _g = no_grad();
            let plain = x.linear(&w, None).to_vec();
            same_bits(&plain, &x.matmul(&w.t()).to_vec(), "no bias");
            assert!(plain.iter().zip(&f).all(|(p, f)| p != f), "{m}x{k} -> {n}: a bias left out");
        }
    }

    fn views_batches_vectors_and_f64<D>(dev) {
        let mut rng = Rng::seed_from(12);
        // A transposed input, a transposed weight, a bias at stride 2.
        let xt = Tensor::<(Dyn, Dyn), f32, D>::normal_on((Dyn(40), Dyn(9)), 0.0, 1.0, &mut rng, dev);
        let wt = Tensor::<(Dyn, Dyn), f32, D>::normal_on((Dyn(40), Dyn(7)), 0.0, 1.0, &mut rng, dev);
        let b2 = Tensor::<(Dyn,), f32, D>::normal_on((Dyn(14),), 0.0, 1.0, &mut rng, dev);
        let b = b2.slice::<0>(0, 14, 2);
        let (f, a) = fused_and_apart(&xt.t(), &wt.t(), &b);
        same_bits(&f, &a, "views");
        // Dense copies take other routes through the product (another
        // order of the sums): equal to rounding.
        let (d, _) = fused_and_apart(&xt.t().contiguous(), &wt.t().contiguous(), &b.contiguous());
        assert_close(&f, &d, 1e-5, 1e-5);

        // A batch of sequences keeps its shape and type; a vector too.
        let x = Tensor::<(Dyn, Dyn, C<6>), f32, D>::normal_on((Dyn(2), Dyn(3), C), 0.0, 1.0, &mut rng, dev);
        let w = Tensor::<(C<4>, C<6>), f32, D>::normal_on((C, C), 0.0, 1.0, &mut rng, dev);
        let b = Tensor::<(C<4>,), f32, D>::normal_on((C,), 0.0, 1.0, &mut rng, dev);
        let _g = no_grad();
        let y: Tensor<(Dyn, Dyn, C<4>), f32, D> = x.linear(&w, Some(&b));
        assert_eq!(y.dims()[..], [2, 3, 4]);
        same_bits(&y.to_vec(), &(&x.matmul(&w.t()) + &b).to_vec(), "batched");
        let v = Tensor::<(C<6>,), f32, D>::normal_on((C,), 0.0, 1.0, &mut rng, dev);
        let yv: Tensor<(C<4>,), f32, D> = v.linear(&w, Some(&b));
        same_bits(&yv.to_vec(), &(&v.matmul(&w.t()) + &b).to_vec(), "vector");

        let x = Tensor::<(Dyn, Dyn), f64, D>::normal_on((Dyn(33), Dyn(70)), 0.0, 1.0, &mut rng, dev);
        let w = Tensor::<(Dyn, Dyn), f64, D>::normal_on((Dyn(20), Dyn(70)), 0.0, 1.0, &mut rng, dev);
        let b = Tensor::<(Dyn,), f64, D>::normal_on((Dyn(20),), 0.0, 1.0, &mut rng, dev);
        let (f, a) = fused_and_apart(&x, &w, &b);
        same_bits(&f, &a, "f64");
    }

    fn empty_depth_gives_the_bias<D>(dev) {
        let x = Tensor::<(Dyn, Dyn), f32, D>::zeros_on((Dyn(3), Dyn(0)), dev);
        let w = Tensor::<(Dyn, Dyn), f32, D>::zeros_on((Dyn(2), Dyn(0)), dev);
        let b = Tensor::<(Dyn,), f32, D>::from_vec_on(vec![1.5, -2.0], (Dyn(2),), dev).unwrap();
        let (f, a) = fused_and_apart(&x, &w, &b);
        assert_eq!(f, vec![1.5, -2.0, 1.5, -2.0, 1.5, -2.0]);
        same_bits(&f, &a, "k = 0");
    }

    fn gradients_on_the_tape<D>(dev) {
        // loss = sum(x @ w.t() + b): d/db = rows, d/dx[i] = the column sums
        // of w, d/dw[j] = the column sums of x.
        let mut rng = Rng::seed_from(13);
        let x = Tensor::<(Dyn, Dyn), f64, D>::normal_on((Dyn(5), Dyn(3)), 0.0, 1.0, &mut rng, dev).requires_grad();
        let w = Tensor::<(Dyn, Dyn), f64, D>::normal_on((Dyn(2), Dyn(3)), 0.0, 1.0, &mut rng, dev).requires_grad();
        let b = Tensor::<(Dyn,), f64, D>::normal_on((Dyn(2),), 0.0, 1.0, &mut rng, dev).requires_grad();
        x.linear(&w, Some(&b)).sum_all().backward();
        assert_close(&b.grad().unwrap().to_vec(), &[5.0, 5.0], 1e-12, 1e-12);
        let (xv, wv) = (x.to_vec(), w.to_vec());
        let col = |v: &[f64], rows: usize, p: usize| (0..rows).map(|i| v[i * 3 + p]).sum::<f64>();
        let wsum: Vec<f64> = (0..3).map(|p| col(&wv, 2, p)).collect();
        let xsum: Vec<f64> = (0..3).map(|p| col(&xv, 5, p)).collect();
        assert_close(&x.grad().unwrap().to_vec(), &wsum.repeat(5), 1e-12, 1e-12);
        assert_close(&w.grad().unwrap().to_vec(), &xsum.repeat(2), 1e-12, 1e-12);
    }

    fn bad_sizes_are_errors<D>(dev) {
        let x = Tensor::<(Dyn, Dyn), f32, D>::zeros_on((Dyn(2), Dyn(4)), dev);
        let w = Tensor::<(Dyn, Dyn), f32, D>::zeros_on((Dyn(3), Dyn(4)), dev);
        let b = Tensor::<(Dyn,), f32, D>::zeros_on((Dyn(5),), dev);
        let e = x.try_linear(&w, Some(&b)).unwrap_err().to_string();
        assert!(e.contains("a bias of [3]") && e.contains("[5]"), "{e}");
        let w = Tensor::<(Dyn, Dyn), f32, D>::zeros_on((Dyn(5), Dyn(3)), dev);
        let e = x.try_linear(&w, Some(&b)).unwrap_err().to_string();
        assert!(e.contains("matmul"), "{e}");
    }
}
