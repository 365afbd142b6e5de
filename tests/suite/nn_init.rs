//! `nn::init` against PyTorch's `torch.nn.init`:
//!
//! - fans and gains equal PyTorch's (`tools/fixtures/init.safetensors`,
//!   written by `tools/gen_loss_fixtures.py` from `_calculate_fan_in_and_fan_out`
//!   and `calculate_gain`), exactly;
//! - each scheme's bounds hold and its moments match its distribution on
//!   large tensors (100k+ elements: the standard error of a std estimate is
//!   about 0.2%, so the 2% tolerances are ~9 standard errors wide, and the
//!   seeds are fixed);
//! - orthogonal matrices are orthonormal (`W W^T = I` within 1e-5 in f32,
//!   1e-12 in f64), for wide, tall and conv-shaped weights;
//! - the same seed gives the same values and another seed others.

use crate::common;

use common::Fixture;
use forma::nn::init::{
    self, calculate_fan_in_and_fan_out, calculate_gain, FanMode, Init, InitError, Nonlinearity,
};
use forma::prelude::*;

fn moments(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[track_caller]
fn assert_rel(actual: f64, expected: f64, rel: f64, what: &str) {
    assert!(
        (actual - expected).abs() <= rel * expected.abs(),
        "{what}: {actual} vs {expected} (rel tol {rel})"
    );
}

type Big = Tensor<(C<400>, C<300>)>; // 120k elements, fan_in 300, fan_out 400

#[test]
fn fans_and_gains_equal_pytorch() {
    let fx = Fixture::load("init");
    let meta = fx.metadata();
    assert_eq!(
        meta.get("generator").map(String::as_str),
        Some("tools/gen_loss_fixtures.py")
    );
    let shapes: [(&str, &[usize]); 6] = [
        ("linear", &[7, 3]),
        ("conv1d", &[8, 4, 5]),
        ("conv2d", &[16, 3, 5, 5]),
        ("conv3d", &[4, 2, 3, 3, 3]),
        ("zero_receptive", &[5, 6, 0]),
        ("wide", &[2, 9]),
    ];
    for (name, dims) in shapes {
        let want = fx.i64(&format!("fan.{name}")).0;
        let (fi, fo) = calculate_fan_in_and_fan_out(dims).unwrap();
        assert_eq!([fi as i64, fo as i64], want[..], "fans of {name} {dims:?}");
    }
    // Derived by hand: [out, in, kh, kw] -> (in * kh * kw, out * kh * kw).
    assert_eq!(
        calculate_fan_in_and_fan_out(&[16, 3, 5, 5]).unwrap(),
        (75, 400)
    );
    assert!(matches!(
        calculate_fan_in_and_fan_out(&[5]),
        Err(InitError::NeedsRank2 { .. })
    ));

    use Nonlinearity::*;
    let gains = [
        ("linear", calculate_gain(Linear, None)),
        ("conv2d", calculate_gain(Conv2d, None)),
        ("sigmoid", calculate_gain(Sigmoid, None)),
        ("tanh", calculate_gain(Tanh, None)),
        ("relu", calculate_gain(Relu, None)),
        ("leaky_relu", calculate_gain(LeakyRelu, None)),
        ("leaky_relu_0_2", calculate_gain(LeakyRelu, Some(0.2))),
        (
            "leaky_relu_sqrt5",
            calculate_gain(LeakyRelu, Some(5f64.sqrt())),
        ),
        ("selu", calculate_gain(Selu, None)),
    ];
    for (name, g) in gains {
        let want = fx.f64(&format!("gain.{name}")).0[0];
        assert!(
            (g - want).abs() <= 1e-15 * want,
            "gain {name}: {g} vs PyTorch's {want}"
        );
    }
    assert_eq!(calculate_gain(Tanh, None), 5.0 / 3.0);
    assert_eq!(
        calculate_gain(LeakyRelu, Some(5f64.sqrt())),
        (1.0f64 / 3.0).sqrt()
    );
}

#[test]
fn uniform_normal_constant() {
    let mut rng = Rng::seed_from(11);
    let t = Big::zeros();
    init::uniform_(&t, -0.5, 1.5, &mut rng).unwrap();
    let v = t.to_vec();
    assert!(v.iter().all(|&x| (-0.5..1.5).contains(&x)));
    let (m, s) = moments(&v);
    assert!((m - 0.5).abs() < 0.01, "mean {m}");
    assert_rel(s, 2.0 / 12f64.sqrt(), 0.02, "uniform std");

    init::normal_(&t, 3.0, 0.25, &mut rng).unwrap();
    let (m, s) = moments(&t.to_vec());
    assert!((m - 3.0).abs() < 0.005, "mean {m}");
    assert_rel(s, 0.25, 0.02, "normal std");

    init::constant_(&t, 0.75).unwrap();
    assert!(t.to_vec().iter().all(|&x| x == 0.75));
    init::zeros_(&t).unwrap();
    assert!(t.to_vec().iter().all(|&x| x == 0.0));
    init::ones_(&t).unwrap();
    assert!(t.to_vec().iter().all(|&x| x == 1.0));

    assert!(init::uniform_(&t, 1.0, 0.0, &mut rng).is_err());
    assert!(init::normal_(&t, 0.0, -1.0, &mut rng).is_err());
}

#[test]
fn xavier_bounds_and_std() {
    let mut rng = Rng::seed_from(12);
    let t = Big::zeros();
    let gain = calculate_gain(Nonlinearity::Tanh, None);
    init::xavier_uniform_(&t, gain, &mut rng).unwrap();
    let bound = gain * (6.0 / 700.0f64).sqrt();
    let v = t.to_vec();
    let max = v.iter().fold(0f64, |a, &x| a.max(x.abs() as f64));
    assert!(
        max <= bound * (1.0 + 1e-6) && max > 0.999 * bound,
        "max {max} vs bound {bound}"
    );
    assert_rel(
        moments(&v).1,
        bound / 3f64.sqrt(),
        0.02,
        "xavier_uniform std",
    );

    init::xavier_normal_(&t, 2.0, &mut rng).unwrap();
    let (m, s) = moments(&t.to_vec());
    assert!(m.abs() < 0.002, "mean {m}");
    assert_rel(s, 2.0 * (2.0 / 700.0f64).sqrt(), 0.02, "xavier_normal std");

    let v1 = Tensor::<(C<5>,)>::zeros();
    assert!(matches!(
        init::xavier_uniform_(&v1, 1.0, &mut rng),
        Err(InitError::NeedsRank2 {
            op: "xavier_uniform_",
            ..
        })
    ));
}

#[test]
fn kaiming_modes_and_nonlinearities() {
    let mut rng = Rng::seed_from(13);
    let t = Big::zeros();
    // PyTorch's Linear/Conv default: a = sqrt(5), fan_in -> bound 1 / sqrt(fan_in).
    init::kaiming_uniform_(
        &t,
        5f64.sqrt(),
        FanMode::FanIn,
        Nonlinearity::LeakyRelu,
        &mut rng,
    )
    .unwrap();
    let bound = 1.0 / 300f64.sqrt();
    let v = t.to_vec();
    let max = v.iter().fold(0f64, |a, &x| a.max(x.abs() as f64));
    assert!(
        max <= bound * (1.0 + 1e-6) && max > 0.999 * bound,
        "max {max} vs bound {bound}"
    );
    assert_rel(
        moments(&v).1,
        bound / 3f64.sqrt(),
        0.02,
        "kaiming_uniform std",
    );

    // ReLU, fan_out: std = sqrt(2 / fan_out).
    init::kaiming_normal_(&t, 0.0, FanMode::FanOut, Nonlinearity::Relu, &mut rng).unwrap();
    assert_rel(
        moments(&t.to_vec()).1,
        (2.0 / 400.0f64).sqrt(),
        0.02,
        "kaiming_normal fan_out std",
    );
    // Leaky ReLU slope 0.2, fan_in (a conv weight [out, in, k, k]).
    let conv = Tensor::<(C<64>, C<32>, C<7>, C<7>)>::zeros();
    init::kaiming_normal_(
        &conv,
        0.2,
        FanMode::FanIn,
        Nonlinearity::LeakyRelu,
        &mut rng,
    )
    .unwrap();
    let want = (2.0 / 1.04f64).sqrt() / (32.0 * 49.0f64).sqrt();
    assert_rel(
        moments(&conv.to_vec()).1,
        want,
        0.02,
        "kaiming_normal conv std",
    );

    // An empty tensor is left alone, as in PyTorch.
    let empty = Tensor::<(C<0>, C<3>)>::zeros();
    init::kaiming_uniform_(&empty, 0.0, FanMode::FanIn, Nonlinearity::Relu, &mut rng).unwrap();
}

#[test]
fn trunc_normal_stays_in_bounds_with_the_truncated_moments() {
    let mut rng = Rng::seed_from(14);
    let t = Big::zeros();
    init::trunc_normal_(&t, 0.0, 1.0, -2.0, 2.0, &mut rng).unwrap();
    let v = t.to_vec();
    assert!(v.iter().all(|&x| (-2.0..=2.0).contains(&x)));
    assert!(v.iter().any(|&x| x > 1.95) && v.iter().any(|&x| x < -1.95));
    // Var of N(0, 1) cut at +-2: 1 - 2 * 2 phi(2) / (Phi(2) - Phi(-2)).
    let phi2 = (-2.0f64).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let mass = forma::core::dtype::libm_erf(2.0 / 2f64.sqrt());
    let want = (1.0 - 4.0 * phi2 / mass).sqrt();
    let (m, s) = moments(&v);
    assert!(m.abs() < 0.01, "mean {m}");
    assert_rel(s, want, 0.02, "trunc_normal std");

    // A one-sided window far in the tail: every value inside [a, b].
    init::trunc_normal_(&t, 0.0, 0.02, 0.05, 0.06, &mut rng).unwrap();
    assert!(t.to_vec().iter().all(|&x| (0.05..=0.06).contains(&x)));
    assert!(init::trunc_normal_(&t, 0.0, 1.0, 2.0, -2.0, &mut rng).is_err());
}

/// `a @ b^T` of row-major matrices in f64.
fn gram(w: &[f64], rows: usize, cols: usize, by_rows: bool) -> Vec<f64> {
    let (n, k) = if by_rows { (rows, cols) } else { (cols, rows) };
    let at = |i: usize, j: usize| {
        if by_rows {
            w[i * cols + j]
        } else {
            w[j * cols + i]
        }
    };
    let mut g = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            g[i * n + j] = (0..k).map(|l| at(i, l) * at(j, l)).sum();
        }
    }
    g
}

#[track_caller]
fn assert_identity(g: &[f64], n: usize, scale: f64, tol: f64) {
    for i in 0..n {
        for j in 0..n {
            let want = if i == j { scale } else { 0.0 };
            assert!(
                (g[i * n + j] - want).abs() <= tol,
                "gram[{i}][{j}] = {} (want {want})",
                g[i * n + j]
            );
        }
    }
}

#[test]
fn orthogonal_is_orthonormal() {
    let mut rng = Rng::seed_from(15);
    // Wide: orthonormal rows, W W^T = I.
    let w = Tensor::<(C<6>, C<10>)>::zeros();
    init::orthogonal_(&w, 1.0, &mut rng).unwrap();
    let wv: Vec<f64> = w.to_vec().iter().map(|&x| x as f64).collect();
    assert_identity(&gram(&wv, 6, 10, true), 6, 1.0, 1e-5);
    // Also through the tensor ops, as a user would check it.
    let wwt = w.matmul(&w.t()).to_vec();
    let eye = Tensor::<(C<6>, C<6>)>::eye((C, C)).to_vec();
    assert!(wwt.iter().zip(&eye).all(|(a, b)| (a - b).abs() < 1e-5));

    // Tall, f64, with a gain: W^T W = gain^2 I.
    let w = Tensor::<(C<12>, C<5>), f64>::zeros();
    init::orthogonal_(&w, 2.0, &mut rng).unwrap();
    assert_identity(&gram(&w.to_vec(), 12, 5, false), 5, 4.0, 1e-12);

    // Square: both.
    let w = Tensor::<(C<9>, C<9>), f64>::zeros();
    init::orthogonal_(&w, 1.0, &mut rng).unwrap();
    assert_identity(&gram(&w.to_vec(), 9, 9, true), 9, 1.0, 1e-12);
    assert_identity(&gram(&w.to_vec(), 9, 9, false), 9, 1.0, 1e-12);

    // A conv weight [4, 2, 3] is flattened to [4, 6].
    let w = Tensor::<(C<4>, C<2>, C<3>), f64>::zeros();
    init::orthogonal_(&w, 1.0, &mut rng).unwrap();
    assert_identity(&gram(&w.to_vec(), 4, 6, true), 4, 1.0, 1e-12);

    assert!(init::orthogonal_(&Tensor::<(C<4>,)>::zeros(), 1.0, &mut rng).is_err());
}

#[test]
fn seeds_decide_the_values() {
    for scheme in [
        Init::Uniform { a: -1.0, b: 1.0 },
        Init::Normal {
            mean: 0.0,
            std: 1.0,
        },
        Init::TruncNormal {
            mean: 0.0,
            std: 1.0,
            a: -2.0,
            b: 2.0,
        },
        Init::XavierUniform { gain: 1.0 },
        Init::XavierNormal { gain: 1.0 },
        Init::KaimingUniform {
            a: 0.0,
            mode: FanMode::FanIn,
            nonlinearity: Nonlinearity::Relu,
        },
        Init::KaimingNormal {
            a: 0.0,
            mode: FanMode::FanOut,
            nonlinearity: Nonlinearity::Relu,
        },
        Init::Orthogonal { gain: 1.0 },
    ] {
        let make = |seed| -> Vec<f32> {
            let t: Tensor<(C<8>, C<16>)> = scheme
                .tensor((C, C), &Cpu, &mut Rng::seed_from(seed))
                .unwrap();
            t.to_vec()
        };
        assert_eq!(make(7), make(7), "{scheme:?}: same seed, same values");
        assert_ne!(make(7), make(8), "{scheme:?}: another seed, other values");
        // One generator drives consecutive fills: a second fill continues its stream.
        let mut rng = Rng::seed_from(7);
        let t = Tensor::<(C<8>, C<16>)>::zeros();
        scheme.init_(&t, &mut rng).unwrap();
        let first = t.to_vec();
        scheme.init_(&t, &mut rng).unwrap();
        assert_ne!(first, t.to_vec(), "{scheme:?}: the stream moves on");
    }
}

#[test]
fn fills_in_place_through_clones_and_views_off_the_tape() {
    let mut rng = Rng::seed_from(16);
    let w = Tensor::<(C<3>, C<4>)>::zeros().requires_grad();
    let alias = w.clone();
    init::xavier_uniform_(&w, 1.0, &mut rng).unwrap();
    assert_eq!(alias.to_vec(), w.to_vec());
    assert!(w.to_vec().iter().any(|&x| x != 0.0));
    assert!(
        w.is_leaf() && w.grad().is_none(),
        "initialisation is not recorded"
    );
    // A transposed view fills the parent's elements in the view's order.
    let t = w.t();
    init::constant_(&t.narrow::<0>(1, 1), 5.0).unwrap();
    let v = w.to_vec();
    for r in 0..3 {
        assert_eq!(v[r * 4 + 1], 5.0, "column 1 of the parent");
    }
}
