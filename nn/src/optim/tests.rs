//! The optimizers' bookkeeping: option checks, tied parameters, invalid
//! steps refused before anything is written, option text round trips.
//! (Their numbers against PyTorch are in `tests/suite/nn_optim_parity.rs`.)

use super::*;
use forma_core::{Tensor, C};
use forma_cpu::Cpu;

fn param(values: &[f32]) -> Tensor<(C<2>,), f32, Cpu> {
    Tensor::from_vec(values.to_vec(), (C,))
        .expect("two values")
        .requires_grad()
}

#[test]
fn invalid_options_are_refused_as_pytorch_does() {
    let nesterov = SgdOptions::default().nesterov(true);
    assert!(matches!(
        Sgd::<f32>::try_new(nesterov.clone()),
        Err(OptimError::InvalidOption {
            option: "nesterov",
            ..
        })
    ));
    assert!(Sgd::<f32>::try_new(nesterov.clone().momentum(0.9)).is_ok());
    assert!(Sgd::<f32>::try_new(nesterov.momentum(0.9).dampening(0.1)).is_err());
    assert!(Sgd::<f32>::try_new(SgdOptions::default().lr(-1.0)).is_err());
    assert!(Adam::<f32>::try_new(AdamOptions::default().betas((0.9, 1.0))).is_err());
    assert!(AdamW::<f32>::try_new(AdamWOptions::default().eps(-1e-8)).is_err());
    assert!(RmsProp::<f32>::try_new(RmsPropOptions::default().alpha(-0.5)).is_err());
    assert!(Adagrad::<f32>::try_new(AdagradOptions::default().lr_decay(-0.1)).is_err());
    assert!(Sgd::<f32>::try_with_groups(vec![]).is_err());
    let msg = Sgd::<f32>::try_new(SgdOptions::default().lr(f64::NAN))
        .unwrap_err()
        .to_string();
    assert_eq!(msg, "SGD: invalid lr NaN: it must be >= 0");
}

#[test]
fn an_option_made_invalid_later_stops_the_step_before_any_write() {
    let w = param(&[1.0, 2.0]);
    (&w * &w).sum_all().backward();
    let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(0.1));
    opt.options_mut(0).lr = -0.1;
    assert!(opt.try_step(&w).is_err());
    assert_eq!(w.to_vec(), [1.0, 2.0]);
}

#[test]
fn pytorch_defaults() {
    assert_eq!(SgdOptions::default().lr, 1e-3);
    assert_eq!(AdamOptions::default().betas, (0.9, 0.999));
    assert_eq!(AdamOptions::default().weight_decay, 0.0);
    assert_eq!(AdamWOptions::default().weight_decay, 1e-2);
    assert_eq!(RmsPropOptions::default().alpha, 0.99);
    assert_eq!(AdagradOptions::default().eps, 1e-10);
}

#[test]
fn a_tied_parameter_is_updated_once() {
    // One tensor under two names: its gradient is the sum over both uses,
    // and one step moves it once (`model.parameters()` yields it once).
    let w = param(&[1.0, -2.0]);
    let model = (w.clone(), w.clone());
    (&model.0 * &model.1).sum_all().backward(); // d/dw (w * w) = 2w
    let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(0.25));
    opt.step(&model);
    assert_eq!(w.to_vec(), [0.5, -1.0]);
    assert!(opt.param_state("0").is_some() && opt.param_state("1").is_none());
    // Clipping scales the shared gradient once; the norm counts it once.
    let total = clip_grad_norm_::<f32, Cpu>(&model, 1.0, 2.0).expect("valid norm");
    assert!((total - 5f64.sqrt() * 2.0).abs() < 1e-6);
    let g = w.grad().expect("a gradient").to_vec();
    let norm = (g[0] * g[0] + g[1] * g[1]).sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{g:?}");
}

#[test]
fn a_parameter_without_a_gradient_is_skipped() {
    let a = param(&[1.0, 1.0]);
    let b = param(&[3.0, 3.0]);
    (&a * &a).sum_all().backward();
    let model = (a.clone(), b.clone());
    let mut opt: Adam = Adam::new(AdamOptions::default().lr(0.1));
    opt.step(&model);
    assert_eq!(b.to_vec(), [3.0, 3.0]);
    assert!(opt.param_state("1").is_none());
    assert_eq!(opt.param_state("0").map(|s| s.step), Some(1));
}

#[test]
fn set_grad_needs_a_tensor_that_requires_one() {
    let plain = Tensor::<(C<2>,), f32, Cpu>::from_vec(vec![1.0, 2.0], (C,)).expect("two values");
    assert!(plain.try_set_grad(&plain).is_err());
    let w = param(&[1.0, 2.0]);
    w.try_set_grad(&plain).expect("same sizes");
    assert_eq!(w.grad().map(|g| g.to_vec()), Some(vec![1.0, 2.0]));
    // The next backward accumulates onto it.
    w.sum_all().backward();
    assert_eq!(w.grad().map(|g| g.to_vec()), Some(vec![2.0, 3.0]));
}

#[test]
fn options_round_trip_through_text() {
    let o = RmsPropOptions::default()
        .lr(0.1 + 0.2)
        .centered(true)
        .momentum(1.0 / 3.0);
    let mut back = RmsPropOptions::default();
    for (name, text) in o.fields() {
        assert!(back.set_field(name, &text, name).expect("parses"));
    }
    assert_eq!(back, o);
    assert!(!back
        .set_field("betas", "1", "betas")
        .expect("unknown, not bad"));
    assert!(back.set_field("lr", "fast", "lr").is_err());
}
