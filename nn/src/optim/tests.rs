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
    let total = clip_grad_norm_(&model, 1.0).expect("valid norm");
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

#[test]
fn constructors_infer_f32_on_the_cpu_and_take_other_types_when_named() {
    // No annotation: the f32 CPU optimizer, which updates f32 parameters.
    let w = param(&[1.0, -2.0]);
    (&w * &w).sum_all().backward();
    let mut opt = Adam::new(AdamOptions::default().lr(0.1));
    opt.step(&w);
    assert_eq!(opt.param_state("").map(|s| s.step), Some(1));
    let v = w.to_vec();
    assert!(
        (v[0] - 0.9).abs() < 1e-6 && (v[1] + 1.9).abs() < 1e-6,
        "{v:?}"
    );
    // Named: f64, through `NewOptimizer` (the same constructors).
    let w64 = Tensor::<(C<2>,), f64, Cpu>::from_vec(vec![1.0, -2.0], (C,))
        .expect("two values")
        .requires_grad();
    (&w64 * &w64).sum_all().backward();
    let mut opt64 = Sgd::<f64>::try_new(SgdOptions::default().lr(0.25)).expect("valid");
    opt64.step(&w64);
    assert_eq!(w64.to_vec(), [0.5, -1.0]);
    // An f32 optimizer leaves f64 parameters alone.
    opt.step(&w64);
    assert_eq!(w64.to_vec(), [0.5, -1.0]);
    let grouped = Sgd::with_groups(vec![ParamGroup::new(
        Select::All,
        SgdOptions::default().lr(0.5),
    )]);
    assert_eq!(grouped.groups().len(), 1);
}

#[test]
fn clipping_spans_parameters_of_several_float_types() {
    // grad = w: an f32 [3, 0] and an f64 [0, 4] make a total 2-norm of 5.
    let a = param(&[3.0, 0.0]);
    let b = Tensor::<(C<2>,), f64, Cpu>::from_vec(vec![0.0, 4.0], (C,))
        .expect("two values")
        .requires_grad();
    (&a * &a).sum_all().mul_scalar(0.5).backward();
    (&b * &b).sum_all().mul_scalar(0.5).backward();
    let model = (a.clone(), b.clone());
    let total = clip_grad_norm_(&model, 1.0).expect("valid norm");
    assert!((total - 5.0).abs() < 1e-12, "{total}");
    let ga = a.grad().expect("a gradient").to_vec();
    let gb = b.grad().expect("a gradient").to_vec();
    assert!(
        (ga[0] - 0.6).abs() < 1e-6 && (gb[1] - 0.8).abs() < 1e-6,
        "{ga:?} {gb:?}"
    );
    // The max-norm over both: the largest entry after that clip, 0.8.
    let max = clip_grad_norm_with(&model, 10.0, f64::INFINITY).expect("valid norm");
    assert!((max - 0.8).abs() < 1e-6, "{max}");
    clip_grad_value_(&model, 0.7).expect("CPU parameters");
    assert_eq!(b.grad().expect("a gradient").to_vec()[1], 0.7);
    assert!(clip_grad_norm_with(&model, 1.0, -1.0).is_err());
    // A NaN gradient makes the total NaN and spreads, as in PyTorch.
    let nan = Tensor::<(C<2>,), f32, Cpu>::from_vec(vec![f32::NAN, 1.0], (C,)).expect("two");
    a.try_set_grad(&nan).expect("same sizes");
    assert!(clip_grad_norm_(&model, 1.0).expect("valid norm").is_nan());
    assert!(b.grad().expect("a gradient").to_vec()[1].is_nan());
}
