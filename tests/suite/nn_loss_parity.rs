//! The losses against PyTorch (`tools/fixtures/losses.safetensors`, written
//! by `tools/gen_loss_fixtures.py`; its docstring gives the key conventions):
//!
//! - `fixture_cases`: every case of the file (every loss, every option
//!   combination, every reduction, the kinks) runs in f64 on the same
//!   inputs with the options the file stores; the loss, the gradient of the
//!   input and, where PyTorch gives one, of the target (after backward from
//!   the stored upstream gradient) must match within rtol 1e-10 / atol 1e-12.
//!   Every case in the file must be checked.
//! - `f32_cases`: the `*.f32.*` cases in f32, within 1e-5 relative.
//! - `static_shapes`: the same values through fully static shape types.
//! - `gradcheck_*`: the tape's gradients against central differences,
//!   including the two losses that record PyTorch's gradient formulas.
//! - `errors::*`: bad class indices, sizes, options and probabilities give
//!   `LossError` values, and the plain forms panic with the same message.

use crate::common;

use common::{Checks, Fixture, FixtureElem, Tol, F32_TOL};
use forma::core::tape::{gradcheck, GradcheckOptions};
use forma::nn::loss::{
    self, op, AnyReduction, BatchMean, BceLoss, BceWithLogitsLoss, ClassInput, ClassTargets,
    CrossEntropyLoss, LossError, LossShape, Mean, NllLoss, NoReduction, Reduction, Sum,
};
use forma::prelude::*;
use std::collections::BTreeSet;

const TOL: Tol = Tol {
    rtol: 1e-10,
    atol: 1e-12,
};

type T1 = Tensor<(Dyn,), f64>;
type T2 = Tensor<(Dyn, Dyn), f64>;

/// One case of the fixture file: its name and where its tensors are.
struct Case<'a> {
    fx: &'a Fixture,
    name: &'a str,
}

impl Case<'_> {
    fn key(&self, what: &str) -> String {
        format!("{}.{what}", self.name)
    }

    fn has(&self, what: &str) -> bool {
        self.fx.has(&self.key(what))
    }

    fn tensor<S: Shape>(&self, what: &str) -> Tensor<S, f64> {
        self.fx.tensor(&self.key(what), &Cpu)
    }

    fn scalar_f64(&self, what: &str) -> Option<f64> {
        self.has(what).then(|| self.fx.f64(&self.key(what)).0[0])
    }

    fn ignore_index(&self) -> i64 {
        if self.has("ignore_index") {
            self.fx.i64(&self.key("ignore_index")).0[0]
        } else {
            -100
        }
    }

    fn rank(&self, what: &str) -> usize {
        self.fx.array::<f64>(&self.key(what)).shape.len()
    }

    /// The leaves: the input, and the target when PyTorch differentiates it.
    fn leaves<S: Shape>(&self) -> (Tensor<S, f64>, Tensor<S, f64>) {
        let x = self.tensor::<S>("input").requires_grad();
        let y = self.tensor::<S>("target");
        let y = if self.has("grad_target") {
            y.requires_grad()
        } else {
            y
        };
        (x, y)
    }

    /// Compares the loss, backpropagates the stored upstream gradient and
    /// compares the gradients.
    fn check<So: Shape, Sx: Shape, Sy: Shape, Ey: FixtureElem>(
        &self,
        checks: &mut Checks,
        out: Result<Tensor<So, f64>, LossError>,
        x: &Tensor<Sx, f64>,
        y: &Tensor<Sy, Ey>,
    ) {
        let out = match out {
            Ok(o) => o,
            Err(e) => return checks.fail(format!("{}: the loss failed: {e}", self.name)),
        };
        checks.close(&out, &self.key("out"), TOL);
        let gout = self.tensor::<So>("gout");
        if let Err(e) = out.try_backward_with(&gout) {
            return checks.fail(format!("{}: backward failed: {e}", self.name));
        }
        match x.grad() {
            Some(g) => checks.close(&g, &self.key("grad_input"), TOL),
            None => checks.fail(format!("{}: no gradient reached the input", self.name)),
        }
        if self.has("grad_target") {
            match y.grad() {
                Some(g) => checks.close(&g, &self.key("grad_target"), TOL),
                None => checks.fail(format!("{}: no gradient reached the target", self.name)),
            }
        }
    }
}

/// Runs `$body` with `$r` bound to the reduction named `$red`.
macro_rules! with_reduction {
    ($red:expr, |$r:ident| $body:expr) => {
        match $red {
            "mean" => {
                let $r = Mean;
                $body
            }
            "sum" => {
                let $r = Sum;
                $body
            }
            "none" => {
                let $r = NoReduction;
                $body
            }
            other => panic!("unknown reduction `{other}`"),
        }
    };
}

/// Class-index losses (`cross_entropy`, `nll_loss`) on an input of shape `S`.
fn class_case<S: Shape, T: Shape>(c: &Case, checks: &mut Checks, loss: &str, red: &str)
where
    S: ClassInput<op::cross_entropy> + ClassInput<op::nll_loss>,
    <S as ClassTargets>::Targets: LossShape<T, op::cross_entropy> + LossShape<T, op::nll_loss>,
{
    fn run<S: Shape, T: Shape, R: Reduction>(c: &Case, checks: &mut Checks, loss: &str, r: R)
    where
        S: ClassInput<op::cross_entropy> + ClassInput<op::nll_loss>,
        <S as ClassTargets>::Targets: LossShape<T, op::cross_entropy> + LossShape<T, op::nll_loss>,
    {
        let x = c.tensor::<S>("input").requires_grad();
        let y: Tensor<T, i64> = c.fx.tensor(&c.key("target"), &Cpu);
        let w = c.has("weight").then(|| c.tensor::<(Dyn,)>("weight"));
        let out = if loss == "cross_entropy" {
            let mut l = CrossEntropyLoss::new()
                .ignore_index(c.ignore_index())
                .label_smoothing(c.scalar_f64("label_smoothing").unwrap_or(0.0))
                .reduction(r);
            if let Some(w) = &w {
                l = l.weight(w);
            }
            l.try_forward(&x, &y)
        } else {
            let mut l = NllLoss::new().ignore_index(c.ignore_index()).reduction(r);
            if let Some(w) = &w {
                l = l.weight(w);
            }
            l.try_forward(&x, &y)
        };
        c.check(checks, out, &x, &y);
    }
    with_reduction!(red, |r| run::<S, T, _>(c, checks, loss, r))
}

/// Class-index losses on one unbatched sample: input `[C]`, target `[]`.
fn unbatched_case(c: &Case, checks: &mut Checks, loss: &str, red: &str) {
    fn run<R: Reduction>(c: &Case, checks: &mut Checks, loss: &str, r: R) {
        let x = c.tensor::<(Dyn,)>("input").requires_grad();
        let y: Tensor<(), i64> = c.fx.tensor(&c.key("target"), &Cpu);
        let w = c.has("weight").then(|| c.tensor::<(Dyn,)>("weight"));
        let out = if loss == "cross_entropy" {
            let mut l = CrossEntropyLoss::new()
                .label_smoothing(c.scalar_f64("label_smoothing").unwrap_or(0.0))
                .reduction(r);
            if let Some(w) = &w {
                l = l.weight(w);
            }
            l.try_forward_unbatched(&x, &y)
        } else {
            let mut l = NllLoss::new().reduction(r);
            if let Some(w) = &w {
                l = l.weight(w);
            }
            l.try_forward_unbatched(&x, &y)
        };
        c.check(checks, out, &x, &y);
    }
    with_reduction!(red, |r| run(c, checks, loss, r))
}

/// `cross_entropy` with class probabilities on an input of shape `S`.
fn probs_case<S: Shape>(c: &Case, checks: &mut Checks, red: &str)
where
    S: ClassInput<op::cross_entropy> + LossShape<S, op::cross_entropy>,
{
    fn run<S: Shape, R: Reduction>(c: &Case, checks: &mut Checks, r: R)
    where
        S: ClassInput<op::cross_entropy> + LossShape<S, op::cross_entropy>,
    {
        let (x, y) = c.leaves::<S>();
        let mut l = CrossEntropyLoss::new()
            .label_smoothing(c.scalar_f64("label_smoothing").unwrap_or(0.0))
            .reduction(r);
        if c.has("weight") {
            l = l.weight(&c.tensor::<(Dyn,)>("weight"));
        }
        let out = l.try_forward_probs(&x, &y);
        c.check(checks, out, &x, &y);
    }
    with_reduction!(red, |r| run::<S, _>(c, checks, r))
}

/// A weight option of either rank the file uses, passed to `set`.
fn weight_arg<L>(
    c: &Case,
    what: &str,
    l: L,
    set1: impl FnOnce(L, &T1) -> L,
    set2: impl FnOnce(L, &T2) -> L,
) -> L {
    if !c.has(what) {
        return l;
    }
    match c.rank(what) {
        1 => set1(l, &c.tensor(what)),
        2 => set2(l, &c.tensor(what)),
        r => panic!("{}: a weight of rank {r}", c.name),
    }
}

/// The elementwise losses on `[B, C]` inputs.
fn elementwise_case(c: &Case, checks: &mut Checks, loss: &str, red: &str) {
    fn run<R: Reduction>(c: &Case, checks: &mut Checks, loss: &str, r: R) {
        let (x, y) = c.leaves::<(Dyn, Dyn)>();
        let out = match loss {
            "mse_loss" => loss::try_mse_loss(&x, &y, r),
            "l1_loss" => loss::try_l1_loss(&x, &y, r),
            "smooth_l1_loss" => loss::try_smooth_l1_loss(&x, &y, c.scalar_f64("beta").unwrap(), r),
            "huber_loss" => loss::try_huber_loss(&x, &y, c.scalar_f64("delta").unwrap(), r),
            "binary_cross_entropy" => {
                let l = weight_arg(
                    c,
                    "weight",
                    BceLoss::<f64, Cpu>::new().reduction(r),
                    |l, w| l.weight(w),
                    |l, w| l.weight(w),
                );
                l.try_forward(&x, &y)
            }
            "binary_cross_entropy_with_logits" => {
                let l = BceWithLogitsLoss::<f64, Cpu>::new().reduction(r);
                let l = weight_arg(c, "weight", l, |l, w| l.weight(w), |l, w| l.weight(w));
                let l = weight_arg(
                    c,
                    "pos_weight",
                    l,
                    |l, w| l.pos_weight(w),
                    |l, w| l.pos_weight(w),
                );
                l.try_forward(&x, &y)
            }
            other => panic!("unknown loss `{other}`"),
        };
        c.check(checks, out, &x, &y);
    }
    with_reduction!(red, |r| run(c, checks, loss, r))
}

/// `kl_div`, whose reductions include `batchmean`.
fn kl_case(c: &Case, checks: &mut Checks, red: &str) {
    fn run<R: AnyReduction>(c: &Case, checks: &mut Checks, r: R) {
        let (x, y) = c.leaves::<(Dyn, Dyn)>();
        let log_target = c.has("log_target") && c.fx.array::<bool>(&c.key("log_target")).data[0];
        let out = loss::try_kl_div(&x, &y, r, log_target);
        c.check(checks, out, &x, &y);
    }
    match red {
        "batchmean" => run(c, checks, BatchMean),
        red => with_reduction!(red, |r| run(c, checks, r)),
    }
}

fn case_names(fx: &Fixture) -> BTreeSet<String> {
    fx.keys()
        .iter()
        .filter_map(|k| k.strip_suffix(".out").map(str::to_string))
        .collect()
}

#[test]
fn fixture_cases() {
    let fx = Fixture::load("losses");
    let meta = fx.metadata();
    assert_eq!(
        meta.get("generator").map(String::as_str),
        Some("tools/gen_loss_fixtures.py")
    );
    assert!(meta.get("torch").is_some_and(|v| v.starts_with('2')));
    let mut checks = Checks::new(&fx);
    let mut ran = BTreeSet::new();
    for name in case_names(&fx) {
        let parts: Vec<&str> = name.split('.').collect();
        let [loss, variant, red] = parts[..] else {
            panic!("case `{name}` is not <loss>.<variant>.<reduction>");
        };
        if variant == "f32" {
            continue; // f32_cases
        }
        let c = Case {
            fx: &fx,
            name: &name,
        };
        let rank = c.rank("input");
        match (loss, rank) {
            ("cross_entropy" | "nll_loss", 1) => unbatched_case(&c, &mut checks, loss, red),
            ("cross_entropy" | "nll_loss", 2) => {
                class_case::<(Dyn, Dyn), (Dyn,)>(&c, &mut checks, loss, red)
            }
            ("cross_entropy" | "nll_loss", 3) => {
                class_case::<(Dyn, Dyn, Dyn), (Dyn, Dyn)>(&c, &mut checks, loss, red)
            }
            ("cross_entropy" | "nll_loss", 4) => {
                class_case::<(Dyn, Dyn, Dyn, Dyn), (Dyn, Dyn, Dyn)>(&c, &mut checks, loss, red)
            }
            ("cross_entropy_probs", 2) => probs_case::<(Dyn, Dyn)>(&c, &mut checks, red),
            ("cross_entropy_probs", 3) => probs_case::<(Dyn, Dyn, Dyn)>(&c, &mut checks, red),
            ("kl_div", 2) => kl_case(&c, &mut checks, red),
            (_, 2) => elementwise_case(&c, &mut checks, loss, red),
            _ => panic!("case `{name}`: no runner for rank {rank}"),
        }
        ran.insert(name.clone());
    }
    // Every loss and every reduction of the brief is in the file.
    for loss in [
        "cross_entropy",
        "cross_entropy_probs",
        "nll_loss",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "kl_div",
    ] {
        for red in ["mean", "sum", "none"] {
            assert!(
                ran.iter()
                    .any(|n| n.starts_with(&format!("{loss}.")) && n.ends_with(&format!(".{red}"))),
                "no case for {loss} with reduction {red}"
            );
        }
    }
    assert!(ran.contains("kl_div.plain.batchmean"));
    let f32_cases = case_names(&fx)
        .iter()
        .filter(|n| n.contains(".f32."))
        .count();
    assert_eq!(ran.len() + f32_cases, case_names(&fx).len());
    checks.finish();
}

#[test]
fn f32_cases() {
    let fx = Fixture::load("losses");
    let f32_of = |key: &str| -> Tensor<(Dyn, Dyn), f32> {
        fx.tensor::<(Dyn, Dyn), f64, _>(key, &Cpu).to_dtype()
    };
    let expect = |key: &str| -> Vec<f32> { fx.f64(key).0.iter().map(|&v| v as f32).collect() };
    let tol = F32_TOL;
    let assert_f32 = |actual: &[f32], key: &str| {
        if let Err(e) = common::close(actual, &expect(key), tol) {
            panic!("{key}: {e}");
        }
    };

    // cross_entropy with weight and label smoothing.
    let x = f32_of("cross_entropy.f32.mean.input").requires_grad();
    let y: Tensor<(Dyn,), i64> = fx.tensor("cross_entropy.f32.mean.target", &Cpu);
    let w: Tensor<(Dyn,), f32> = fx
        .tensor::<(Dyn,), f64, _>("cross_entropy.f32.mean.weight", &Cpu)
        .to_dtype();
    let l = CrossEntropyLoss::new()
        .weight(&w)
        .label_smoothing(0.1)
        .forward(&x, &y);
    l.backward();
    assert_f32(&l.to_vec(), "cross_entropy.f32.mean.out");
    assert_f32(
        &x.grad().unwrap().to_vec(),
        "cross_entropy.f32.mean.grad_input",
    );

    // mse.
    let x = f32_of("mse_loss.f32.mean.input").requires_grad();
    let y = f32_of("mse_loss.f32.mean.target").requires_grad();
    let l = loss::mse_loss(&x, &y, Mean);
    l.backward();
    assert_f32(&l.to_vec(), "mse_loss.f32.mean.out");
    assert_f32(&x.grad().unwrap().to_vec(), "mse_loss.f32.mean.grad_input");
    assert_f32(&y.grad().unwrap().to_vec(), "mse_loss.f32.mean.grad_target");

    // BCE with logits and pos_weight.
    let k = "binary_cross_entropy_with_logits.f32.mean";
    let x = f32_of(&format!("{k}.input")).requires_grad();
    let y = f32_of(&format!("{k}.target")).requires_grad();
    let pw: Tensor<(Dyn,), f32> = fx
        .tensor::<(Dyn,), f64, _>(&format!("{k}.pos_weight"), &Cpu)
        .to_dtype();
    let l = BceWithLogitsLoss::new().pos_weight(&pw).forward(&x, &y);
    l.backward();
    assert_f32(&l.to_vec(), &format!("{k}.out"));
    assert_f32(&x.grad().unwrap().to_vec(), &format!("{k}.grad_input"));
    assert_f32(&y.grad().unwrap().to_vec(), &format!("{k}.grad_target"));
}

/// The same losses through fully static shape types give PyTorch's values
/// (the `LossShape` rule accepts equal static sizes and mixes with `Dyn`).
#[test]
fn static_shapes() {
    let fx = Fixture::load("losses");
    let x: Tensor<(C<5>, C<4>), f64> = fx.tensor("cross_entropy.plain.none.input", &Cpu);
    let y: Tensor<(C<5>,), i64> = fx.tensor("cross_entropy.plain.none.target", &Cpu);
    let per: Tensor<(C<5>,), f64> = loss::cross_entropy(&x, &y, NoReduction);
    fx.check(&per, "cross_entropy.plain.none.out", TOL);
    // A `Dyn` target against a static input.
    let yd: Tensor<(Dyn,), i64> = y.into_dyn();
    let per: Tensor<(C<5>,), f64> = loss::cross_entropy(&x, &yd, NoReduction);
    fx.check(&per, "cross_entropy.plain.none.out", TOL);

    let x: Tensor<(C<4>, C<3>), f64> = fx.tensor("mse_loss.plain.sum.input", &Cpu);
    let y: Tensor<(Dyn, C<3>), f64> = fx.tensor("mse_loss.plain.sum.target", &Cpu);
    let l: Tensor<(), f64> = loss::mse_loss(&x, &y, Sum);
    fx.check(&l, "mse_loss.plain.sum.out", TOL);

    let x: Tensor<(C<3>, C<4>, C<5>), f64> = fx.tensor("cross_entropy.d1.none.input", &Cpu);
    let y: Tensor<(C<3>, C<5>), i64> = fx.tensor("cross_entropy.d1.none.target", &Cpu);
    let w: Tensor<(C<4>,), f64> = fx.tensor("cross_entropy.d1.none.weight", &Cpu);
    let per: Tensor<(C<3>, C<5>), f64> = CrossEntropyLoss::new()
        .weight(&w)
        .label_smoothing(0.1)
        .reduction(NoReduction)
        .forward(&x, &y);
    fx.check(&per, "cross_entropy.d1.none.out", TOL);
}

fn values(n: usize, lo: f64, hi: f64, seed: u64) -> Vec<f64> {
    let mut rng = Rng::seed_from(seed);
    (0..n).map(|_| lo + (hi - lo) * rng.uniform()).collect()
}

fn t2(v: Vec<f64>) -> Tensor<(Dyn, C<3>), f64> {
    let n = v.len() / 3;
    Tensor::from_vec(v, (Dyn(n), C)).unwrap()
}

#[test]
fn gradcheck_every_loss() {
    let opts = GradcheckOptions {
        eps: 1e-6,
        atol: 1e-7,
        rtol: 1e-6,
    };
    let x = t2(values(12, -2.0, 2.0, 1));
    let probs = t2(values(12, 0.05, 0.95, 2));
    let y = t2(values(12, 0.0, 1.0, 3));
    let idx = Tensor::<(Dyn,), i64>::from_vec(vec![0, 2, -100, 1], (Dyn(4),)).unwrap();
    let w = Tensor::<(C<3>,), f64>::from_vec(vec![0.5, 2.0, 1.25], (C,)).unwrap();
    let mut failures = Vec::new();
    let mut check = |name: &str,
                     at: &Tensor<(Dyn, C<3>), f64>,
                     f: &dyn Fn(&Tensor<(Dyn, C<3>), f64>) -> Tensor<(), f64>| {
        if let Err(e) = gradcheck(at, f, opts) {
            failures.push(format!("{name}: {e}"));
        }
    };
    let ce = CrossEntropyLoss::new().weight(&w).label_smoothing(0.2);
    check("cross_entropy", &x, &|x| ce.forward(x, &idx));
    check("cross_entropy_probs input", &x, &|x| {
        ce.forward_probs(x, &probs.softmax::<1>())
    });
    check("cross_entropy_probs target", &probs, &|p| {
        ce.forward_probs(&x, p)
    });
    check("nll_loss", &x, &|x| {
        NllLoss::new().weight(&w).forward(x, &idx)
    });
    check("mse_loss", &x, &|x| loss::mse_loss(x, &y, Mean));
    check("l1_loss", &x, &|x| loss::l1_loss(x, &y, Sum));
    check("smooth_l1_loss", &x, &|x| {
        loss::smooth_l1_loss(x, &y, 0.7, Sum)
    });
    check("huber_loss", &x, &|x| loss::huber_loss(x, &y, 0.7, Mean));
    let bce = BceLoss::new().weight(&w);
    check("binary_cross_entropy input", &probs, &|p| {
        bce.forward(p, &y)
    });
    check("binary_cross_entropy target", &y, &|t| {
        bce.forward(&probs, t)
    });
    let bcel = BceWithLogitsLoss::new().weight(&w).pos_weight(&w);
    check("bce_with_logits input", &x, &|x| bcel.forward(x, &y));
    check("bce_with_logits target", &y, &|t| bcel.forward(&x, t));
    let logp = x.log_softmax::<1>();
    check("kl_div input", &x, &|x| {
        loss::kl_div(&x.log_softmax::<1>(), &probs, BatchMean, false)
    });
    check("kl_div target", &probs, &|t| {
        loss::kl_div(&logp, t, Sum, false)
    });
    check("kl_div log_target", &x, &|t| {
        loss::kl_div(&logp, t, Mean, true)
    });
    assert!(
        failures.is_empty(),
        "gradcheck failed:\n{}",
        failures.join("\n")
    );
}

/// Gradients reach a parameter through the loss in a plain training step, and
/// a loss under `no_grad` records nothing.
#[test]
fn loss_drives_a_training_step() {
    let w = Tensor::<(C<3>, C<2>)>::from_vec(vec![0.1, -0.2, 0.3, 0.0, -0.1, 0.2], (C, C))
        .unwrap()
        .requires_grad();
    let x = Tensor::<(Dyn, C<3>)>::from_vec(vec![1., 2., 3., -1., 0.5, 2.], (Dyn(2), C)).unwrap();
    let y = Tensor::<(Dyn,), i64>::from_vec(vec![1, 0], (Dyn(2),)).unwrap();
    let l = loss::cross_entropy(&x.matmul(&w), &y, Mean);
    l.backward();
    let g = w.grad().expect("the weight gets a gradient");
    assert!(g.to_vec().iter().any(|v| v.abs() > 1e-3));
    let _guard = forma::core::tape::no_grad();
    let l = loss::binary_cross_entropy_with_logits(&x, &x.sigmoid(), Sum);
    assert!(!l.needs_grad());
}

mod errors {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    fn logits() -> Tensor<(Dyn, C<4>), f64> {
        Tensor::from_vec(values(12, -1.0, 1.0, 9), (Dyn(3), C)).unwrap()
    }

    fn classes(v: Vec<i64>) -> Tensor<(Dyn,), i64> {
        let n = v.len();
        Tensor::from_vec(v, (Dyn(n),)).unwrap()
    }

    #[test]
    fn class_index_out_of_range() {
        let x = logits();
        for (bad, ignore) in [(4, -100), (-1, -100), (7, 3), (-100, 0)] {
            let e = CrossEntropyLoss::new()
                .ignore_index(ignore)
                .try_forward(&x, &classes(vec![0, bad, 1]))
                .unwrap_err();
            assert_eq!(
                e,
                LossError::ClassOutOfRange {
                    op: "cross_entropy",
                    index: bad,
                    classes: 4,
                    ignore_index: ignore
                }
            );
        }
        let e = loss::try_nll_loss(&x, &classes(vec![0, 1, 9]), Sum).unwrap_err();
        assert!(matches!(
            e,
            LossError::ClassOutOfRange {
                op: "nll_loss",
                index: 9,
                ..
            }
        ));
        // ignore_index itself is fine, in or out of 0..C.
        assert!(loss::try_cross_entropy(&x, &classes(vec![0, -100, 3]), Mean).is_ok());
        let ok = CrossEntropyLoss::new()
            .ignore_index(-1)
            .try_forward(&x, &classes(vec![-1, 2, 3]));
        assert!(ok.is_ok());
        // The plain form panics with the same message.
        let msg = catch_unwind(AssertUnwindSafe(|| {
            loss::cross_entropy(&x, &classes(vec![0, 4, 1]), Mean)
        }))
        .unwrap_err();
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert_eq!(
            msg,
            "cross_entropy: target class 4 is out of range for 4 classes (ignore_index is -100)"
        );
    }

    #[test]
    fn dyn_sizes_are_checked_at_run_time() {
        let x = logits();
        let e = loss::try_cross_entropy(&x, &classes(vec![0, 1]), Mean).unwrap_err();
        assert_eq!(e.to_string(), "cross_entropy: expected shape [3], got [2]");
        let a = Tensor::<(Dyn, C<2>), f64>::zeros_with((Dyn(3), C));
        let b = Tensor::<(Dyn, C<2>), f64>::zeros_with((Dyn(4), C));
        let e = loss::try_mse_loss(&a, &b, Mean).unwrap_err();
        assert_eq!(e.to_string(), "mse_loss: expected shape [3, 2], got [4, 2]");
        let p = Tensor::<(Dyn, Dyn), f64>::zeros_with((Dyn(3), Dyn(3)));
        let e = loss::try_cross_entropy_probs(&x.into_dyn(), &p, Mean).unwrap_err();
        assert!(matches!(e, LossError::Core(_)), "{e}");
    }

    #[test]
    fn options_out_of_range() {
        let x = logits();
        let t = classes(vec![0, 1, 2]);
        // A static weight of 3 for 4 classes is a compile error
        // (ui-tests/tests/ui/loss/class_weight_length.rs); a `Dyn` one is
        // checked here.
        let w3 = Tensor::<(Dyn,), f64>::ones_with((Dyn(3),));
        let e = CrossEntropyLoss::new()
            .weight(&w3)
            .try_forward(&x, &t)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "cross_entropy: the class weight must have one value per class (4), but has 3"
        );
        for ls in [-0.1, 1.5, f64::NAN] {
            let e = CrossEntropyLoss::new()
                .label_smoothing(ls)
                .try_forward(&x, &t);
            assert!(matches!(e, Err(LossError::InvalidOption { .. })), "{ls}");
        }
        let p = x.softmax::<1>();
        let e = CrossEntropyLoss::new()
            .ignore_index(0)
            .try_forward_probs(&x, &p);
        assert!(matches!(e, Err(LossError::InvalidOption { .. })));
        assert!(loss::try_smooth_l1_loss(&x, &x, -1.0, Mean).is_err());
        assert!(loss::try_huber_loss(&x, &x, 0.0, Mean).is_err());
        let wbad = Tensor::<(C<3>,), f64>::ones();
        let e = BceWithLogitsLoss::new()
            .pos_weight(&wbad)
            .try_forward(&x, &x)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "binary_cross_entropy_with_logits: a weight of shape [3] does not broadcast to the input's shape [3, 4]"
        );
    }

    #[test]
    fn probabilities_outside_unit_interval() {
        let p = Tensor::<(C<3>,), f64>::from_vec(vec![0.5, 1.5, 0.2], (C,)).unwrap();
        let y = Tensor::<(C<3>,), f64>::from_vec(vec![0.0, 1.0, 1.0], (C,)).unwrap();
        let e = loss::try_binary_cross_entropy(&p, &y, Mean).unwrap_err();
        assert_eq!(
            e.to_string(),
            "binary_cross_entropy: every element of the input must be in [0, 1], but element 1 is 1.5"
        );
        let e = loss::try_binary_cross_entropy(&y, &p, Mean).unwrap_err();
        assert!(matches!(
            e,
            LossError::OutOfDomain {
                what: "target",
                index: 1,
                ..
            }
        ));
        let nan = Tensor::<(C<3>,), f64>::from_vec(vec![0.5, f64::NAN, 0.2], (C,)).unwrap();
        assert!(loss::try_binary_cross_entropy(&nan, &y, Mean).is_err());
    }
}
