//! Training against PyTorch, and resuming from exported state.
//!
//! - A full run of an MLP 8 -> 16 -> ReLU -> 3 with cross-entropy
//!   (`log_softmax` + `gather`), minibatches of 16 in PyTorch's order, 5
//!   epochs, from PyTorch's initial weights (`tools/gen_optim_fixtures.py`,
//!   `train.*`): each epoch's mean loss within 1e-4 of PyTorch's, for SGD with
//!   momentum and for Adam; the final parameters within 1e-4.
//! - Save and restore: 5 steps, export the model, optimizer and scheduler
//!   state, rebuild all three fresh, import, 5 more steps: the parameters are
//!   bit-identical to an uninterrupted 10-step run (for every optimizer, with
//!   a scheduler).

use crate::common;

use common::Fixture;
use forma::core::TensorData;
use forma::nn::layers::Linear;
use forma::nn::optim::{
    Adagrad, AdagradOptions, Adam, AdamOptions, AdamW, AdamWOptions, Optimizer, OptimizerState,
    ParamGroup, RmsProp, RmsPropOptions, Select, Sgd, SgdOptions,
};
use forma::nn::sched::{
    CosineAnnealingLR, ExponentialLR, LinearLR, LrScheduler, MultiStepLR, OneCycleLR,
    OneCycleOptions, SchedulerState, SequentialLR, StepLR,
};
use forma::nn::StateDict;
use forma::prelude::*;

const N: usize = 96;
const BATCH: usize = 16;
const EPOCHS: usize = 5;
const PARAMS: [&str; 4] = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"];

#[derive(Module)]
struct Mlp {
    fc1: Linear<8, 16>,
    fc2: Linear<16, 3>,
}

impl Mlp {
    fn loss(&self, x: Tensor<(Dyn, C<8>)>, y: &Tensor<(Dyn, C<1>), i64>) -> Tensor<()> {
        let logits = self.fc2.forward(self.fc1.forward(x).relu());
        // Cross-entropy: the mean negative log-likelihood of the labels.
        -logits.log_softmax::<1>().gather::<1, _>(y).mean_all()
    }

    fn flat(&self) -> Vec<f32> {
        self.state_dict()
            .iter()
            .flat_map(|(_, d)| d.to_vec::<f32>())
            .collect()
    }
}

struct Data {
    fx: Fixture,
    x: Vec<f32>,
    y: Vec<i64>,
    perm: Vec<i64>,
}

impl Data {
    fn load() -> Self {
        let fx = Fixture::load("optim");
        let x = fx.array::<f32>("train.x");
        assert_eq!(x.shape, [N, 8]);
        let y = fx.array::<i64>("train.y").data;
        let perm = fx.array::<i64>("train.perm");
        assert_eq!(perm.shape, [EPOCHS, N]);
        Data {
            fx,
            x: x.data,
            y,
            perm: perm.data,
        }
    }

    /// The model with PyTorch's initial parameters.
    fn model(&self) -> Mlp {
        let mut rng = Rng::seed_from(1);
        let mut m = Mlp {
            fc1: Linear::new(&Cpu, &mut rng),
            fc2: Linear::new(&Cpu, &mut rng),
        };
        let mut sd = StateDict::new();
        for name in PARAMS {
            let a = self.fx.array::<f32>(&format!("train.init.{name}"));
            sd.insert(name, TensorData::from_vec(&a.data, a.shape).unwrap());
        }
        m.load_state_dict(&sd).unwrap();
        m
    }

    /// Minibatch `b` of epoch `e`, in PyTorch's order.
    fn batch(&self, e: usize, b: usize) -> (Tensor<(Dyn, C<8>)>, Tensor<(Dyn, C<1>), i64>) {
        let idx = &self.perm[e * N + b * BATCH..e * N + (b + 1) * BATCH];
        let x: Vec<f32> = idx
            .iter()
            .flat_map(|&i| self.x[i as usize * 8..(i as usize + 1) * 8].to_vec())
            .collect();
        let y: Vec<i64> = idx.iter().map(|&i| self.y[i as usize]).collect();
        (
            Tensor::from_vec(x, (Dyn(BATCH), C)).unwrap(),
            Tensor::from_vec(y, (Dyn(BATCH), C)).unwrap(),
        )
    }

    /// One optimizer step on the `k`-th minibatch (counting across epochs);
    /// returns the loss.
    fn train_step(&self, model: &Mlp, opt: &mut impl Optimizer, k: usize) -> f32 {
        let per_epoch = N / BATCH;
        let (x, y) = self.batch((k / per_epoch) % EPOCHS, k % per_epoch);
        opt.zero_grad(model);
        let loss = model.loss(x, &y);
        loss.backward();
        opt.step(model);
        loss.item()
    }

    fn full_run(&self, name: &str, mut opt: impl Optimizer) {
        let model = self.model();
        let want = self
            .fx
            .array::<f32>(&format!("train.{name}.epoch_loss"))
            .data;
        let per_epoch = N / BATCH;
        for (e, &want) in want.iter().enumerate() {
            let total: f64 = (0..per_epoch)
                .map(|b| f64::from(self.train_step(&model, &mut opt, e * per_epoch + b)))
                .sum();
            let mean = total / per_epoch as f64;
            let want = f64::from(want);
            eprintln!("{name}: epoch {e}: mean loss {mean:.7} vs PyTorch's {want:.7}");
            assert!(
                (mean - want).abs() <= 1e-4,
                "{name}: epoch {e}: mean loss {mean} vs PyTorch's {want}"
            );
        }
        let sd = model.state_dict();
        for p in PARAMS {
            let want = self
                .fx
                .array::<f32>(&format!("train.{name}.final.{p}"))
                .data;
            common::assert_close(&sd.get(p).unwrap().to_vec::<f32>(), &want, 1e-5, 1e-6);
        }
    }
}

#[test]
fn sgd_with_momentum_trains_like_pytorch() {
    let data = Data::load();
    let opt: Sgd = Sgd::new(SgdOptions::default().lr(0.1).momentum(0.9));
    data.full_run("sgd", opt);
}

#[test]
fn adam_trains_like_pytorch() {
    let data = Data::load();
    let opt: Adam = Adam::new(AdamOptions::default().lr(0.01));
    data.full_run("adam", opt);
}

// ------------------------------------------------------------------ resume

/// Everything a checkpoint holds, as plain values.
struct Checkpoint {
    model: StateDict,
    optimizer: OptimizerState,
    scheduler: SchedulerState,
}

/// Runs 10 steps uninterrupted, and 5 steps + checkpoint + rebuild + 5
/// steps; the parameters, learning rates and momenta must agree bit for bit.
fn check_resume<O: Optimizer, S: LrScheduler>(
    case: &str,
    make_opt: impl Fn() -> O,
    make_sched: impl Fn(&mut O) -> S,
) {
    let data = Data::load();
    let run = |model: &Mlp, opt: &mut O, sched: &mut S, steps: std::ops::Range<usize>| {
        for k in steps {
            data.train_step(model, opt, k);
            sched.step(opt);
        }
    };

    let straight = data.model();
    let mut opt = make_opt();
    let mut sched = make_sched(&mut opt);
    run(&straight, &mut opt, &mut sched, 0..10);

    let first = data.model();
    let mut opt1 = make_opt();
    let mut sched1 = make_sched(&mut opt1);
    run(&first, &mut opt1, &mut sched1, 0..5);
    let ckpt = Checkpoint {
        model: first.state_dict(),
        optimizer: opt1.state_dict(),
        scheduler: sched1.state_dict(),
    };
    drop((first, opt1, sched1));

    // A fresh process: a model from other weights, a fresh optimizer and
    // scheduler (whose construction moves the learning rates), then the states.
    let mut resumed = Mlp {
        fc1: Linear::new(&Cpu, &mut Rng::seed_from(99)),
        fc2: Linear::new(&Cpu, &mut Rng::seed_from(98)),
    };
    resumed.load_state_dict(&ckpt.model).unwrap();
    let mut opt2 = make_opt();
    let mut sched2 = make_sched(&mut opt2);
    opt2.load_state_dict(&resumed, &ckpt.optimizer).unwrap();
    sched2.load_state_dict(&ckpt.scheduler).unwrap();
    run(&resumed, &mut opt2, &mut sched2, 5..10);

    let (a, b) = (straight.flat(), resumed.flat());
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "{case}: the resumed run differs from the uninterrupted one"
    );
    for g in 0..opt.num_groups() {
        assert_eq!(opt.lr(g).to_bits(), opt2.lr(g).to_bits(), "{case}: lr");
        assert_eq!(
            opt.momentum(g).map(f64::to_bits),
            opt2.momentum(g).map(f64::to_bits),
            "{case}: momentum"
        );
    }
    assert_eq!(
        opt.state_dict(),
        opt2.state_dict(),
        "{case}: optimizer state"
    );
    assert_eq!(
        sched.state_dict(),
        sched2.state_dict(),
        "{case}: scheduler state"
    );
    // And the run did move the parameters.
    assert_ne!(a, data.model().flat(), "{case}");
}

/// Two groups: the first layer with weight decay, the rest without.
fn groups<O: Clone>(first: O, rest: O) -> Vec<ParamGroup<O>> {
    vec![
        ParamGroup::new(Select::prefixes(["fc1."]), first),
        ParamGroup::new(Select::all(), rest),
    ]
}

#[test]
fn adam_with_warmup_and_cosine_resumes_bit_identically() {
    check_resume(
        "adam + warmup/cosine",
        || {
            let o = AdamOptions::default().lr(0.01);
            Adam::<f32>::with_groups(groups(o.clone().weight_decay(0.01), o))
        },
        |opt| {
            let warmup = LinearLR::new(opt, 0.1, 1.0, 3);
            let cosine = CosineAnnealingLR::new(opt, 10, 1e-4);
            SequentialLR::new(opt, vec![Box::new(warmup), Box::new(cosine)], vec![3])
        },
    );
}

#[test]
fn sgd_with_one_cycle_resumes_bit_identically() {
    check_resume(
        "sgd nesterov + 1cycle",
        || Sgd::<f32>::new(SgdOptions::default().lr(0.1).momentum(0.9).nesterov(true)),
        |opt| OneCycleLR::new(opt, OneCycleOptions::new(0.2, 12)),
    );
}

#[test]
fn rmsprop_adagrad_adamw_resume_bit_identically() {
    check_resume(
        "rmsprop centered + step",
        || {
            RmsProp::<f32>::new(
                RmsPropOptions::default()
                    .lr(0.005)
                    .centered(true)
                    .momentum(0.5)
                    .weight_decay(0.01),
            )
        },
        |opt| StepLR::new(opt, 3, 0.5),
    );
    check_resume(
        "adagrad + exponential",
        || Adagrad::<f32>::new(AdagradOptions::default().lr(0.05).lr_decay(0.01)),
        |opt| ExponentialLR::new(opt, 0.9),
    );
    check_resume(
        "adamw amsgrad + multistep",
        || {
            let o = AdamWOptions::default().lr(0.01).amsgrad(true);
            AdamW::<f32>::with_groups(groups(o.clone(), o.weight_decay(0.0)))
        },
        |opt| MultiStepLR::new(opt, [2, 6, 8], 0.5),
    );
}

#[test]
fn exported_state_names_its_parts() {
    let data = Data::load();
    let model = data.model();
    let mut opt: Adam = Adam::new(AdamOptions::default().amsgrad(true));
    data.train_step(&model, &mut opt, 0);
    let st = opt.state_dict();
    let keys: Vec<&str> = st.tensors.keys().collect();
    assert!(keys.contains(&"state.fc1.weight.exp_avg"));
    assert!(keys.contains(&"state.fc2.bias.max_exp_avg_sq"));
    assert_eq!(keys.len(), 12);
    assert_eq!(
        st.tensors
            .get("state.fc1.weight.exp_avg_sq")
            .unwrap()
            .dims(),
        [128]
    );
    assert_eq!(st.meta["optimizer"], "Adam");
    assert_eq!(st.meta["param_groups"], "1");
    assert_eq!(st.meta["param_groups.0.betas"], "0.9,0.999");
    assert_eq!(st.meta["state.fc2.weight.step"], "1");

    // Refused, and nothing changed: another optimizer's state, a state for a
    // parameter the model lacks, a buffer of the wrong size.
    let mut sgd: Sgd = Sgd::new(SgdOptions::default());
    assert!(sgd.load_state_dict(&model, &st).is_err());
    let mut other = opt.clone();
    let mut bad = st.clone();
    bad.meta.insert("state.fc9.weight.step".into(), "1".into());
    assert!(other.load_state_dict(&model, &bad).is_err());
    let mut bad = st.clone();
    bad.tensors.insert(
        "state.fc1.bias.exp_avg",
        TensorData::from_vec(&[0f32; 3], vec![3]).unwrap(),
    );
    assert!(other.load_state_dict(&model, &bad).is_err());
    let mut bad = st.clone();
    bad.meta.insert("param_groups.0.lr".into(), "fast".into());
    assert!(other.load_state_dict(&model, &bad).is_err());
    assert_eq!(other.state_dict(), st);
}
