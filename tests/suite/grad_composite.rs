//! Gradients of whole models against PyTorch
//! (`tools/fixtures/grad_composite.safetensors`, written by
//! `tools/gen_grad_fixtures.py`), in float64:
//!
//! - `mlp`: an 8-16-4 MLP with ReLU and cross-entropy over class indices
//!   (written out as `-(log_softmax(logits) gathered at the target).mean()`,
//!   as the nn crate does not exist yet; PyTorch uses `F.cross_entropy`);
//! - `attn`: single-head attention `softmax(q k^T / sqrt(d)) v` with q, k, v
//!   linear projections (with bias) of one input, batched.
//!
//! The forward values and the gradient of every input and parameter for a
//! fixed upstream gradient (`try_backward_with`) must match within
//! rtol 1e-10 / atol 1e-12. Each model is also gradchecked (f64 central
//! differences) with respect to every input, and the MLP's gradients must
//! accumulate over two backward passes and clear with `zero_grad`.

use crate::common;

use common::{Fixture, Tol};
use forma::core::shape::{op, Broadcasts};
use forma::core::tape::{gradcheck, GradcheckOptions};
use forma::prelude::*;

type T<S> = Tensor<S, f64>;

/// f64 against PyTorch: the same math in another summation order.
const TOL: Tol = Tol {
    rtol: 1e-10,
    atol: 1e-12,
};

const OPTS: GradcheckOptions = GradcheckOptions {
    eps: 1e-6,
    atol: 1e-7,
    rtol: 1e-6,
};

fn load() -> Fixture {
    let fx = Fixture::load("grad_composite");
    let meta = fx.metadata();
    assert_eq!(
        meta.get("generator").map(String::as_str),
        Some("tools/gen_grad_fixtures.py")
    );
    assert!(
        meta.get("torch").is_some_and(|v| v.starts_with('2')),
        "missing torch version: {meta:?}"
    );
    fx
}

/// Collects comparison failures and reports them together.
#[derive(Default)]
struct Report(Vec<String>);

impl Report {
    fn value<S: Shape>(&mut self, fx: &Fixture, t: &T<S>, key: &str) {
        if let Err(e) = fx.compare(t, key, TOL) {
            self.0.push(format!("{key}: {e}"));
        }
    }

    fn grad<S: Shape>(&mut self, fx: &Fixture, t: &T<S>, key: &str) {
        match t.grad() {
            None => self.0.push(format!("{key}: no gradient reached it")),
            Some(g) => self.value(fx, &g, key),
        }
    }

    fn gradcheck<S: Shape>(&mut self, label: &str, x: &T<S>, f: impl Fn(&T<S>) -> T<()>) {
        if let Err(e) = gradcheck(x, f, OPTS) {
            self.0.push(format!("gradcheck {label}: {e}"));
        }
    }

    #[track_caller]
    fn finish(self) {
        assert!(
            self.0.is_empty(),
            "{} failures:\n- {}",
            self.0.len(),
            self.0.join("\n- ")
        );
    }
}

/// `(y * w).sum_all()` with fixed, non-uniform weights: a scalar for gradcheck.
fn wsum<S: Shape + Broadcasts<S, op::mul>>(y: &T<S>) -> T<()> {
    let w: Vec<f64> = (0..y.numel())
        .map(|i| ((i * 7919) % 23) as f64 / 11.0 - 1.0)
        .collect();
    (y * &T::<S>::from_vec(w, y.shape()).unwrap()).sum_all()
}

// ================================================================== MLP

type X = (C<6>, C<8>);
type W1 = (C<16>, C<8>);
type B1 = (C<16>,);
type W2 = (C<4>, C<16>);
type B2 = (C<4>,);

struct Mlp {
    x: T<X>,
    w1: T<W1>,
    b1: T<B1>,
    w2: T<W2>,
    b2: T<B2>,
    /// Class indices as a `[6, 1]` gather index.
    target: Tensor<(C<6>, One), i64>,
}

impl Mlp {
    /// The fixture's inputs and parameters, each a leaf.
    fn load(fx: &Fixture) -> Self {
        let target: Tensor<(C<6>,), i64> = fx.tensor("mlp.target", &Cpu);
        Mlp {
            x: fx.tensor::<X, f64, Cpu>("mlp.x", &Cpu).requires_grad(),
            w1: fx.tensor::<W1, f64, Cpu>("mlp.w1", &Cpu).requires_grad(),
            b1: fx.tensor::<B1, f64, Cpu>("mlp.b1", &Cpu).requires_grad(),
            w2: fx.tensor::<W2, f64, Cpu>("mlp.w2", &Cpu).requires_grad(),
            b2: fx.tensor::<B2, f64, Cpu>("mlp.b2", &Cpu).requires_grad(),
            target: target.unsqueeze::<1>(),
        }
    }
}

/// `logits = relu(x w1^T + b1) w2^T + b2` and the mean cross-entropy.
fn mlp(
    x: &T<X>,
    w1: &T<W1>,
    b1: &T<B1>,
    w2: &T<W2>,
    b2: &T<B2>,
    target: &Tensor<(C<6>, One), i64>,
) -> (T<(C<6>, C<4>)>, T<()>) {
    let h = (x.matmul(&w1.t()) + b1).relu();
    let logits = h.matmul(&w2.t()) + b2;
    let picked = logits.log_softmax::<1>().gather::<1, _>(target);
    let loss = -picked.mean_all();
    (logits, loss)
}

impl Mlp {
    fn forward(&self) -> (T<(C<6>, C<4>)>, T<()>) {
        mlp(
            &self.x,
            &self.w1,
            &self.b1,
            &self.w2,
            &self.b2,
            &self.target,
        )
    }

    fn check_grads(&self, fx: &Fixture, r: &mut Report, scale: f64) {
        let g = |t: &dyn Fn() -> Option<Vec<f64>>, key: &str, r: &mut Report| {
            let want = fx.f64(key).0.iter().map(|v| v * scale).collect::<Vec<_>>();
            match t() {
                None => r.0.push(format!("{key}: no gradient reached it")),
                Some(have) => {
                    if let Err(e) = common::close(&have, &want, TOL) {
                        r.0.push(format!("{key} (x{scale}): {e}"));
                    }
                }
            }
        };
        g(&|| self.x.grad().map(|t| t.to_vec()), "mlp.grad.x", r);
        g(&|| self.w1.grad().map(|t| t.to_vec()), "mlp.grad.w1", r);
        g(&|| self.b1.grad().map(|t| t.to_vec()), "mlp.grad.b1", r);
        g(&|| self.w2.grad().map(|t| t.to_vec()), "mlp.grad.w2", r);
        g(&|| self.b2.grad().map(|t| t.to_vec()), "mlp.grad.b2", r);
    }
}

#[test]
fn mlp_cross_entropy_matches_pytorch() {
    let fx = load();
    let m = Mlp::load(&fx);
    let (logits, loss) = m.forward();
    let mut r = Report::default();
    r.value(&fx, &logits, "mlp.logits");
    r.value(&fx, &loss, "mlp.loss");
    let gout: T<()> = fx.tensor("mlp.gout", &Cpu);
    loss.try_backward_with(&gout).unwrap();
    r.grad(&fx, &m.x, "mlp.grad.x");
    r.grad(&fx, &m.w1, "mlp.grad.w1");
    r.grad(&fx, &m.b1, "mlp.grad.b1");
    r.grad(&fx, &m.w2, "mlp.grad.w2");
    r.grad(&fx, &m.b2, "mlp.grad.b2");
    r.finish();
}

/// `loss.backward()` (upstream 1) twice accumulates twice the gradient of
/// upstream 1; `zero_grad` clears it.
#[test]
fn mlp_gradients_accumulate_and_clear() {
    let fx = load();
    let m = Mlp::load(&fx);
    let gout = fx.f64("mlp.gout").0[0];
    let mut r = Report::default();
    m.forward().1.backward();
    m.check_grads(&fx, &mut r, 1.0 / gout);
    m.forward().1.backward();
    m.check_grads(&fx, &mut r, 2.0 / gout);
    for (name, p) in [("x", m.x.grad().is_some()), ("w1", m.w1.grad().is_some())] {
        assert!(p, "{name} lost its gradient");
    }
    m.x.zero_grad();
    m.w1.zero_grad();
    m.b1.zero_grad();
    m.w2.zero_grad();
    m.b2.zero_grad();
    assert!(m.x.grad().is_none() && m.w1.grad().is_none() && m.b2.grad().is_none());
    m.forward().1.backward();
    m.check_grads(&fx, &mut r, 1.0 / gout);
    r.finish();
}

#[test]
fn mlp_gradcheck() {
    let fx = load();
    let m = Mlp::load(&fx);
    let (x, w1, b1, w2, b2, t) = (
        m.x.detach(),
        m.w1.detach(),
        m.b1.detach(),
        m.w2.detach(),
        m.b2.detach(),
        &m.target,
    );
    let mut r = Report::default();
    r.gradcheck("mlp d/dx", &x, |x| mlp(x, &w1, &b1, &w2, &b2, t).1);
    r.gradcheck("mlp d/dw1", &w1, |w1| mlp(&x, w1, &b1, &w2, &b2, t).1);
    r.gradcheck("mlp d/db1", &b1, |b1| mlp(&x, &w1, b1, &w2, &b2, t).1);
    r.gradcheck("mlp d/dw2", &w2, |w2| mlp(&x, &w1, &b1, w2, &b2, t).1);
    r.gradcheck("mlp d/db2", &b2, |b2| mlp(&x, &w1, &b1, &w2, b2, t).1);
    r.finish();
}

// ================================================================== attention

type AX = (C<2>, C<5>, C<8>);
type AW = (C<6>, C<8>);
type AB = (C<6>,);
type AOut = (C<2>, C<5>, C<6>);

/// `softmax(q k^T / sqrt(6)) v` with `q = x wq^T + bq` (and so on); returns
/// the attention weights and the output.
fn attention(x: &T<AX>, p: [&T<AW>; 3], b: [&T<AB>; 3]) -> (T<(C<2>, C<5>, C<5>)>, T<AOut>) {
    let q = x.matmul(&p[0].t()) + b[0];
    let k = x.matmul(&p[1].t()) + b[1];
    let v = x.matmul(&p[2].t()) + b[2];
    let scores = q.matmul(&k.transpose::<1, 2>()).div_scalar(6f64.sqrt());
    let att = scores.softmax::<2>();
    let out = att.matmul(&v);
    (att, out)
}

struct Attn {
    x: T<AX>,
    w: [T<AW>; 3],
    b: [T<AB>; 3],
}

const QKV: [&str; 3] = ["q", "k", "v"];

impl Attn {
    fn load(fx: &Fixture) -> Self {
        let w = QKV.map(|n| {
            fx.tensor::<AW, f64, Cpu>(&format!("attn.w{n}"), &Cpu)
                .requires_grad()
        });
        let b = QKV.map(|n| {
            fx.tensor::<AB, f64, Cpu>(&format!("attn.b{n}"), &Cpu)
                .requires_grad()
        });
        Attn {
            x: fx.tensor::<AX, f64, Cpu>("attn.x", &Cpu).requires_grad(),
            w,
            b,
        }
    }

    fn forward(&self) -> (T<(C<2>, C<5>, C<5>)>, T<AOut>) {
        attention(
            &self.x,
            [&self.w[0], &self.w[1], &self.w[2]],
            [&self.b[0], &self.b[1], &self.b[2]],
        )
    }
}

#[test]
fn attention_matches_pytorch() {
    let fx = load();
    let a = Attn::load(&fx);
    let (att, out) = a.forward();
    let mut r = Report::default();
    r.value(&fx, &att, "attn.att");
    r.value(&fx, &out, "attn.out");
    let gout: T<AOut> = fx.tensor("attn.gout", &Cpu);
    out.try_backward_with(&gout).unwrap();
    // x feeds q, k and v: its gradient sums three paths.
    r.grad(&fx, &a.x, "attn.grad.x");
    for (i, n) in QKV.iter().enumerate() {
        r.grad(&fx, &a.w[i], &format!("attn.grad.w{n}"));
        r.grad(&fx, &a.b[i], &format!("attn.grad.b{n}"));
    }
    r.finish();
}

#[test]
fn attention_gradcheck() {
    let fx = load();
    let a = Attn::load(&fx);
    let x = a.x.detach();
    let w = a.w.each_ref().map(|t| t.detach());
    let b = a.b.each_ref().map(|t| t.detach());
    let mut r = Report::default();
    r.gradcheck("attention d/dx", &x, |x| {
        wsum(&attention(x, [&w[0], &w[1], &w[2]], [&b[0], &b[1], &b[2]]).1)
    });
    for i in 0..3 {
        let with_w = |wi: &T<AW>| {
            let mut ws = [&w[0], &w[1], &w[2]];
            ws[i] = wi;
            wsum(&attention(&x, ws, [&b[0], &b[1], &b[2]]).1)
        };
        r.gradcheck(&format!("attention d/dw{}", QKV[i]), &w[i], with_w);
        let with_b = |bi: &T<AB>| {
            let mut bs = [&b[0], &b[1], &b[2]];
            bs[i] = bi;
            wsum(&attention(&x, [&w[0], &w[1], &w[2]], bs).1)
        };
        r.gradcheck(&format!("attention d/db{}", QKV[i]), &b[i], with_b);
    }
    r.finish();
}
