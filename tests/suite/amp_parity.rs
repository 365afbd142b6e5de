//! Mixed precision against PyTorch's CPU autocast and GradScaler
//! (`tools/gen_amp_fixtures.py` writes `tools/fixtures/amp.safetensors`;
//! its docstring gives the key conventions).
//!
//! - Autocast (bf16 and f16): outputs and every gradient of a batched
//!   matmul, an MLP (linear, gelu, linear, MSE), a conv2d with bias and a
//!   causal attention, normwise within a few roundings of the low type
//!   (`tol` below) of PyTorch's; every output of a low-precision op, and
//!   every gradient, holds values of the low type, as PyTorch's do.
//! - GradScaler: 100 steps with NaN/inf injected into a gradient at fixed
//!   steps, unscale + clip + step + update: the same scale after every
//!   update (bit for bit), the same skipped steps, the same parameters.

use crate::common;

use common::Fixture;
use forma::core::autocast::{autocast, autocast_device, autocast_disabled, try_autocast};
use forma::core::tape::no_grad;
use forma::core::{DType, TensorData};
use forma::nn::layers::Linear;
use forma::nn::optim::{clip_grad_norm_, GradScaler, OptimError, Optimizer, Sgd, SgdOptions};
use forma::nn::StateDict;
use forma::prelude::*;
use half::{bf16, f16};

const LOWS: [(&str, DType); 2] = [("bf16", DType::BF16), ("f16", DType::F16)];

fn fixture() -> Fixture {
    let fx = Fixture::load("amp");
    assert_eq!(
        fx.metadata().get("generator").map(String::as_str),
        Some("tools/gen_amp_fixtures.py")
    );
    fx
}

/// The normwise tolerance for results computed in `low`: four roundings of
/// it (2^-8 relative for bf16, 2^-11 for f16). Forma runs the ops outside
/// autocast's lists (gelu, the bias add of a conv) in f32 where PyTorch
/// runs them in the low type, and sums in another order, so results may
/// differ by a rounding or two where they differ at all.
fn tol(low: DType) -> f64 {
    match low {
        DType::BF16 => 4.0 * 2f64.powi(-8),
        _ => 4.0 * 2f64.powi(-11),
    }
}

/// Whether `v` is a value of `low`.
fn is_low(v: f32, low: DType) -> bool {
    match low {
        DType::BF16 => bf16::from_f32(v).to_f32() == v,
        _ => f16::from_f32(v).to_f32() == v,
    }
}

/// `actual` is normwise within `tol(low)` of `expected` and every value is
/// one of `low`.
#[track_caller]
fn check(what: &str, actual: &[f32], expected: &[f32], low: DType) {
    let err = common::normwise_error(actual, expected);
    assert!(
        err <= tol(low),
        "{what}: normwise error {err:.3e} > {:.3e}",
        tol(low)
    );
    if let Some(v) = actual.iter().find(|&&v| !is_low(v, low)) {
        panic!("{what}: {v} is not a {low} value: the op did not run in {low}");
    }
}

fn f32_tensor<S: Shape>(fx: &Fixture, key: &str) -> Tensor<S> {
    fx.tensor(key, &Cpu)
}

#[test]
fn batched_matmul_computes_in_the_low_type_as_pytorch_does() {
    let fx = fixture();
    for (name, low) in LOWS {
        let a: Tensor<(C<3>, C<4>, C<40>)> = f32_tensor(&fx, "matmul.a").requires_grad();
        let b: Tensor<(C<3>, C<40>, C<6>)> = f32_tensor(&fx, "matmul.b").requires_grad();
        let r: Tensor<(C<3>, C<4>, C<6>)> = f32_tensor(&fx, "matmul.r");
        let out = {
            let _amp = autocast(low);
            a.matmul(&b)
        };
        (&out * &r).sum_all().backward();
        let want = |k: &str| fx.f32(&format!("matmul.{name}.{k}")).0;
        check(&format!("{name} out"), &out.to_vec(), &want("out"), low);
        check(
            &format!("{name} grad_a"),
            &a.grad().unwrap().to_vec(),
            &want("grad_a"),
            low,
        );
        check(
            &format!("{name} grad_b"),
            &b.grad().unwrap().to_vec(),
            &want("grad_b"),
            low,
        );
        // Only the order of the f32 sums differs: nearly every value is
        // PyTorch's to the bit.
        let same = out
            .to_vec()
            .iter()
            .zip(want("out"))
            .filter(|(a, e)| **a == *e)
            .count();
        assert!(
            same * 10 >= 9 * 72,
            "{name}: only {same} of 72 outputs equal PyTorch's"
        );
    }
}

/// `t` rounded to bf16, in f32, by casts outside autocast.
fn rounded<S: Shape>(t: &Tensor<S>) -> Tensor<S> {
    t.to_dtype::<bf16>().to_dtype::<f32>()
}

/// Checks `got` against `want` computed from explicitly rounded operands
/// in f32: every value bf16, each within one bf16 rounding (the sums run
/// in another order, and on CPUs with AMX in another kernel), most equal.
#[track_caller]
fn within_a_rounding(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut same = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            is_low(g, DType::BF16),
            "{what}[{i}]: {g} is not a bf16 value"
        );
        assert!(
            (g - w).abs() <= w.abs() * 2f32.powi(-7) + 1e-6,
            "{what}[{i}]: {g} vs {w}"
        );
        same += usize::from(g == w);
    }
    assert!(
        same * 10 >= got.len() * 8,
        "{what}: only {same} of {} equal",
        got.len()
    );
}

/// A weight shared by a batch: its gradient is a sum over the batch, which
/// autocast rounds once (not each image's part), on every product path.
#[test]
fn a_broadcast_weights_gradient_is_rounded_after_the_batch_sum() {
    let mut rng = Rng::seed_from(31);
    let x = Tensor::<(C<3>, C<5>, C<40>)>::randn((C, C, C), &mut rng).requires_grad();
    let w = Tensor::<(C<40>, C<6>)>::randn((C, C), &mut rng).requires_grad();
    let b = Tensor::<(C<6>,)>::randn((C,), &mut rng).requires_grad();
    let r = Tensor::<(C<3>, C<5>, C<6>)>::randn((C, C, C), &mut rng);
    let wt = Tensor::<(C<6>, C<40>)>::randn((C, C), &mut rng).requires_grad();
    let (y, z) = {
        let _amp = autocast(DType::BF16);
        (x.matmul(&w), x.linear(&wt, Some(&b)))
    };
    ((&y * &r).sum_all() + (&z * &r).sum_all()).backward();

    // The same from rounded operands in f32, rounding each result.
    let g = rounded(&r);
    let (xr, wr) = (rounded(&x.detach()), rounded(&w.detach()));
    within_a_rounding("matmul", &y.to_vec(), &rounded(&xr.matmul(&wr)).to_vec());
    let want_gw = rounded(&xr.transpose::<1, 2>().matmul(&g).sum::<0>());
    let want_gx_w = rounded(&g.matmul(&wr.t()));
    let (wtr, br) = (rounded(&wt.detach()), rounded(&b.detach()));
    within_a_rounding(
        "linear",
        &z.to_vec(),
        &rounded(&(&xr.matmul(&wtr.t()) + &br)).to_vec(),
    );
    within_a_rounding(
        "matmul grad w",
        &w.grad().unwrap().to_vec(),
        &want_gw.to_vec(),
    );
    let want_gwt = rounded(&g.transpose::<1, 2>().matmul(&xr).sum::<0>());
    within_a_rounding(
        "linear grad w",
        &wt.grad().unwrap().to_vec(),
        &want_gwt.to_vec(),
    );
    let want_gb = rounded(&g.sum::<0>().sum::<0>());
    within_a_rounding(
        "linear grad b",
        &b.grad().unwrap().to_vec(),
        &want_gb.to_vec(),
    );
    // x's gradient: the rounded gradients of both ops, summed in f32.
    let want_gx = &want_gx_w + &rounded(&g.matmul(&wtr));
    let got_gx = x.grad().unwrap().to_vec();
    for (i, (&got, &want)) in got_gx.iter().zip(&want_gx.to_vec()).enumerate() {
        assert!(
            (got - want).abs() <= want.abs() * 2f32.powi(-6) + 1e-6,
            "grad x[{i}]: {got} vs {want}"
        );
    }
}

#[derive(Module)]
struct Mlp {
    fc1: Linear<16, 32>,
    fc2: Linear<32, 4>,
}

impl Mlp {
    fn from_fixture(fx: &Fixture) -> Self {
        let mut rng = Rng::seed_from(0);
        let mut m = Mlp {
            fc1: Linear::new(&Cpu, &mut rng),
            fc2: Linear::new(&Cpu, &mut rng),
        };
        let mut sd = StateDict::new();
        for name in PARAMS {
            let a = fx.array::<f32>(&format!("mlp.{name}"));
            sd.insert(name, TensorData::from_vec(&a.data, a.shape).unwrap());
        }
        m.load_state_dict(&sd).unwrap();
        m
    }

    fn forward(&self, x: &Tensor<(Dyn, C<16>)>) -> Tensor<(Dyn, C<4>)> {
        self.fc2.forward(self.fc1.forward(x.clone()).gelu())
    }

    fn param(&self, name: &str) -> Tensor<(Dyn,)> {
        let t = match name {
            "fc1.weight" => self.fc1.weight.flatten_all(),
            "fc1.bias" => self.fc1.bias.as_ref().unwrap().flatten_all(),
            "fc2.weight" => self.fc2.weight.flatten_all(),
            _ => self.fc2.bias.as_ref().unwrap().flatten_all(),
        };
        t.into_dyn()
    }
}

const PARAMS: [&str; 4] = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"];

fn grad_of(m: &Mlp, name: &str) -> Vec<f32> {
    match name {
        "fc1.weight" => m.fc1.weight.grad().unwrap().to_vec(),
        "fc1.bias" => m.fc1.bias.as_ref().unwrap().grad().unwrap().to_vec(),
        "fc2.weight" => m.fc2.weight.grad().unwrap().to_vec(),
        _ => m.fc2.bias.as_ref().unwrap().grad().unwrap().to_vec(),
    }
}

#[test]
fn an_mlp_under_autocast_matches_pytorch_with_f32_master_gradients() {
    let fx = fixture();
    let x: Tensor<(Dyn, C<16>)> = f32_tensor(&fx, "mlp.x");
    let t: Tensor<(Dyn, C<4>)> = f32_tensor(&fx, "mlp.t");
    for (name, low) in LOWS {
        let m = Mlp::from_fixture(&fx);
        let (out, loss) = {
            let _amp = autocast(low);
            let out = m.forward(&x);
            let loss = (&out - &t).square().mean_all();
            (out, loss)
        };
        loss.backward();
        check(
            &format!("{name} out"),
            &out.to_vec(),
            &fx.f32(&format!("mlp.{name}.out")).0,
            low,
        );
        let want_loss = f64::from(fx.f32(&format!("mlp.{name}.loss")).0[0]);
        let got_loss = f64::from(loss.item());
        assert!(
            (got_loss - want_loss).abs() <= tol(low) * want_loss.abs(),
            "{name}: loss {got_loss} vs PyTorch's {want_loss}"
        );
        for p in PARAMS {
            let want = fx.f32(&format!("mlp.{name}.grad.{p}")).0;
            check(&format!("{name} grad {p}"), &grad_of(&m, p), &want, low);
        }
        // Parameters stay f32 (master weights), untouched by the rounding.
        assert_eq!(m.param("fc1.weight").to_vec(), fx.f32("mlp.fc1.weight").0);
    }
}

#[test]
fn a_conv2d_with_bias_under_autocast_matches_pytorch() {
    let fx = fixture();
    for (name, low) in LOWS {
        let x: Tensor<(C<2>, C<3>, C<9>, C<9>)> = f32_tensor(&fx, "conv.x").requires_grad();
        let w: Tensor<(C<8>, C<3>, C<3>, C<3>)> = f32_tensor(&fx, "conv.weight").requires_grad();
        let b: Tensor<(C<8>,)> = f32_tensor(&fx, "conv.bias").requires_grad();
        let r: Tensor<(C<2>, C<8>, Dyn, Dyn)> = f32_tensor(&fx, "conv.r");
        let p = Conv2dParams {
            padding: [1, 1],
            ..Conv2dParams::default()
        };
        let out = {
            let _amp = autocast(low);
            let y = x.conv2d(&w, p);
            forma::core::ops::conv::add_channel_bias(&y, &b)
        };
        (&out * &r).sum_all().backward();
        let want = |k: &str| fx.f32(&format!("conv.{name}.{k}")).0;
        // The bias add runs in f32 after the rounded convolution (PyTorch
        // adds it inside the bf16 op): close, but not a bf16 value.
        let got = out.to_vec();
        let scale = want("out").iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(want("out"))
            .fold(0f32, |m, (a, e)| m.max((a - e).abs()));
        assert!(
            f64::from(worst / scale) <= tol(low),
            "{name} out: {worst} of {scale}"
        );
        check(
            &format!("{name} grad_x"),
            &x.grad().unwrap().to_vec(),
            &want("grad_x"),
            low,
        );
        check(
            &format!("{name} grad_weight"),
            &w.grad().unwrap().to_vec(),
            &want("grad_weight"),
            low,
        );
        let (gb, wb) = (b.grad().unwrap().to_vec(), want("grad_bias"));
        let err = gb
            .iter()
            .zip(&wb)
            .fold(0f32, |m, (a, e)| m.max((a - e).abs()));
        let scale = wb.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            f64::from(err / scale) <= tol(low),
            "{name} grad_bias: {gb:?} vs {wb:?}"
        );
    }
}

#[test]
fn causal_attention_under_autocast_matches_pytorch() {
    let fx = fixture();
    type Qkv = (C<2>, C<2>, C<5>, C<8>);
    for (name, low) in LOWS {
        let q: Tensor<Qkv> = f32_tensor(&fx, "attn.q").requires_grad();
        let k: Tensor<Qkv> = f32_tensor(&fx, "attn.k").requires_grad();
        let v: Tensor<Qkv> = f32_tensor(&fx, "attn.v").requires_grad();
        let r: Tensor<Qkv> = f32_tensor(&fx, "attn.r");
        let out = {
            let _amp = autocast(low);
            let none: Option<&Tensor<(C<5>, C<5>)>> = None;
            q.scaled_dot_product_attention(&k, &v, none, true, None)
        };
        (&out * &r).sum_all().backward();
        let want = |key: &str| fx.f32(&format!("attn.{name}.{key}")).0;
        check(&format!("{name} out"), &out.to_vec(), &want("out"), low);
        check(
            &format!("{name} grad_q"),
            &q.grad().unwrap().to_vec(),
            &want("grad_q"),
            low,
        );
        check(
            &format!("{name} grad_k"),
            &k.grad().unwrap().to_vec(),
            &want("grad_k"),
            low,
        );
        check(
            &format!("{name} grad_v"),
            &v.grad().unwrap().to_vec(),
            &want("grad_v"),
            low,
        );
    }
}

/// `t` rounded to `low`, in f32, by casts outside autocast.
fn rounded_to<S: Shape>(t: &Tensor<S>, low: DType) -> Tensor<S> {
    match low {
        DType::BF16 => t.to_dtype::<bf16>().to_dtype::<f32>(),
        _ => t.to_dtype::<f16>().to_dtype::<f32>(),
    }
}

/// With nothing on the tape, attention under autocast runs the fused
/// kernel, which rounds each head's operands as it reads them and the
/// result as it writes it: PyTorch's values within the tolerance, and to
/// the bit those of rounding around the f32 attention by hand (on AMX
/// tiles in bf16, where the weights are rounded too, within a rounding
/// of doing that by hand, most values to the bit). The
/// operands are strided views of one packed projection (as a multi-head
/// attention layer's are), with an additive mask, and a key length that
/// splits the queries of a head into blocks.
#[test]
fn fused_attention_under_autocast_rounds_as_it_reads_and_writes() {
    let fx = fixture();
    for (name, low) in LOWS {
        type Qkv = (C<2>, C<2>, C<5>, C<8>);
        let q: Tensor<Qkv> = f32_tensor(&fx, "attn.q");
        let k: Tensor<Qkv> = f32_tensor(&fx, "attn.k");
        let v: Tensor<Qkv> = f32_tensor(&fx, "attn.v");
        let out = {
            let _off = no_grad();
            let _amp = autocast(low);
            q.scaled_dot_product_attention(&k, &v, None::<&Tensor<(C<5>, C<5>)>>, true, None)
        };
        let want = fx.f32(&format!("attn.{name}.out")).0;
        check(&format!("{name} fused out"), &out.to_vec(), &want, low);
    }
    let mut rng = Rng::seed_from(7);
    // [batch, seq, 3, heads, head size], as a packed in-projection gives.
    let packed = Tensor::<(C<2>, Dyn, C<3>, C<3>, C<8>)>::randn((C, Dyn(1100), C, C, C), &mut rng);
    let heads = |i: usize| {
        packed
            .narrow_static::<2, 1>(i)
            .squeeze::<2>()
            .transpose::<1, 2>()
    };
    let (q, k, v) = (heads(0), heads(1), heads(2));
    let mask = Tensor::<(C<2>, One, One, Dyn)>::randn((C, One, One, Dyn(1100)), &mut rng);
    use forma::core::ops::matmul::MatmulKernel;
    let tiles = <Cpu as MatmulKernel<f32>>::has_matmul_low(&Cpu, DType::BF16);
    for (name, low) in LOWS {
        let fused = {
            let _off = no_grad();
            let _amp = autocast(low);
            q.scaled_dot_product_attention(&k, &v, Some(&mask), false, Some(0.3))
        };
        let (qr, kr, vr) = (
            rounded_to(&q, low),
            rounded_to(&k, low),
            rounded_to(&v, low),
        );
        if tiles && low == DType::BF16 {
            // On AMX tiles the weights are rounded too before they multiply
            // the values, as in PyTorch's CPU flash attention; the tiles sum
            // in another order than the f32 product, so a value may differ
            // by a rounding from the one by hand.
            let by_hand = {
                let _off = no_grad();
                let (q, k, v) = (&qr, &kr, &vr);
                let scores =
                    &q.matmul(&k.transpose::<2, 3>()).mul_scalar(0.3) + &rounded_to(&mask, low);
                let p = rounded_to(&scores.softmax::<-1>(), low);
                rounded_to(&p.matmul(v), low)
            };
            let (f, h) = (fused.to_vec(), by_hand.to_vec());
            assert_eq!(f.len(), h.len());
            // A weight rounded the other way moves a sum of ~1000 weighted
            // values by a rounding of one term: near zero that is more than
            // a rounding of the sum itself, hence the absolute part.
            let rms = (h.iter().map(|x| x * x).sum::<f32>() / h.len() as f32).sqrt();
            let mut differ = 0;
            for (i, (&a, &b)) in f.iter().zip(&h).enumerate() {
                assert!(is_low(a, low), "{name}: {a} at {i} is not a bf16 value");
                assert!(
                    (a - b).abs() <= b.abs() / 64.0 + rms / 256.0,
                    "{name}: {a} against {b} by hand at {i} (rms {rms})"
                );
                differ += usize::from(a != b);
            }
            assert!(
                differ * 20 <= f.len(),
                "{name}: {differ} of {} values differ",
                f.len()
            );
            continue;
        }
        let by_hand = {
            let _off = no_grad();
            let m = rounded_to(&mask, low);
            rounded_to(
                &qr.scaled_dot_product_attention(&kr, &vr, Some(&m), false, Some(0.3)),
                low,
            )
        };
        assert_eq!(fused.dims(), by_hand.dims());
        let (f, h) = (fused.to_vec(), by_hand.to_vec());
        let differ = f
            .iter()
            .zip(&h)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differ, 0, "{name}: {differ} of {} values differ", f.len());
    }
}

#[test]
fn guards_nest_and_a_disabled_region_computes_in_f32() {
    let fx = fixture();
    let m = Mlp::from_fixture(&fx);
    let x: Tensor<(Dyn, C<16>)> = f32_tensor(&fx, "nested.x");
    let (inner, outer) = {
        let _amp = autocast(DType::BF16);
        let inner = {
            let _off = autocast_disabled();
            m.fc1.forward(x.clone())
        };
        (inner, m.fc1.forward(x.clone()))
    };
    let after = m.fc1.forward(x.clone());
    let want_inner = fx.f32("nested.inner").0;
    common::assert_close(&inner.to_vec(), &want_inner, 1e-6, 1e-6);
    check(
        "outer",
        &outer.to_vec(),
        &fx.f32("nested.outer").0,
        DType::BF16,
    );
    // The guard restored f32 on drop.
    assert_eq!(after.to_vec(), inner.to_vec());
}

#[test]
fn autocast_is_per_device_kind_and_leaves_f64_alone() {
    let a = Tensor::<(C<1>, C<2>)>::from_vec(vec![1.0 + 1.0 / 512.0, 1.0], (C, C)).unwrap();
    let w = Tensor::<(C<2>, C<1>)>::ones();
    let exact = 2.0 + 1.0 / 512.0;
    {
        let _cuda_only = autocast_device("cuda", Some(DType::BF16)).unwrap();
        assert_eq!(a.matmul(&w).to_vec(), [exact]);
        assert_eq!(forma::core::autocast::autocast_dtype(&Cpu), None);
    }
    {
        let _all = autocast(DType::BF16);
        assert_eq!(
            forma::core::autocast::autocast_dtype(&Cpu),
            Some(DType::BF16)
        );
        assert_eq!(a.matmul(&w).to_vec(), [2.0]);
        let _cpu_off = autocast_device("cpu", None).unwrap();
        assert_eq!(a.matmul(&w).to_vec(), [exact]);
    }
    {
        let _cpu = autocast_device("cpu", Some(DType::F16)).unwrap();
        // 1 + 2^-9 is an f16 value (11 significant bits).
        assert_eq!(a.matmul(&w).to_vec(), [exact]);
        let a64 = a.to_dtype::<f64>();
        let w64 = w.to_dtype::<f64>();
        assert_eq!(a64.matmul(&w64).to_vec(), [2.0 + 1.0 / 512.0]);
    }
    let err = try_autocast(DType::F32).unwrap_err().to_string();
    assert!(err.contains("bfloat16 or float16"), "{err}");
}

#[test]
fn backward_computes_as_the_forward_did_whatever_guard_is_active() {
    let x = Tensor::<(C<1>, C<2>)>::from_vec(vec![1.0, 2.0], (C, C)).unwrap();
    let w = Tensor::<(C<2>, C<1>)>::from_vec(vec![1.0 + 1.0 / 256.0, 3.0], (C, C))
        .unwrap()
        .requires_grad();
    let g = Tensor::<(C<1>, C<1>)>::from_vec(vec![1.0 + 1.0 / 512.0], (C, C)).unwrap();
    // Recorded in f32, backward run under autocast: the exact gradient.
    let y = x.matmul(&w);
    {
        let _amp = autocast(DType::BF16);
        y.try_backward_with(&g).unwrap();
    }
    assert_eq!(
        w.grad().unwrap().to_vec(),
        [1.0 + 1.0 / 512.0, 2.0 + 2.0 / 512.0]
    );
    w.zero_grad();
    // Recorded under autocast, backward run outside: the gradient arrives
    // rounded to bf16 (1 + 2^-9 becomes 1).
    let y = {
        let _amp = autocast(DType::BF16);
        x.matmul(&w)
    };
    y.try_backward_with(&g).unwrap();
    assert_eq!(w.grad().unwrap().to_vec(), [1.0, 2.0]);
}

/// PyTorch's GradScaler run (see the generator): 100 steps of SGD with
/// unscale, clipping, step and update, NaN/inf injected into one gradient.
#[test]
fn grad_scaler_follows_pytorchs_scale_sequence_and_skips_the_same_steps() {
    let fx = fixture();
    let m = Mlp::from_fixture(&fx);
    let x: Tensor<(Dyn, C<16>)> = f32_tensor(&fx, "scaler.x");
    let t: Tensor<(Dyn, C<4>)> = f32_tensor(&fx, "scaler.t");
    let inf_steps = fx.i64("scaler.inf_steps").0;
    let want_scale = fx.f64("scaler.scale").0;
    let want_skipped = fx.f32("scaler.skipped").0;
    let want_loss = fx.f32("scaler.loss").0;
    let mut opt = Sgd::new(SgdOptions::default().lr(0.01));
    let mut scaler = GradScaler::new()
        .growth_interval(3)
        .and_then(|s| s.init_scale(65536.0))
        .unwrap();
    for step in 0..100 {
        opt.zero_grad(&m);
        let loss = (&m.forward(&x) - &t).square().mean_all();
        scaler.scale(&loss).backward();
        if inf_steps.contains(&(step as i64)) {
            let g = m.fc1.weight.grad().unwrap();
            let mut v = g.to_vec();
            v[0] = if step % 2 == 1 {
                f32::INFINITY
            } else {
                f32::NAN
            };
            m.fc1
                .weight
                .try_set_grad(&Tensor::from_vec(v, (C, C)).unwrap())
                .unwrap();
        }
        scaler.unscale_(&opt, &m).unwrap();
        clip_grad_norm_(&m, 1.0).unwrap();
        let stepped = scaler.step(&mut opt, &m).unwrap();
        scaler.update().unwrap();
        assert_eq!(
            scaler.get_scale(),
            want_scale[step],
            "scale after step {step}"
        );
        assert_eq!(!stepped, want_skipped[step] == 1.0, "skip at step {step}");
        let (l, wl) = (f64::from(loss.item()), f64::from(want_loss[step]));
        assert!(
            (l - wl).abs() <= 1e-5 * wl.abs(),
            "step {step}: loss {l} vs {wl}"
        );
    }
    for p in PARAMS {
        let want = fx.f32(&format!("scaler.final.{p}")).0;
        common::assert_close(&m.param(p).to_vec(), &want, 1e-5, 1e-6);
    }
    let tracker = fx.f64("scaler.growth_tracker").0[0];
    assert_eq!(scaler.growth_tracker() as f64, tracker);
    // The state round-trips into a fresh scaler.
    let mut back = GradScaler::new();
    back.load_state_dict(&scaler.state_dict()).unwrap();
    assert_eq!(back.state_dict(), scaler.state_dict());
    assert_eq!(
        scaler.state_dict()["scale"],
        format!("{:?}", want_scale[99])
    );
}

#[test]
fn grad_scaler_refuses_calls_out_of_order_as_pytorch_does() {
    let fx = fixture();
    let m = Mlp::from_fixture(&fx);
    let x: Tensor<(Dyn, C<16>)> = f32_tensor(&fx, "scaler.x");
    let mut opt = Sgd::new(SgdOptions::default().lr(0.01));
    let mut scaler = GradScaler::new();
    let order = |e: OptimError| match e {
        OptimError::OutOfOrder { reason, .. } => reason,
        other => panic!("not an order error: {other}"),
    };
    assert!(order(scaler.update().unwrap_err()).contains("no inf checks"));
    scaler.scale(&m.forward(&x).sum_all()).backward();
    let before = m.fc2.weight.grad().unwrap().to_vec();
    scaler.unscale_(&opt, &m).unwrap();
    let after = m.fc2.weight.grad().unwrap().to_vec();
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(*a, b / 65536.0);
    }
    assert!(order(scaler.unscale_(&opt, &m).unwrap_err()).contains("already been called"));
    assert!(scaler.step(&mut opt, &m).unwrap());
    assert!(order(scaler.step(&mut opt, &m).unwrap_err()).contains("step() has already"));
    assert!(order(scaler.unscale_(&opt, &m).unwrap_err()).contains("after step()"));
    scaler.update().unwrap();
    assert_eq!(scaler.growth_tracker(), 1);
    // Disabled: the loss passes through, the step always runs.
    let mut off = GradScaler::new().enabled(false);
    let loss = m.forward(&x).sum_all();
    assert_eq!(off.scale(&loss).item(), loss.item());
    assert_eq!(off.get_scale(), 1.0);
    assert!(off.step(&mut opt, &m).unwrap());
    assert!(off.state_dict().is_empty());
    // Scales must be finite and positive, at construction and when set.
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(
            GradScaler::new().init_scale(bad).is_err(),
            "init_scale({bad})"
        );
        assert!(
            GradScaler::new().set_scale(bad).is_err(),
            "set_scale({bad})"
        );
    }
    let mut s = GradScaler::new();
    s.set_scale(8.0).unwrap();
    assert_eq!(s.get_scale(), 8.0);
}

/// In inference under autocast a linear layer's weight is packed once and
/// reused while it is unwritten: the outputs are the bits of a taped call
/// (which packs the weight itself every time), and a weight written in
/// place (`assign`, as an optimizer step or a load does) is packed again.
#[test]
fn inference_reuses_a_packed_weight_until_it_is_written() {
    use forma::core::ops::matmul::MatmulKernel;
    use forma::core::ops::packed_weights::holds_packed;
    let mut rng = Rng::seed_from(41);
    let x = Tensor::<(Dyn, C<40>)>::randn((Dyn(37), C), &mut rng);
    let w = Tensor::<(C<24>, C<40>)>::randn((C, C), &mut rng);
    let w2 = Tensor::<(C<24>, C<40>)>::randn((C, C), &mut rng);
    let b = Tensor::<(C<24>,)>::randn((C,), &mut rng);
    let bits = |t: Tensor<(Dyn, C<24>)>| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    // A taped call: the weight needs a gradient, so nothing is cached.
    let taped = |w: &Tensor<(C<24>, C<40>)>| {
        let _amp = autocast(DType::BF16);
        let w = w.detach().requires_grad();
        bits(x.linear(&w, Some(&b)))
    };
    let inference = || {
        let _g = no_grad();
        let _amp = autocast(DType::BF16);
        bits(x.linear(&w, Some(&b)))
    };
    let want = taped(&w);
    assert_eq!(inference(), want, "first inference call");
    let packs = <Cpu as MatmulKernel<f32>>::has_matmul_low(&Cpu, DType::BF16);
    assert_eq!(
        holds_packed(&w),
        packs,
        "packed once where the CPU has bf16 products"
    );
    assert_eq!(inference(), want, "second call, on the packed weight");
    {
        let _g = no_grad();
        w.assign(&w2);
    }
    assert!(!holds_packed(&w), "a written weight's packed copy is stale");
    let want2 = taped(&w2);
    assert_ne!(want2, want);
    assert_eq!(inference(), want2, "after the weight was written");
    assert_eq!(holds_packed(&w), packs);
}
