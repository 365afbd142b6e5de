//! `scaled_dot_product_attention` against PyTorch's
//! `F.scaled_dot_product_attention` (`tools/fixtures/attention.safetensors`):
//! plain, causal with more keys than queries, an explicit scale, an additive
//! mask with `-inf` entries (alone and with the causal mask), heads that are
//! strided views of one packed projection, f64, and the gradients of every
//! operand (the tape runs the composed ops). Then the fused kernel against the
//! composed ops on shapes the fixture is too small for: queries split into
//! blocks, masks broadcast from `[T, S]` and `[B, 1, 1, S]`, more queries
//! than keys under the causal mask, and the output's layout.
//! Tolerances: f32 rtol/atol 1e-5 (sums of products), f64 1e-12.

use crate::common;

use common::*;
use forma::core::tape::no_grad;
use forma::core::Tensor;
use forma::{Dyn, Rng, C};

type Q<E, D> = Tensor<(C<2>, C<3>, C<4>, C<8>), E, D>;
type K<E, D> = Tensor<(C<2>, C<3>, C<5>, C<8>), E, D>;
type V<E, D> = Tensor<(C<2>, C<3>, C<5>, C<6>), E, D>;
type Mask<E, D> = Tensor<(C<4>, C<5>), E, D>;
type NoMask<D> = Option<&'static Tensor<(C<4>, C<5>), f32, D>>;

device_tests! {
    fn matches_pytorch<D>(dev) {
        let fx = Fixture::load("attention");
        let mut c = Checks::new(&fx);
        let q: Q<f32, D> = fx.tensor("q.in0", dev);
        let k: K<f32, D> = fx.tensor("k.in0", dev);
        let v: V<f32, D> = fx.tensor("v.in0", dev);
        let mask: Mask<f32, D> = fx.tensor("mask.in0", dev);
        let none: NoMask<D> = None;
        let sdpa = |m, causal, scale| q.scaled_dot_product_attention(&k, &v, m, causal, scale);
        c.close(&sdpa(none, false, None), "plain.out", F32_SUM_TOL);
        c.close(&sdpa(none, true, None), "causal.out", F32_SUM_TOL);
        c.close(&sdpa(none, false, Some(0.3)), "scale.out", F32_SUM_TOL);
        c.close(&sdpa(Some(&mask), false, None), "mask.out", F32_SUM_TOL);
        c.close(&sdpa(Some(&mask), true, None), "mask_causal.out", F32_SUM_TOL);
        c.finish();
    }

    /// The heads of one packed `[2, 4, 72]` projection, as `MultiheadAttention` makes them.
    fn strided_heads<D>(dev) {
        let fx = Fixture::load("attention");
        let mut c = Checks::new(&fx);
        let y: Tensor<(C<2>, C<4>, C<72>), f32, D> = fx.tensor("packed.in0", dev);
        let head = |i: usize| {
            y.narrow_static::<2, 24>(i * 24)
                .reshape::<(C<2>, C<4>, C<3>, C<8>)>()
                .transpose::<1, 2>()
        };
        let (q, k, v) = (head(0), head(1), head(2));
        assert!(!q.is_contiguous(), "the heads are strided views");
        let none: Option<&Tensor<(C<4>, C<4>), f32, D>> = None;
        let out = q.scaled_dot_product_attention(&k, &v, none, false, None);
        c.close(&out, "packed.out", F32_SUM_TOL);
        let out = q.scaled_dot_product_attention(&k, &v, none, true, None);
        c.close(&out, "packed_causal.out", F32_SUM_TOL);
        c.finish();
    }

    fn float64<D>(dev) {
        let fx = Fixture::load("attention");
        let mut c = Checks::new(&fx);
        let q: Tensor<(C<1>, C<2>, C<3>, C<4>), f64, D> = fx.tensor("q64.in0", dev);
        let k: Tensor<(C<1>, C<2>, C<6>, C<4>), f64, D> = fx.tensor("k64.in0", dev);
        let v: Tensor<(C<1>, C<2>, C<6>, C<5>), f64, D> = fx.tensor("v64.in0", dev);
        let none: Option<&Tensor<(C<3>, C<6>), f64, D>> = None;
        c.close(&q.scaled_dot_product_attention(&k, &v, none, false, None), "f64.out", F64_TOL);
        c.close(&q.scaled_dot_product_attention(&k, &v, none, true, None), "f64_causal.out", F64_TOL);
        c.finish();
    }

    /// The gradients of `(out * g).sum()` with respect to q, k, v and the mask.
    fn gradients<D>(dev) {
        let fx = Fixture::load("attention");
        let mut c = Checks::new(&fx);
        let q: Q<f32, D> = fx.tensor::<_, f32, D>("q.in0", dev).requires_grad();
        let k: K<f32, D> = fx.tensor::<_, f32, D>("k.in0", dev).requires_grad();
        let v: V<f32, D> = fx.tensor::<_, f32, D>("v.in0", dev).requires_grad();
        let mask: Mask<f32, D> = fx.tensor::<_, f32, D>("mask.in0", dev).requires_grad();
        let g: Tensor<(C<2>, C<3>, C<4>, C<6>), f32, D> = fx.tensor("grad.in0", dev);
        let out = q.scaled_dot_product_attention(&k, &v, Some(&mask), false, None);
        c.close(&out.detach(), "mask.out", F32_SUM_TOL);
        (&out * &g).sum_all().backward();
        c.close(&q.grad().expect("q's gradient"), "grad.q.out", F32_SUM_TOL);
        c.close(&k.grad().expect("k's gradient"), "grad.k.out", F32_SUM_TOL);
        c.close(&v.grad().expect("v's gradient"), "grad.v.out", F32_SUM_TOL);
        c.close(&mask.grad().expect("the mask's gradient"), "grad.mask.out", F32_SUM_TOL);
        c.finish();
    }

    /// Operands whose sizes disagree at run time are an error naming the op.
    fn size_errors<D>(dev) {
        let d4 = |a, b, c, d| (Dyn(a), Dyn(b), Dyn(c), Dyn(d));
        let q = Tensor::<(Dyn, Dyn, Dyn, Dyn), f32, D>::zeros_on(d4(1, 2, 3, 4), dev);
        let k = Tensor::<(Dyn, Dyn, Dyn, Dyn), f32, D>::zeros_on(d4(1, 2, 5, 3), dev);
        let v = Tensor::<(Dyn, Dyn, Dyn, Dyn), f32, D>::zeros_on(d4(1, 2, 5, 4), dev);
        let none: Option<&Tensor<(Dyn, Dyn), f32, D>> = None;
        let e = q.try_scaled_dot_product_attention(&k, &v, none, false, None).unwrap_err();
        assert!(e.to_string().contains("scaled_dot_product_attention"), "{e}");
        let k = Tensor::<(Dyn, Dyn, Dyn, Dyn), f32, D>::zeros_on(d4(1, 2, 5, 4), dev);
        let v = Tensor::<(Dyn, Dyn, Dyn, Dyn), f32, D>::zeros_on(d4(1, 2, 6, 4), dev);
        assert!(q.try_scaled_dot_product_attention(&k, &v, none, false, None).is_err());
        let v = Tensor::<(Dyn, Dyn, Dyn, Dyn), f32, D>::zeros_on(d4(1, 2, 5, 4), dev);
        let m = Tensor::<(Dyn, Dyn), f32, D>::zeros_on((Dyn(3), Dyn(4)), dev);
        let e = q.try_scaled_dot_product_attention(&k, &v, Some(&m), false, None).unwrap_err();
        assert!(e.to_string().contains("attn_mask"), "{e}");
    }
}

/// The fused kernel (no gradient recorded) against the composed ops (the
/// same call with the tape on) on `[b, h, t, d]` queries over `s` keys.
fn fused_vs_composed(
    b: usize,
    h: usize,
    t: usize,
    s: usize,
    d: usize,
    mask: Option<&[usize]>,
    causal: bool,
) {
    let mut rng = Rng::seed_from((b * 1000 + t * 10 + s) as u64);
    let d4 = |a, b, c, d| (Dyn(a), Dyn(b), Dyn(c), Dyn(d));
    type T4 = Tensor<(Dyn, Dyn, Dyn, Dyn), f32, forma::Cpu>;
    let q = T4::randn(d4(b, h, t, d), &mut rng);
    let k = T4::randn(d4(b, h, s, d), &mut rng);
    // Values with a transposed layout, so the kernel reads them strided.
    let v = T4::randn(d4(b, h, d + 1, s), &mut rng).transpose::<2, 3>();
    let m = mask.map(|dims| {
        let m = T4::randn(d4(dims[0], dims[1], dims[2], dims[3]), &mut rng);
        // Hide a few keys outright, as padding does.
        let hidden = m
            .to_vec()
            .into_iter()
            .map(|x| if x < -1.5 { f32::NEG_INFINITY } else { x });
        T4::from_vec(hidden.collect(), d4(dims[0], dims[1], dims[2], dims[3])).unwrap()
    });
    let fused = {
        let _g = no_grad();
        q.scaled_dot_product_attention(&k, &v, m.as_ref(), causal, None)
    };
    let q = q.requires_grad();
    let composed = q.scaled_dot_product_attention(&k, &v, m.as_ref(), causal, None);
    assert_eq!(fused.dims(), composed.dims());
    assert_close(&fused.to_vec(), &composed.to_vec(), 1e-5, 1e-5);
}

#[test]
fn fused_matches_composed() {
    fused_vs_composed(2, 3, 7, 9, 5, None, false);
    fused_vs_composed(2, 3, 7, 9, 5, None, true);
    // More queries than keys: late queries see every key, early ones fewer.
    fused_vs_composed(1, 2, 9, 4, 3, None, true);
    fused_vs_composed(2, 2, 6, 5, 4, Some(&[1, 1, 6, 5]), false);
    fused_vs_composed(2, 2, 6, 5, 4, Some(&[2, 1, 1, 5]), true);
    fused_vs_composed(2, 2, 6, 5, 4, Some(&[2, 2, 6, 5]), false);
    // 70000 keys: the scores of one head do not fit a task, so its queries
    // are split into blocks.
    fused_vs_composed(1, 2, 3, 70_000, 2, None, false);
    fused_vs_composed(1, 1, 5, 20_000, 2, Some(&[1, 1, 5, 20_000]), true);
    // Many heads: the parallel path.
    fused_vs_composed(4, 8, 32, 32, 16, None, false);
}

/// The fused output keeps the heads innermost (`[b, t, h, d]` in memory), so
/// merging the heads back is a view; the values are those of the composed ops.
#[test]
fn fused_output_merges_heads_as_a_view() {
    let mut rng = Rng::seed_from(3);
    let x = Tensor::<(C<2>, C<3>, C<4>, C<5>), f32, forma::Cpu>::randn((C, C, C, C), &mut rng);
    let none: Option<&Tensor<(C<4>, C<4>), f32, forma::Cpu>> = None;
    let y = {
        let _g = no_grad();
        x.scaled_dot_product_attention(&x, &x, none, false, None)
    };
    let merged = y.transpose::<1, 2>();
    assert!(merged.is_contiguous());
    let composed = x
        .mul_scalar(1.0 / 5f64.sqrt())
        .matmul(&x.transpose::<2, 3>())
        .softmax::<3>()
        .matmul(&x);
    assert_close(&y.to_vec(), &composed.to_vec(), 1e-5, 1e-6);
}
