//! Optimizers, gradient clipping and schedulers against PyTorch
//! (`tools/gen_optim_fixtures.py` writes `tools/fixtures/optim.safetensors`;
//! its docstring gives the key conventions).
//!
//! - Optimizers: a 10-step trajectory of `Linear(4,3) -> tanh -> Linear(3,2)`
//!   from PyTorch's initial weights, gradients from Forma's own backward, in
//!   f32: every parameter after each step within 1e-6 relative (plus 1e-7
//!   absolute, for values near zero) of PyTorch's.
//! - Clipping: the total norm and the clipped gradients, same tolerance.
//! - Schedulers: both groups' learning rates (and momenta for 1cycle) after
//!   construction and each of 30 steps, within 1e-12 in f64.

use crate::common;

use common::{normwise_error, Fixture};
use forma::core::TensorData;
use forma::nn::layers::Linear;
use forma::nn::optim::{
    clip_grad_norm_, clip_grad_norm_on, clip_grad_norm_with, clip_grad_value_, Adagrad,
    AdagradOptions, Adam, AdamOptions, AdamW, AdamWOptions, LrGroups, Optimizer, ParamGroup,
    RmsProp, RmsPropOptions, Select, Sgd, SgdOptions,
};
use forma::nn::sched::{
    Anneal, ChainedScheduler, CosineAnnealingLR, ExponentialLR, LinearLR, LrScheduler, MultiStepLR,
    OneCycleLR, OneCycleOptions, SequentialLR, StepLR,
};
use forma::nn::StateDict;
use forma::prelude::*;

const PARAMS: [&str; 4] = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"];
/// Parameters after each step: 1e-6 relative, normwise (the largest
/// elementwise difference over the largest parameter magnitude).
const RTOL: f64 = 1e-6;
/// Elementwise comparisons (gradients): 1e-6 relative plus 1e-7 absolute.
const ATOL: f64 = 1e-7;

#[derive(Module)]
struct Small {
    fc1: Linear<4, 3>,
    fc2: Linear<3, 2>,
}

struct Setup {
    fx: Fixture,
    x: Tensor<(Dyn, C<4>)>,
    t: Tensor<(Dyn, C<2>)>,
}

impl Setup {
    fn new() -> Self {
        let fx = Fixture::load("optim");
        let meta = fx.metadata();
        assert_eq!(
            meta.get("generator").map(String::as_str),
            Some("tools/gen_optim_fixtures.py")
        );
        assert!(meta.get("torch").is_some_and(|v| v.starts_with('2')));
        let x = fx.tensor("data.x", &Cpu);
        let t = fx.tensor("data.t", &Cpu);
        Setup { fx, x, t }
    }

    /// The model with PyTorch's initial parameters.
    fn model(&self) -> Small {
        let mut rng = Rng::seed_from(0);
        let mut m = Small {
            fc1: Linear::new(&Cpu, &mut rng),
            fc2: Linear::new(&Cpu, &mut rng),
        };
        let mut sd = StateDict::new();
        for name in PARAMS {
            let a = self.fx.array::<f32>(&format!("model.{name}"));
            sd.insert(name, TensorData::from_vec(&a.data, a.shape).unwrap());
        }
        m.load_state_dict(&sd).unwrap();
        m
    }

    fn loss(&self, m: &Small) -> Tensor<()> {
        let y = m.fc2.forward(m.fc1.forward(self.x.clone()).tanh());
        (&y - &self.t).square().mean_all()
    }

    /// Ten steps of `opt` from the initial parameters, compared after each.
    fn check_trajectory<O: Optimizer>(&self, case: &str, mut opt: O) {
        let model = self.model();
        let want = self.fx.array::<f32>(&format!("optim.{case}.params"));
        let want_loss = self.fx.array::<f32>(&format!("optim.{case}.loss"));
        assert_eq!(want.shape, [10, 23]);
        let mut worst = 0.0f64;
        for step in 0..10 {
            opt.zero_grad(&model);
            let loss = self.loss(&model);
            loss.backward();
            opt.step(&model);
            let got = flat(&model);
            let row = &want.data[step * 23..(step + 1) * 23];
            let err = normwise_error(&got, row);
            worst = worst.max(err);
            assert!(
                err <= RTOL,
                "{case}: after step {}: relative error {err:.2e} > {RTOL:e}\n  forma:   {got:?}\n  pytorch: {row:?}",
                step + 1,
            );
            let (l, wl) = (f64::from(loss.item()), f64::from(want_loss.data[step]));
            assert!(
                (l - wl).abs() <= RTOL * wl.abs(),
                "{case}: loss {l} vs {wl}"
            );
        }
        eprintln!("{case}: worst normwise relative error over 10 steps {worst:.2e}");
    }
}

fn flat(m: &Small) -> Vec<f32> {
    let mut v = m.fc1.weight.to_vec();
    v.extend(m.fc1.bias.as_ref().unwrap().to_vec());
    v.extend(m.fc2.weight.to_vec());
    v.extend(m.fc2.bias.as_ref().unwrap().to_vec());
    v
}

fn grad_of<S: Shape>(t: &Tensor<S>) -> Vec<f32> {
    t.grad().expect("backward reached the parameter").to_vec()
}

fn flat_grads(m: &Small) -> Vec<f32> {
    let mut v = grad_of(&m.fc1.weight);
    v.extend(grad_of(m.fc1.bias.as_ref().unwrap()));
    v.extend(grad_of(&m.fc2.weight));
    v.extend(grad_of(m.fc2.bias.as_ref().unwrap()));
    v
}

#[test]
fn sgd_matches_pytorch() {
    let s = Setup::new();
    let o = SgdOptions::default();
    s.check_trajectory("sgd_plain", Sgd::<f32>::new(o.clone().lr(0.1)));
    s.check_trajectory(
        "sgd_momentum",
        Sgd::<f32>::new(o.clone().lr(0.1).momentum(0.9)),
    );
    s.check_trajectory(
        "sgd_nesterov",
        Sgd::<f32>::new(o.clone().lr(0.1).momentum(0.9).nesterov(true)),
    );
    s.check_trajectory(
        "sgd_dampening",
        Sgd::<f32>::new(o.clone().lr(0.1).momentum(0.9).dampening(0.3)),
    );
    s.check_trajectory(
        "sgd_weight_decay",
        Sgd::<f32>::new(o.clone().lr(0.1).momentum(0.5).weight_decay(0.01)),
    );
    s.check_trajectory(
        "sgd_maximize",
        Sgd::<f32>::new(o.lr(0.05).momentum(0.5).maximize(true)),
    );
}

#[test]
fn adam_and_adamw_match_pytorch() {
    let s = Setup::new();
    let o = AdamOptions::default();
    s.check_trajectory("adam_plain", Adam::<f32>::new(o.clone().lr(0.01)));
    s.check_trajectory(
        "adam_amsgrad",
        Adam::<f32>::new(o.clone().lr(0.01).amsgrad(true)),
    );
    s.check_trajectory(
        "adam_weight_decay",
        Adam::<f32>::new(o.clone().lr(0.01).weight_decay(0.1)),
    );
    s.check_trajectory(
        "adam_betas",
        Adam::<f32>::new(o.lr(0.02).betas((0.5, 0.9)).eps(1e-6)),
    );
    let w = AdamWOptions::default();
    s.check_trajectory(
        "adamw",
        AdamW::<f32>::new(w.clone().lr(0.01).weight_decay(0.1)),
    );
    s.check_trajectory(
        "adamw_amsgrad",
        AdamW::<f32>::new(
            w.lr(0.01)
                .weight_decay(0.05)
                .amsgrad(true)
                .betas((0.8, 0.99)),
        ),
    );
}

#[test]
fn rmsprop_matches_pytorch() {
    let s = Setup::new();
    let o = RmsPropOptions::default();
    s.check_trajectory("rmsprop_plain", RmsProp::<f32>::new(o.clone().lr(0.01)));
    s.check_trajectory(
        "rmsprop_centered",
        RmsProp::<f32>::new(o.clone().lr(0.01).centered(true)),
    );
    s.check_trajectory(
        "rmsprop_momentum",
        RmsProp::<f32>::new(o.clone().lr(0.01).momentum(0.9)),
    );
    s.check_trajectory(
        "rmsprop_all",
        RmsProp::<f32>::new(
            o.lr(0.005)
                .alpha(0.9)
                .centered(true)
                .momentum(0.5)
                .weight_decay(0.01),
        ),
    );
}

#[test]
fn adagrad_matches_pytorch() {
    let s = Setup::new();
    let o = AdagradOptions::default();
    s.check_trajectory("adagrad_plain", Adagrad::<f32>::new(o.clone().lr(0.1)));
    s.check_trajectory(
        "adagrad_all",
        Adagrad::<f32>::new(
            o.lr(0.1)
                .lr_decay(0.01)
                .weight_decay(0.01)
                .initial_accumulator_value(0.1),
        ),
    );
}

#[test]
fn parameter_groups_match_pytorch() {
    let s = Setup::new();
    // Group 0: fc1 (by prefix); group 1: fc2 (by a closure).
    let sgd = Sgd::<f32>::with_groups(vec![
        ParamGroup::new(
            Select::prefixes(["fc1."]),
            SgdOptions::default()
                .lr(0.1)
                .momentum(0.9)
                .weight_decay(0.01),
        ),
        ParamGroup::new(
            Select::matching(|n| n.starts_with("fc2.")),
            SgdOptions::default().lr(0.05).momentum(0.9),
        ),
    ]);
    assert_eq!(sgd.group_of("fc1.bias"), Some(0));
    assert_eq!(sgd.group_of("fc2.weight"), Some(1));
    s.check_trajectory("sgd_groups", sgd);
    // The same split by exact names, and a catch-all second group.
    let adam = Adam::<f32>::with_groups(vec![
        ParamGroup::new(
            Select::names(["fc1.weight", "fc1.bias"]),
            AdamOptions::default().lr(0.01).weight_decay(0.1),
        ),
        ParamGroup::new(Select::all(), AdamOptions::default().lr(0.03)),
    ]);
    s.check_trajectory("adam_groups", adam);
}

#[test]
fn a_parameter_no_group_selects_is_left_alone() {
    let s = Setup::new();
    let model = s.model();
    let before = model.fc2.weight.to_vec();
    let mut opt = Sgd::<f32>::with_groups(vec![ParamGroup::new(
        Select::prefixes(["fc1."]),
        SgdOptions::default().lr(0.1),
    )]);
    s.loss(&model).backward();
    opt.step(&model);
    assert_eq!(model.fc2.weight.to_vec(), before);
    // fc1 moved by exactly PyTorch's first plain-SGD step.
    let want = s.fx.array::<f32>("optim.sgd_plain.params");
    common::assert_close(&model.fc1.weight.to_vec(), &want.data[..12], RTOL, ATOL);
}

fn fresh_grads(s: &Setup) -> Small {
    let model = s.model();
    s.loss(&model).backward();
    model
}

#[test]
fn clipping_matches_pytorch() {
    let s = Setup::new();
    let grads = s.fx.array::<f32>("clip.grads");
    common::assert_close(&flat_grads(&fresh_grads(&s)), &grads.data, RTOL, ATOL);
    for (case, max_norm, norm_type) in [
        ("norm2", 0.5, 2.0),
        ("inf", 0.1, f64::INFINITY),
        ("p1_5", 0.3, 1.5),
        ("unclipped", 100.0, 2.0),
    ] {
        let model = fresh_grads(&s);
        let total = clip_grad_norm_with(&model, max_norm, norm_type).unwrap();
        // The typed form takes the same path: the same bits.
        let typed = fresh_grads(&s);
        let typed_total = clip_grad_norm_on::<f32, Cpu>(&typed, max_norm, norm_type).unwrap();
        assert_eq!(
            (typed_total, flat_grads(&typed)),
            (total, flat_grads(&model))
        );
        let want = f64::from(s.fx.array::<f32>(&format!("clip.{case}.total")).data[0]);
        assert!(
            (total - want).abs() <= RTOL * want,
            "{case}: total norm {total} vs PyTorch's {want}"
        );
        let want = s.fx.array::<f32>(&format!("clip.{case}.grads"));
        if let Err(e) = common::close(
            &flat_grads(&model),
            &want.data,
            common::Tol {
                rtol: RTOL,
                atol: ATOL,
            },
        ) {
            panic!("{case}: {e}");
        }
    }
    // The unclipped case leaves the gradients bit for bit.
    let model = fresh_grads(&s);
    let before = flat_grads(&model);
    clip_grad_norm_(&model, 100.0).unwrap();
    assert_eq!(flat_grads(&model), before);

    let model = fresh_grads(&s);
    clip_grad_value_(&model, 0.05).unwrap();
    let want = s.fx.array::<f32>("clip.value.grads");
    common::assert_close(&flat_grads(&model), &want.data, RTOL, ATOL);
    assert!(flat_grads(&model).iter().all(|g| g.abs() <= 0.05));

    // A non-positive norm type is refused; no gradient gives a zero norm.
    assert!(clip_grad_norm_with(&model, 1.0, 0.0).is_err());
    model.zero_grad();
    assert_eq!(clip_grad_norm_(&model, 1.0).unwrap(), 0.0);
}

#[test]
fn clipping_then_stepping_matches_the_clipped_gradient() {
    // Clipping writes through to what the optimizer reads.
    let s = Setup::new();
    let model = fresh_grads(&s);
    clip_grad_norm_(&model, 0.5).unwrap();
    let g = flat_grads(&model);
    let p0 = flat(&model);
    let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(1.0));
    opt.step(&model);
    let p1 = flat(&model);
    for i in 0..p0.len() {
        assert_eq!(p1[i], p0[i] - g[i], "parameter {i}");
    }
}

// ------------------------------------------------------------------ schedulers

/// SGD (or Adam) with two groups at learning rates 0.1 and 0.05, like the
/// generator's `sched_optimizer`.
fn two_groups_sgd(momentum: f64) -> Sgd {
    Sgd::with_groups(vec![
        ParamGroup::new(
            Select::names(["a"]),
            SgdOptions::default().lr(0.1).momentum(momentum),
        ),
        ParamGroup::new(
            Select::names(["b"]),
            SgdOptions::default().lr(0.05).momentum(momentum),
        ),
    ])
}

fn two_groups_adam() -> Adam {
    Adam::with_groups(vec![
        ParamGroup::new(Select::names(["a"]), AdamOptions::default().lr(0.1)),
        ParamGroup::new(Select::names(["b"]), AdamOptions::default().lr(0.05)),
    ])
}

fn lrs(o: &dyn LrGroups) -> Vec<f64> {
    (0..o.num_groups()).map(|i| o.lr(i)).collect()
}

fn momenta(o: &dyn LrGroups) -> Vec<f64> {
    (0..o.num_groups())
        .map(|i| o.momentum(i).unwrap())
        .collect()
}

fn compare_f64(case: &str, what: &str, got: &[Vec<f64>], want: &common::Array<f64>) {
    assert_eq!(want.shape, [31, 2], "{case}");
    for (step, row) in got.iter().enumerate() {
        assert_eq!(row.len(), 2, "{case}");
        for (g, (&a, &e)) in row.iter().zip(&want.data[step * 2..]).enumerate() {
            assert!(
                (a - e).abs() <= 1e-12 + 1e-12 * e.abs(),
                "{case}: {what} of group {g} after {step} steps: {a:e} vs PyTorch's {e:e}"
            );
        }
    }
}

/// Steps `sched` 30 times after construction and compares the learning
/// rates (and momenta when `momentum`) with PyTorch's.
fn check_schedule(
    fx: &Fixture,
    case: &str,
    opt: &mut dyn LrGroups,
    step: &mut dyn FnMut(&mut dyn LrGroups) -> Vec<f64>,
    momentum: bool,
) {
    let mut got_lr = vec![lrs(opt)];
    let mut got_m = vec![if momentum { momenta(opt) } else { vec![] }];
    for _ in 0..30 {
        let last = step(opt);
        assert_eq!(
            last,
            lrs(opt),
            "{case}: get_last_lr differs from the groups"
        );
        got_lr.push(lrs(opt));
        if momentum {
            got_m.push(momenta(opt));
        }
    }
    compare_f64(
        case,
        "lr",
        &got_lr,
        &fx.array::<f64>(&format!("sched.{case}.lr")),
    );
    if momentum {
        compare_f64(
            case,
            "momentum",
            &got_m,
            &fx.array::<f64>(&format!("sched.{case}.momentum")),
        );
    }
}

fn check_single<S: LrScheduler>(
    fx: &Fixture,
    case: &str,
    mut opt: impl LrGroups,
    make: impl FnOnce(&mut dyn LrGroups) -> S,
    momentum: bool,
) {
    let mut sched = make(&mut opt);
    assert_eq!(sched.last_epoch(), 0, "{case}");
    check_schedule(
        fx,
        case,
        &mut opt,
        &mut |o| {
            sched.step(o);
            sched.get_last_lr().to_vec()
        },
        momentum,
    );
}

#[test]
fn schedulers_match_pytorch() {
    let fx = Fixture::load("optim");
    check_single(
        &fx,
        "step",
        two_groups_sgd(0.0),
        |o| StepLR::new(o, 7, 0.5),
        false,
    );
    check_single(
        &fx,
        "multistep",
        two_groups_sgd(0.0),
        |o| MultiStepLR::new(o, [5, 12, 12, 20], 0.3),
        false,
    );
    check_single(
        &fx,
        "exponential",
        two_groups_sgd(0.0),
        |o| ExponentialLR::new(o, 0.9),
        false,
    );
    check_single(
        &fx,
        "cosine",
        two_groups_sgd(0.0),
        |o| CosineAnnealingLR::new(o, 10, 0.001),
        false,
    );
    check_single(
        &fx,
        "linear",
        two_groups_sgd(0.0),
        |o| LinearLR::new(o, 0.25, 1.0, 8),
        false,
    );
    check_single(
        &fx,
        "linear_decay",
        two_groups_sgd(0.0),
        |o| LinearLR::new(o, 1.0, 0.1, 12),
        false,
    );
}

#[test]
fn one_cycle_matches_pytorch() {
    let fx = Fixture::load("optim");
    check_single(
        &fx,
        "onecycle",
        two_groups_sgd(0.9),
        |o| OneCycleLR::new(o, OneCycleOptions::new(1.0, 30).max_lrs(vec![1.0, 0.5])),
        true,
    );
    check_single(
        &fx,
        "onecycle_three_phase",
        two_groups_adam(),
        |o| {
            OneCycleLR::new(
                o,
                OneCycleOptions::new(0.8, 30)
                    .pct_start(0.25)
                    .anneal_strategy(Anneal::Linear)
                    .div_factor(10.0)
                    .final_div_factor(100.0)
                    .three_phase(true)
                    .momentum_range(0.8, 0.9),
            )
        },
        true,
    );
    check_single(
        &fx,
        "onecycle_no_momentum",
        two_groups_sgd(0.0),
        |o| {
            OneCycleLR::new(
                o,
                OneCycleOptions::new(0.3, 30)
                    .pct_start(0.4)
                    .cycle_momentum(false),
            )
        },
        false,
    );
    // The 31st step is past the end of a 30-step cycle, as in PyTorch.
    let mut opt = two_groups_sgd(0.9);
    let mut s = OneCycleLR::new(&mut opt, OneCycleOptions::new(1.0, 3));
    for _ in 0..3 {
        s.step(&mut opt);
    }
    assert!(s.try_step(&mut opt).is_err());
    // Adagrad has no momentum to cycle.
    let mut ada: Adagrad = Adagrad::new(AdagradOptions::default());
    assert!(OneCycleLR::try_new(&mut ada, OneCycleOptions::new(1.0, 3)).is_err());
}

#[test]
fn sequential_and_chained_schedulers_match_pytorch() {
    let fx = Fixture::load("optim");
    check_single(
        &fx,
        "warmup_cosine",
        two_groups_sgd(0.0),
        |o| {
            let warmup = LinearLR::new(o, 0.1, 1.0, 5);
            let cosine = CosineAnnealingLR::new(o, 20, 0.0);
            SequentialLR::new(o, vec![Box::new(warmup), Box::new(cosine)], vec![5])
        },
        false,
    );
    check_single(
        &fx,
        "sequential_three",
        two_groups_sgd(0.0),
        |o| {
            let a = LinearLR::new(o, 0.5, 1.0, 4);
            let b = ExponentialLR::new(o, 0.9);
            let c = StepLR::new(o, 3, 0.5);
            SequentialLR::new(o, vec![Box::new(a), Box::new(b), Box::new(c)], vec![4, 15])
        },
        false,
    );
    // Two chainable schedulers on one optimizer compose.
    let mut opt = two_groups_sgd(0.0);
    let mut a = StepLR::new(&mut opt, 4, 0.5);
    let mut b = ExponentialLR::new(&mut opt, 0.95);
    check_schedule(
        &fx,
        "chained",
        &mut opt,
        &mut |o| {
            a.step(o);
            b.step(o);
            b.get_last_lr().to_vec()
        },
        false,
    );
    // ChainedScheduler([a, b]) is exactly that loop, as in PyTorch.
    let mut opt = two_groups_sgd(0.0);
    let a = StepLR::new(&mut opt, 4, 0.5);
    let b = ExponentialLR::new(&mut opt, 0.95);
    let mut chained = ChainedScheduler::new(vec![Box::new(a), Box::new(b)]);
    check_schedule(
        &fx,
        "chained",
        &mut opt,
        &mut |o| {
            chained.step(o);
            chained.get_last_lr().to_vec()
        },
        false,
    );
    assert!(ChainedScheduler::try_new(vec![]).is_err());
}

#[test]
fn scheduler_state_round_trips() {
    // Export after 7 steps, load into a fresh scheduler, and both continue alike.
    type Make = fn(&mut dyn LrGroups) -> Box<dyn LrScheduler>;
    let makers: [(&str, Make); 6] = [
        ("step", |o| Box::new(StepLR::new(o, 3, 0.5))),
        ("multistep", |o| Box::new(MultiStepLR::new(o, [2, 9], 0.1))),
        ("cosine", |o| Box::new(CosineAnnealingLR::new(o, 5, 0.01))),
        ("onecycle", |o| {
            Box::new(OneCycleLR::new(o, OneCycleOptions::new(1.0, 20)))
        }),
        ("chained", |o| {
            let a = StepLR::new(o, 3, 0.5);
            let b = ExponentialLR::new(o, 0.9);
            Box::new(ChainedScheduler::new(vec![Box::new(a), Box::new(b)]))
        }),
        ("warmup", |o| {
            let w = LinearLR::new(o, 0.2, 1.0, 4);
            let c = CosineAnnealingLR::new(o, 10, 0.0);
            Box::new(SequentialLR::new(
                o,
                vec![Box::new(w), Box::new(c)],
                vec![4],
            ))
        }),
    ];
    for (case, make) in makers {
        let mut o1 = two_groups_sgd(0.9);
        let mut s1 = make(&mut o1);
        for _ in 0..7 {
            s1.step(&mut o1);
        }
        let st = s1.state_dict();
        let ost = o1.state_dict();
        // As in PyTorch: a fresh optimizer, a fresh scheduler, then both states.
        let mut o2 = two_groups_sgd(0.9);
        let mut s2 = make(&mut o2);
        o2.load_state_dict(&(), &ost).unwrap();
        s2.load_state_dict(&st).unwrap();
        assert_eq!(s2.state_dict(), st, "{case}");
        for _ in 0..8 {
            s1.step(&mut o1);
            s2.step(&mut o2);
            assert_eq!(s1.get_last_lr(), s2.get_last_lr(), "{case}");
            assert_eq!(lrs(&o1), lrs(&o2), "{case}");
            assert_eq!(momenta(&o1), momenta(&o2), "{case}");
        }
        // Another kind of scheduler's state is refused.
        let mut other = StepLR::new(&mut two_groups_sgd(0.0), 1, 0.5);
        if case != "step" {
            assert!(other.load_state_dict(&st).is_err(), "{case}");
        }
    }
}
