//! First checks of the layers built with the model DSL (their full PyTorch
//! parity is the nn suite's job): each asserts values, not just that code runs.

use forma::nn::layers::{BatchNorm2d, Dropout, LayerNorm, Linear, MultiheadAttention};
use forma::prelude::*;

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol, "element {i}: {x} vs {y}");
    }
}

#[test]
fn linear_is_x_wt_plus_b() {
    let mut fc = Linear::<2, 3>::new(&Cpu, &mut Rng::seed_from(0));
    fc.weight = Tensor::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C)).unwrap();
    fc.bias = Some(Tensor::from_vec(vec![0.5, -0.5, 1.0], (C,)).unwrap());
    let x = Tensor::<(Dyn, C<2>)>::from_vec(vec![1., 1., 2., 0.], (Dyn(2), C)).unwrap();
    let y = fc.forward(x);
    close(&y.to_vec(), &[3.5, 6.5, 12.0, 2.5, 5.5, 11.0], 0.0);
    // The default init is U(-1/sqrt(in), 1/sqrt(in)).
    let big = Linear::<100, 50>::new(&Cpu, &mut Rng::seed_from(1));
    let w = big.weight.to_vec();
    assert!(w.iter().all(|v| v.abs() <= 0.1) && w.iter().any(|v| v.abs() > 0.09));
}

#[test]
fn batch_norm_uses_batch_stats_in_training_and_running_stats_in_eval() {
    let mut bn = BatchNorm2d::<2>::new(&Cpu);
    // Channel 0 holds 1..4, channel 1 holds 10, 10, 20, 20 (batch 1, 2x2).
    let x = Tensor::<(Dyn, C<2>, C<2>, C<2>)>::from_vec(
        vec![1., 2., 3., 4., 10., 10., 20., 20.],
        (Dyn(1), C, C, C),
    )
    .unwrap();
    let y = bn.forward(x.clone());
    let inv = 1.0 / (1.25f32 + 1e-5).sqrt();
    close(
        &y.to_vec()[..4],
        &[-1.5 * inv, -0.5 * inv, 0.5 * inv, 1.5 * inv],
        1e-5,
    );
    // Running stats move 10% toward the batch's (unbiased variance).
    close(
        &bn.running_mean.as_ref().unwrap().to_vec(),
        &[0.25, 1.5],
        1e-6,
    );
    close(
        &bn.running_var.as_ref().unwrap().to_vec(),
        &[0.9 + 0.1 * 5.0 / 3.0, 0.9 + 0.1 * 100.0 / 3.0],
        1e-5,
    );
    assert_eq!(bn.num_batches_tracked.as_ref().unwrap().item(), 1);
    bn.eval();
    let y = bn.forward(x);
    let rv0 = 0.9f32 + 0.1 * 5.0 / 3.0;
    close(
        &y.to_vec()[..1],
        &[(1.0 - 0.25) / (rv0 + 1e-5).sqrt()],
        1e-5,
    );
    assert_eq!(
        bn.num_batches_tracked.as_ref().unwrap().item(),
        1,
        "eval leaves the statistics alone"
    );
}

#[test]
fn layer_norm_normalises_the_last_axis() {
    let ln = LayerNorm::<4>::new(&Cpu);
    let x =
        Tensor::<(Dyn, C<4>)>::from_vec(vec![1., 2., 3., 4., 0., 0., 0., 8.], (Dyn(2), C)).unwrap();
    let y = ln.forward(x).to_vec();
    for row in y.chunks(4) {
        let mean: f32 = row.iter().sum::<f32>() / 4.0;
        let var: f32 = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 4.0;
        assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-4, "{row:?}");
    }
}

#[test]
fn attention_masks_hide_what_they_should() {
    let mut rng = Rng::seed_from(3);
    let mha = MultiheadAttention::<8, 2>::new(&Cpu, &mut rng);
    let x = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(1), Dyn(4), C), &mut rng);
    // Causal: the first position's output ignores every later token.
    let a = mha.attend(&x, &x, &x, None, true);
    let mut changed = x.to_vec();
    for v in &mut changed[8..] {
        *v += 1.0;
    }
    let x2 = Tensor::<(Dyn, Dyn, C<8>)>::from_vec(changed, (Dyn(1), Dyn(4), C)).unwrap();
    let b = mha.attend(&x2, &x2, &x2, None, true);
    close(&a.to_vec()[..8], &b.to_vec()[..8], 1e-6);
    assert!(a.to_vec()[8..] != b.to_vec()[8..]);
    // Key padding: a masked key's values do not matter.
    let mask =
        Tensor::<(Dyn, Dyn), bool>::from_vec(vec![false, false, false, true], (Dyn(1), Dyn(4)))
            .unwrap();
    let mut last = x.to_vec();
    for v in &mut last[24..] {
        *v = 100.0;
    }
    let kv = Tensor::<(Dyn, Dyn, C<8>)>::from_vec(last, (Dyn(1), Dyn(4), C)).unwrap();
    let c = mha.attend(&x, &x, &x, Some(&mask), false);
    let d = mha.attend(&x, &kv, &kv, Some(&mask), false);
    close(&c.to_vec(), &d.to_vec(), 1e-5);
}

#[test]
fn dropout_scales_in_training_and_is_identity_in_eval() {
    let mut drop = Dropout::new(0.25, &mut Rng::seed_from(0));
    let x = Tensor::<(Dyn,)>::ones_with((Dyn(10_000),));
    let y = drop.forward(x.clone()).to_vec();
    let kept = y.iter().filter(|v| **v != 0.0).count();
    assert!((7300..7700).contains(&kept), "kept {kept}");
    assert!(y
        .iter()
        .all(|v| *v == 0.0 || (*v - 1.0 / 0.75).abs() < 1e-6));
    drop.eval();
    assert_eq!(drop.forward(x.clone()).to_vec(), x.to_vec());
}

/// Eval-mode batch norm runs as one fused pass (outside a capture): the
/// bits of the composed ops `(x - mean) * (rsqrt(var + eps) * w) + b`, and
/// its gradients theirs too.
#[test]
fn batch_norm_eval_is_the_composed_ops_in_one_pass() {
    use forma::nn::functional::batch_norm;
    let mut rng = Rng::seed_from(5);
    let x = Tensor::<(Dyn, Dyn, Dyn, Dyn)>::randn((Dyn(3), Dyn(4), Dyn(5), Dyn(6)), &mut rng);
    let mean = Tensor::<(C<4>,)>::randn((C,), &mut rng);
    let var = Tensor::<(C<4>,)>::randn((C,), &mut rng).abs();
    let (w, b) = (
        Tensor::<(C<4>,)>::randn((C,), &mut rng).requires_grad(),
        Tensor::<(C<4>,)>::randn((C,), &mut rng).requires_grad(),
    );
    let x = x.requires_grad();
    let y = batch_norm(
        x.clone(),
        Some(&mean),
        Some(&var),
        Some(&w),
        Some(&b),
        false,
        0.1,
        1e-5,
    )
    .unwrap();
    let ch = |t: &Tensor<(C<4>,)>| t.into_dyn().unsqueeze::<1>().unsqueeze::<2>();
    let inv_std = ch(&var).add_scalar(1e-5).rsqrt();
    let want = &(&(&x - &ch(&mean)) * &(&inv_std * &ch(&w))) + &ch(&b);
    let bits = |v: Vec<f32>| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert!(bits(y.to_vec()) == bits(want.to_vec()), "outputs differ");
    let g = Tensor::<(Dyn, Dyn, Dyn, Dyn)>::randn((Dyn(3), Dyn(4), Dyn(5), Dyn(6)), &mut rng);
    let grads = |y: &Tensor<(Dyn, Dyn, Dyn, Dyn)>| {
        x.zero_grad();
        w.zero_grad();
        b.zero_grad();
        (y * &g).sum_all().backward();
        (
            bits(x.grad().unwrap().to_vec()),
            bits(w.grad().unwrap().to_vec()),
            bits(b.grad().unwrap().to_vec()),
        )
    };
    let (gy, gw) = (grads(&y), grads(&want));
    assert!(gy.0 == gw.0, "input gradients differ");
    crate::common::assert_close(&f32s(&gy.1), &f32s(&gw.1), 1e-6, 1e-6);
    crate::common::assert_close(&f32s(&gy.2), &f32s(&gw.2), 1e-6, 1e-6);
}

fn f32s(bits: &[u32]) -> Vec<f32> {
    bits.iter().map(|&b| f32::from_bits(b)).collect()
}
