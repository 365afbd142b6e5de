//! `Tensor::try_rnn_layer`, the recurrent loop as one op: the CPU's fused
//! cells against the composed ops (what CUDA runs), values and gradients,
//! in f32 (where the fused cells use the vectorised `exp` and `tanh`) and
//! f64. PyTorch's values for whole layers are in `nn_seq_parity`.

use forma::core::ops::rnn::{with_composed_cells, RnnMode};
use forma::prelude::*;

type T3<E> = Tensor<(Dyn, Dyn, Dyn), E>;
type T2<E> = Tensor<(Dyn, Dyn), E>;

/// Deterministic values in `[-scale, scale)`.
fn vals<E: Float>(n: usize, salt: u64, scale: f64) -> Vec<E> {
    let mut s = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            E::from_f64(((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale)
        })
        .collect()
}

/// The output and every operand's gradient (of a weighted sum of the
/// output), flattened in that order.
fn run<E: Float>(mode: RnnMode, reverse: bool, composed: bool) -> Vec<Vec<f64>> {
    let (b, t, h, g) = (3, 5, 16, mode.gates());
    let xp = T3::<E>::from_vec(vals(b * t * g * h, 1, 2.0), (Dyn(b), Dyn(t), Dyn(g * h)))
        .unwrap()
        .requires_grad();
    let w = T2::<E>::from_vec(vals(g * h * h, 2, 0.5), (Dyn(g * h), Dyn(h)))
        .unwrap()
        .requires_grad();
    let bias = Tensor::<(Dyn,), E>::from_vec(vals(g * h, 3, 0.5), (Dyn(g * h),))
        .unwrap()
        .requires_grad();
    let h0 = T2::<E>::from_vec(vals(b * h, 4, 1.0), (Dyn(b), Dyn(h)))
        .unwrap()
        .requires_grad();
    let c0 = T2::<E>::from_vec(vals(b * h, 5, 1.0), (Dyn(b), Dyn(h)))
        .unwrap()
        .requires_grad();
    let c0 = (mode == RnnMode::LongShortTermMemory).then_some(&c0);
    let body = || {
        let y = xp
            .try_rnn_layer(mode, &w, Some(&bias), &h0, c0, reverse)
            .unwrap();
        let wy = T3::<E>::from_vec(vals(y.numel(), 6, 1.0), y.shape()).unwrap();
        (&y * &wy).sum_all().backward();
        y
    };
    let y = if composed {
        with_composed_cells(body)
    } else {
        body()
    };
    let f = |v: Vec<E>| v.into_iter().map(|e| e.to_f64()).collect::<Vec<_>>();
    let mut out = vec![f(y.to_vec()), f(xp.grad().unwrap().to_vec())];
    out.push(f(w.grad().unwrap().to_vec()));
    out.push(f(bias.grad().unwrap().to_vec()));
    out.push(f(h0.grad().unwrap().to_vec()));
    out.extend(c0.map(|c| f(c.grad().unwrap().to_vec())));
    out
}

fn fused_matches_composed<E: Float>(tol: f64) {
    for mode in [RnnMode::LongShortTermMemory, RnnMode::GatedRecurrentUnit] {
        for reverse in [false, true] {
            let (fused, composed) = (
                run::<E>(mode, reverse, false),
                run::<E>(mode, reverse, true),
            );
            assert_eq!(fused.len(), composed.len());
            for (k, (a, b)) in fused.iter().zip(&composed).enumerate() {
                assert_eq!(a.len(), b.len());
                let scale = b.iter().fold(0f64, |m, v| m.max(v.abs()));
                assert!(scale > 0.0, "{mode:?} part {k} is all zeros");
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (x - y).abs() <= tol * scale,
                        "{mode:?} reverse={reverse} part {k}[{i}]: fused {x} vs composed {y}"
                    );
                }
            }
        }
    }
}

#[test]
fn fused_cells_match_composed_f32() {
    fused_matches_composed::<f32>(2e-6);
}

#[test]
fn fused_cells_match_composed_f64() {
    fused_matches_composed::<f64>(1e-13);
}

#[test]
fn shapes_are_checked() {
    let xp = T3::<f32>::zeros_with((Dyn(2), Dyn(3), Dyn(8)));
    let w = T2::<f32>::zeros_with((Dyn(8), Dyn(2)));
    let h0 = T2::<f32>::zeros_with((Dyn(2), Dyn(2)));
    let c0 = T2::<f32>::zeros_with((Dyn(2), Dyn(2)));
    // An LSTM's four gates of 2 fit; a GRU's three do not.
    let y = xp.try_rnn_layer(
        RnnMode::LongShortTermMemory,
        &w,
        None,
        &h0,
        Some(&c0),
        false,
    );
    assert_eq!(y.unwrap().dims().to_vec(), [2, 3, 4]);
    let err = xp
        .try_rnn_layer(RnnMode::GatedRecurrentUnit, &w, None, &h0, None, false)
        .unwrap_err();
    assert!(err.to_string().contains("rnn_layer"), "{err}");
    let err = xp
        .try_rnn_layer(RnnMode::LongShortTermMemory, &w, None, &h0, None, false)
        .unwrap_err();
    assert!(err.to_string().contains("c0"), "{err}");
    let bad_h0 = T2::<f32>::zeros_with((Dyn(3), Dyn(2)));
    assert!(xp
        .try_rnn_layer(
            RnnMode::LongShortTermMemory,
            &w,
            None,
            &bad_h0,
            Some(&c0),
            false
        )
        .is_err());
}
