//! Gradients of every differentiable op, two ways:
//!
//! 1. `gradcheck_*`: the tape's gradient against f64 central differences
//!    ([`gradcheck`], step 1e-6, `|analytic - numeric| <= 1e-7 + 1e-6 |numeric|`).
//!    Inputs avoid kinks (relu/abs/leaky_relu away from 0, no ties for
//!    max/min/maximum/minimum, clamp away from its bounds, log/sqrt/pow on
//!    positive values). A non-scalar output is reduced with a weighted sum
//!    `(y * w).sum_all()` (fixed, non-uniform `w`), so a gradient that is
//!    permuted or mis-broadcast does not pass by symmetry. [`gradcheck`] takes
//!    one input, so a multi-input op is checked once per input, closing over
//!    the others.
//! 2. `fixture::*`: the tape's gradients against PyTorch's
//!    (`tools/fixtures/grad_ops.safetensors`, written by
//!    `tools/gen_grad_fixtures.py`): the same forward on the same float64
//!    inputs, `try_backward_with` a fixed random upstream gradient, and every
//!    input's `.grad()` compared with `torch.autograd.grad` within
//!    rtol 1e-10 / atol 1e-12. These also pin PyTorch's conventions at kinks
//!    (relu/abs/clamp at their kinks, ties of maximum/minimum and of max/min
//!    reductions, pow at a zero base, prod with zeros). Every case of the file
//!    must be checked. `fixture::strided_upstream_gradient` repeats the 2-d
//!    cases with a non-contiguous upstream gradient.
//!
//! Plus `semantics::*`: a gradient cannot pass silently through a
//! non-differentiable op (comparisons/argmax make bool/i64 tensors off the
//! tape; `to_dtype` on the tape panics telling to `detach()`; conv/pool either
//! record or refuse), and `harness::*`: both checkers do catch a wrong
//! gradient.
//!
//! Each test collects every failing sub-check and reports them together.
//! conv2d/conv1d/max_pool2d/avg_pool2d (and `add_channel_bias`) have no
//! backward yet: their tests fail until it lands, by design.

use crate::common;

use common::{Fixture, FixtureElem, Tol};
use forma::core::ops::conv::add_channel_bias;
use forma::core::shape::{op, Broadcasts, ConstShape};
use forma::core::tape::{gradcheck, GradcheckOptions};
use forma::prelude::*;
use forma::Dim;
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

type T<S> = Tensor<S, f64>;
type I<S> = Tensor<S, i64>;
type B<S> = Tensor<S, bool>;

// ================================================================== inputs

/// SplitMix64: deterministic values without a dependency.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed from a label (FNV-1a), so each check draws its own values.
fn seed(label: &str) -> u64 {
    label.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Where a check's inputs are drawn from.
#[derive(Clone, Copy, Debug)]
enum Dom {
    /// Uniform in `[lo, hi)`.
    U(f64, f64),
    /// Magnitude uniform in `[lo, hi)`, random sign: away from 0.
    Nz(f64, f64),
    /// `offset + 0.2 k` for integer `k` in `[-15, 15)`: grids with offsets 0
    /// and 0.1 never tie (maximum/minimum), even after broadcasting.
    Grid(f64),
    /// A shuffled arithmetic sequence (step 0.13): no two elements tie.
    Distinct,
}

const ANY: Dom = Dom::U(-2.0, 2.0);
const POS: Dom = Dom::U(0.2, 3.0);

fn data(n: usize, seed: u64, dom: Dom) -> Vec<f64> {
    let mut s = seed;
    let mut unit = move || (splitmix(&mut s) >> 11) as f64 / (1u64 << 53) as f64;
    match dom {
        Dom::U(lo, hi) => (0..n).map(|_| lo + (hi - lo) * unit()).collect(),
        Dom::Nz(lo, hi) => (0..n)
            .map(|_| {
                let m = lo + (hi - lo) * unit();
                if unit() < 0.5 {
                    -m
                } else {
                    m
                }
            })
            .collect(),
        Dom::Grid(offset) => (0..n)
            .map(|_| offset + 0.2 * ((unit() * 30.0).floor() - 15.0))
            .collect(),
        Dom::Distinct => {
            let mut v: Vec<f64> = (0..n)
                .map(|i| (i as f64 - n as f64 / 2.0) * 0.13 + 0.01)
                .collect();
            for i in (1..n).rev() {
                let j = (unit() * (i + 1) as f64) as usize;
                v.swap(i, j.min(i));
            }
            v
        }
    }
}

/// A tensor of a runtime `shape` drawn from `dom`.
fn rand_t<S: Shape>(shape: S, seed: u64, dom: Dom) -> T<S> {
    Tensor::from_vec(data(shape.numel(), seed, dom), shape).unwrap()
}

/// A tensor of a static shape drawn from `dom`.
fn rt<S: ConstShape>(seed: u64, dom: Dom) -> T<S> {
    rand_t(S::VALUE, seed, dom)
}

/// `(y * w).sum_all()` with fixed, non-uniform weights of `y`'s sizes.
fn wsum<S: Shape + Broadcasts<S, op::mul>>(y: &T<S>) -> T<()> {
    let w = T::<S>::from_vec(data(y.numel(), 0x5EED, ANY), y.shape()).unwrap();
    (y * &w).sum_all()
}

// ================================================================== gradcheck

const OPTS: GradcheckOptions = GradcheckOptions {
    eps: 1e-6,
    atol: 1e-7,
    rtol: 1e-6,
};

fn panic_msg(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "<non-string panic>".into())
}

/// Runs gradchecks and reports every failing one at the end.
#[derive(Default)]
struct Gc {
    failures: Vec<String>,
    passed: usize,
}

impl Gc {
    fn check<S: Shape>(&mut self, label: &str, x: &T<S>, f: impl Fn(&T<S>) -> T<()>) {
        match catch_unwind(AssertUnwindSafe(|| gradcheck(x, &f, OPTS))) {
            Ok(Ok(())) => self.passed += 1,
            Ok(Err(e)) => self.failures.push(format!("{label}: {e}")),
            Err(p) => self
                .failures
                .push(format!("{label}: panicked: {}", panic_msg(&*p))),
        }
    }

    #[track_caller]
    fn finish(self) {
        if !self.failures.is_empty() {
            panic!(
                "{} of {} gradchecks failed:\n- {}",
                self.failures.len(),
                self.failures.len() + self.passed,
                self.failures.join("\n- ")
            );
        }
    }
}

/// Checks a two-operand `f` with respect to each operand (random inputs
/// drawn from `ANY`, seeded by `label`).
fn both<Sa: ConstShape, Sb: ConstShape, So: Shape + Broadcasts<So, op::mul>>(
    g: &mut Gc,
    label: &str,
    f: impl Fn(&T<Sa>, &T<Sb>) -> T<So>,
) {
    let a = rt::<Sa>(seed(label), ANY);
    let b = rt::<Sb>(seed(label) + 1, ANY);
    g.check(&format!("{label}, d/da"), &a, |a| wsum(&f(a, &b)));
    g.check(&format!("{label}, d/db"), &b, |b| wsum(&f(&a, b)));
}

type M34 = (C<3>, C<4>);
type R3 = (C<2>, C<3>, C<4>);

/// One test per unary op: a `[3, 4]` input, and the same op on a transposed
/// (non-contiguous) view.
macro_rules! unary_gradchecks {
    ($($name:ident: $dom:expr => |$x:ident| $body:expr;)*) => {$(
        #[test]
        fn $name() {
            let mut g = Gc::default();
            let x = rt::<M34>(seed(stringify!($name)), $dom);
            g.check("[3, 4]", &x, |$x| wsum(&$body));
            let xt = rt::<(C<4>, C<3>)>(seed(concat!(stringify!($name), "t")), $dom);
            g.check("transposed view", &xt, |xt| { let $x = &xt.t(); wsum(&$body) });
            g.finish();
        }
    )*};
}

mod gradcheck_unary {
    use super::*;

    unary_gradchecks! {
        neg: ANY => |x| x.neg();
        exp: ANY => |x| x.exp();
        log: POS => |x| x.log();
        log1p: Dom::U(-0.8, 3.0) => |x| x.log1p();
        sqrt: POS => |x| x.sqrt();
        rsqrt: POS => |x| x.rsqrt();
        recip: Dom::Nz(0.2, 2.0) => |x| x.recip();
        square: ANY => |x| x.square();
        abs: Dom::Nz(0.2, 2.0) => |x| x.abs();
        sin: ANY => |x| x.sin();
        cos: ANY => |x| x.cos();
        tanh: ANY => |x| x.tanh();
        sigmoid: ANY => |x| x.sigmoid();
        relu: Dom::Nz(0.2, 2.0) => |x| x.relu();
        gelu: ANY => |x| x.gelu();
        gelu_tanh: ANY => |x| x.gelu_tanh();
        silu: ANY => |x| x.silu();
        hardswish: ANY => |x| x.hardswish();
        leaky_relu: Dom::Nz(0.2, 2.0) => |x| x.leaky_relu(0.2);
        leaky_relu_default: Dom::Nz(0.2, 2.0) => |x| x.leaky_relu(0.01);
        pow_scalar: POS => |x| x.pow_scalar(2.5);
        pow_scalar_int: ANY => |x| x.pow_scalar(3.0);
        pow_scalar_neg: POS => |x| x.pow_scalar(-1.5);
        add_scalar: ANY => |x| x.add_scalar(1.5);
        mul_scalar: ANY => |x| x.mul_scalar(-2.5);
        div_scalar: ANY => |x| x.div_scalar(3.0);
        // Values within 0.05 of a bound are moved off it below.
        clamp: ANY => |x| x.clamp(-0.5, 0.75);
        clamp_min: ANY => |x| x.clamp_min(-0.5);
        clamp_max: ANY => |x| x.clamp_max(0.75);
        // The `std::ops` forms (`-x`, `x + s`, `x - s`, `x * s`, `x / s`).
        scalar_operators: ANY => |x| ((-x) + 1.5) * 2.0 - x / 4.0 - 0.5;
    }

    /// Clamp inputs away from the bounds (the generic draw might land near one).
    #[test]
    fn clamp_inputs_are_away_from_bounds() {
        let mut g = Gc::default();
        let v: Vec<f64> = data(12, 7, Dom::U(-2.0, 2.0))
            .into_iter()
            .map(|x| {
                if (x + 0.5).abs() < 0.05 || (x - 0.75).abs() < 0.05 {
                    x + 0.2
                } else {
                    x
                }
            })
            .collect();
        let x = T::<M34>::from_vec(v, (C, C)).unwrap();
        g.check("clamp(-0.5, 0.75)", &x, |x| wsum(&x.clamp(-0.5, 0.75)));
        g.check("clamp(-1, 1)", &x, |x| wsum(&x.clamp(-1.0, 1.0)));
        g.finish();
    }
}

/// One test per binary op: same sizes, `[2, 3] op [3]`, `[2, 3] op [2, 1]`
/// (a `One` dim), the outer broadcast `[3, 1] op [4]` and `[2, 1, 4] op [3, 1]`
/// (both operands stretched); each checked with respect to both operands.
macro_rules! binary_gradchecks {
    ($($op:ident: $da:expr, $db:expr;)*) => {$(
        #[test]
        fn $op() {
            let mut g = Gc::default();
            let s = seed(stringify!($op));
            {
                let a = rt::<M34>(s, $da);
                let b = rt::<M34>(s + 1, $db);
                g.check("same sizes, d/da", &a, |a| wsum(&a.$op(&b)));
                g.check("same sizes, d/db", &b, |b| wsum(&a.$op(b)));
            }
            {
                let a = rt::<(C<2>, C<3>)>(s + 2, $da);
                let b = rt::<(C<3>,)>(s + 3, $db);
                g.check("[2, 3] op [3], d/da", &a, |a| wsum(&a.$op(&b)));
                g.check("[2, 3] op [3], d/db", &b, |b| wsum(&a.$op(b)));
            }
            {
                let a = rt::<(C<2>, C<3>)>(s + 4, $da);
                let b = rt::<(C<2>, One)>(s + 5, $db);
                g.check("[2, 3] op [2, One], d/da", &a, |a| wsum(&a.$op(&b)));
                g.check("[2, 3] op [2, One], d/db", &b, |b| wsum(&a.$op(b)));
            }
            {
                let a = rt::<(C<3>, One)>(s + 6, $da);
                let b = rt::<(C<4>,)>(s + 7, $db);
                g.check("[3, One] op [4], d/da", &a, |a| wsum(&a.$op(&b)));
                g.check("[3, One] op [4], d/db", &b, |b| wsum(&a.$op(b)));
            }
            {
                let a = rt::<(C<2>, One, C<4>)>(s + 10, $da);
                let b = rt::<(C<3>, One)>(s + 11, $db);
                g.check("[2, One, 4] op [3, One], d/da", &a, |a| wsum(&a.$op(&b)));
                g.check("[2, One, 4] op [3, One], d/db", &b, |b| wsum(&a.$op(b)));
            }
            {
                // A transposed (non-contiguous) left operand.
                let a = rt::<(C<4>, C<3>)>(s + 8, $da);
                let b = rt::<M34>(s + 9, $db);
                g.check("a.t() op b, d/da", &a, |a| wsum(&a.t().$op(&b)));
            }
            g.finish();
        }
    )*};
}

mod gradcheck_binary {
    use super::*;

    binary_gradchecks! {
        add: ANY, ANY;
        sub: ANY, ANY;
        mul: ANY, ANY;
        div: ANY, Dom::Nz(0.5, 2.0);
        pow: Dom::U(0.3, 2.5), ANY;
        maximum: Dom::Grid(0.0), Dom::Grid(0.1);
        minimum: Dom::Grid(0.0), Dom::Grid(0.1);
        fmax: Dom::Grid(0.0), Dom::Grid(0.1);
        fmin: Dom::Grid(0.0), Dom::Grid(0.1);
    }

    /// The `std::ops` operators on tensors (`&a + &b`, owned forms).
    #[test]
    fn operators() {
        let mut g = Gc::default();
        let a = rt::<(C<2>, C<3>)>(1, ANY);
        let b = rt::<(C<3>,)>(2, Dom::Nz(0.5, 2.0));
        g.check("(a + b) * (a - b) / b, d/da", &a, |a| {
            wsum(&((a + &b) * (a - &b) / &b))
        });
        g.check("(a + b) * (a - b) / b, d/db", &b, |b| {
            wsum(&((&a + b) * (&a - b) / b))
        });
        g.finish();
    }
}

/// One test per reduction over a `[2, 3, 4]` input: each axis, keepdim,
/// keepdim broadcast back against the input, `_all`, and along an axis of a
/// transposed view.
macro_rules! reduce_gradchecks {
    ($($op:ident, $keep:ident, $all:ident: $dom:expr;)*) => {$(
        #[test]
        fn $op() {
            let mut g = Gc::default();
            let x = rt::<R3>(seed(stringify!($op)), $dom);
            g.check("axis 0", &x, |x| wsum(&x.$op::<0>()));
            g.check("axis 1", &x, |x| wsum(&x.$op::<1>()));
            g.check("axis 2", &x, |x| wsum(&x.$op::<2>()));
            g.check("keepdim axis 1", &x, |x| wsum(&x.$keep::<1>()));
            g.check("x * keepdim axis 2 (One broadcast, x used twice)", &x, |x| wsum(&(x * &x.$keep::<2>())));
            g.check("all", &x, |x| x.$all().mul_scalar(1.3));
            g.check("all of a transposed view", &x, |x| x.transpose::<0, 2>().$all());
            g.check("axis 1 of a transposed view", &x, |x| wsum(&x.transpose::<0, 2>().$op::<1>()));
            g.finish();
        }
    )*};
}

mod gradcheck_reduce {
    use super::*;

    reduce_gradchecks! {
        sum, sum_keepdim, sum_all: ANY;
        mean, mean_keepdim, mean_all: ANY;
        max, max_keepdim, max_all: Dom::Distinct;
        min, min_keepdim, min_all: Dom::Distinct;
        prod, prod_keepdim, prod_all: Dom::Nz(0.5, 1.5);
        logsumexp, logsumexp_keepdim, logsumexp_all: ANY;
    }

    /// Products are multilinear, so finite differences are exact even at zeros.
    #[test]
    fn prod_with_zeros() {
        let mut g = Gc::default();
        let mut v = data(24, 3, Dom::Nz(0.5, 1.5));
        v[1] = 0.0; // one zero in lane [0, 0, :]
        v[20] = 0.0; // two zeros in lane [1, 2, :]
        v[23] = 0.0;
        let x = T::<R3>::from_vec(v, (C, C, C)).unwrap();
        g.check("prod axis 2 with zeros", &x, |x| wsum(&x.prod::<2>()));
        let mut v = data(6, 4, Dom::Nz(0.5, 1.5));
        v[4] = 0.0;
        let y = T::<(C<2>, C<3>)>::from_vec(v, (C, C)).unwrap();
        g.check("prod_all with one zero", &y, |y| y.prod_all());
        g.finish();
    }

    #[test]
    fn var() {
        let mut g = Gc::default();
        let x = rt::<R3>(seed("var"), ANY);
        g.check("axis 1 unbiased", &x, |x| wsum(&x.var::<1>(true)));
        g.check("axis 0 biased", &x, |x| wsum(&x.var::<0>(false)));
        g.check("keepdim axis 2 unbiased", &x, |x| {
            wsum(&x.var_keepdim::<2>(true))
        });
        g.check("all unbiased", &x, |x| x.var_all(true));
        g.check("all biased", &x, |x| x.var_all(false));
        g.finish();
    }

    #[test]
    fn std() {
        let mut g = Gc::default();
        let x = rt::<R3>(seed("std"), ANY);
        g.check("axis 1 unbiased", &x, |x| wsum(&x.std::<1>(true)));
        g.check("axis 0 biased", &x, |x| wsum(&x.std::<0>(false)));
        g.check("keepdim axis 2 unbiased", &x, |x| {
            wsum(&x.std_keepdim::<2>(true))
        });
        g.check("all unbiased", &x, |x| x.std_all(true));
        g.check("all biased", &x, |x| x.std_all(false));
        g.finish();
    }
}

mod gradcheck_fused_forward {
    //! layer_norm and linear run their fused kernels with the tape on; their
    //! recorded backwards against finite differences, for every operand.
    use super::*;

    #[test]
    fn layer_norm() {
        let mut g = Gc::default();
        let x = rt::<R3>(seed("layer_norm"), Dom::U(-3.0, 3.0));
        let w = rt::<(C<4>,)>(seed("layer_norm w"), Dom::U(0.5, 2.0)).into_dyn();
        let b = rt::<(C<4>,)>(seed("layer_norm b"), Dom::U(-1.0, 1.0)).into_dyn();
        g.check("x", &x, |x| wsum(&x.layer_norm(Some(&w), Some(&b), 1e-5)));
        g.check("x, no affine", &x, |x| {
            wsum(&x.layer_norm(None, None, 1e-5))
        });
        g.check("x, a transposed view", &x, |x| {
            wsum(&x.transpose::<1, 2>().layer_norm(None, None, 1e-5))
        });
        g.check("weight", &w, |w| {
            wsum(&x.layer_norm(Some(w), Some(&b), 1e-5))
        });
        g.check("bias", &b, |b| wsum(&x.layer_norm(Some(&w), Some(b), 1e-5)));
        g.finish();
    }

    /// Training-mode batch norm, one node with its own backward: input
    /// `[2, 3, 4]` (3 channels), also as a transposed view, with and
    /// without the affine parameters.
    #[test]
    fn batch_norm_train() {
        let mut g = Gc::default();
        let x = rt::<R3>(seed("batch_norm"), Dom::U(-3.0, 3.0));
        let w = rt::<(C<3>,)>(seed("batch_norm w"), Dom::U(0.5, 2.0)).into_dyn();
        let b = rt::<(C<3>,)>(seed("batch_norm b"), Dom::U(-1.0, 1.0)).into_dyn();
        let bn = |x: &T<(Dyn, Dyn, Dyn)>, w: Option<&T<(Dyn,)>>, b: Option<&T<(Dyn,)>>| {
            x.try_batch_norm_train(w, b, 1e-5).unwrap().out
        };
        g.check("x", &x, |x| wsum(&bn(&x.into_dyn(), Some(&w), Some(&b))));
        g.check("x, no affine", &x, |x| wsum(&bn(&x.into_dyn(), None, None)));
        g.check("x, weight only", &x, |x| {
            wsum(&bn(&x.into_dyn(), Some(&w), None))
        });
        let xt = rt::<(C<4>, C<3>, C<2>)>(seed("batch_norm t"), Dom::U(-3.0, 3.0));
        g.check("x, a transposed view", &xt, |x| {
            wsum(&bn(&x.transpose::<0, 2>().into_dyn(), Some(&w), None))
        });
        g.check("weight", &w, |w| {
            wsum(&bn(&x.into_dyn(), Some(w), Some(&b)))
        });
        g.check("bias", &b, |b| wsum(&bn(&x.into_dyn(), Some(&w), Some(b))));
        g.finish();
    }

    /// A recurrent layer's loop as one op (`try_rnn_layer`), LSTM and GRU,
    /// forward and reverse: every operand, batch 2, 3 steps, hidden 2, the
    /// CPU's fused cells and the composed ones (CUDA's).
    #[test]
    fn rnn_layer() {
        use forma::core::ops::rnn::{with_composed_cells, RnnMode};
        type T2 = T<(Dyn, Dyn)>;
        let mut g = Gc::default();
        let d2 = |r: usize, c: usize, s: &str| rand_t((Dyn(r), Dyn(c)), seed(s), Dom::U(-1.0, 1.0));
        let (h0, c0) = (d2(2, 2, "rnn h0"), d2(2, 2, "rnn c0"));
        for (mode, gates) in [
            (RnnMode::LongShortTermMemory, 4),
            (RnnMode::GatedRecurrentUnit, 3),
        ] {
            let xp = rand_t(
                (Dyn(2), Dyn(3), Dyn(gates * 2)),
                seed("rnn xp"),
                Dom::U(-2.0, 2.0),
            );
            let w = d2(gates * 2, 2, "rnn w");
            let b = rand_t((Dyn(gates * 2),), seed("rnn b"), Dom::U(-1.0, 1.0));
            let c0 = (mode == RnnMode::LongShortTermMemory).then_some(&c0);
            for reverse in [false, true] {
                let run =
                    |xp: &T<(Dyn, Dyn, Dyn)>, w: &T2, b: &T<(Dyn,)>, h0: &T2, c0: Option<&T2>| {
                        wsum(&xp.try_rnn_layer(mode, w, Some(b), h0, c0, reverse).unwrap())
                    };
                let l = format!("{mode:?} reverse={reverse}");
                let checks = |g: &mut Gc, l: &str| {
                    g.check(&format!("{l}: xp"), &xp, |x| run(x, &w, &b, &h0, c0));
                    g.check(&format!("{l}: w_hh"), &w, |w| run(&xp, w, &b, &h0, c0));
                    g.check(&format!("{l}: b_hh"), &b, |b| run(&xp, &w, b, &h0, c0));
                    g.check(&format!("{l}: h0"), &h0, |h| run(&xp, &w, &b, h, c0));
                    if let Some(c0) = c0 {
                        g.check(&format!("{l}: c0"), c0, |c| run(&xp, &w, &b, &h0, Some(c)));
                    }
                };
                checks(&mut g, &l);
                with_composed_cells(|| checks(&mut g, &format!("{l} composed")));
            }
        }
        g.finish();
    }

    #[test]
    fn linear() {
        let mut g = Gc::default();
        let x = rt::<R3>(seed("linear"), Dom::U(-3.0, 3.0));
        let w = rt::<(C<5>, C<4>)>(seed("linear w"), Dom::U(-1.0, 1.0));
        let b = rt::<(C<5>,)>(seed("linear b"), Dom::U(-1.0, 1.0));
        g.check("x", &x, |x| wsum(&x.linear(&w, Some(&b))));
        g.check("weight", &w, |w| wsum(&x.linear(w, Some(&b))));
        g.check("bias", &b, |b| wsum(&x.linear(&w, Some(b))));
        g.finish();
    }
}

mod gradcheck_cumsum {
    use super::*;

    #[test]
    fn cumsum() {
        let mut g = Gc::default();
        let x = rt::<R3>(seed("cumsum"), Dom::U(-3.0, 3.0));
        g.check("axis 0", &x, |x| wsum(&x.cumsum::<0>()));
        g.check("axis 1", &x, |x| wsum(&x.cumsum::<1>()));
        g.check("axis 2", &x, |x| wsum(&x.cumsum::<2>()));
        g.check("axis 1 of a transposed view", &x, |x| {
            wsum(&x.transpose::<1, 2>().cumsum::<1>())
        });
        g.finish();
    }
}

mod gradcheck_softmax {
    use super::*;

    #[test]
    fn softmax() {
        let mut g = Gc::default();
        let x = rt::<R3>(seed("softmax"), Dom::U(-3.0, 3.0));
        g.check("axis 0", &x, |x| wsum(&x.softmax::<0>()));
        g.check("axis 1", &x, |x| wsum(&x.softmax::<1>()));
        g.check("axis 2", &x, |x| wsum(&x.softmax::<2>()));
        g.check("axis 1 of a transposed view", &x, |x| {
            wsum(&x.transpose::<1, 2>().softmax::<1>())
        });
        g.finish();
    }

    #[test]
    fn log_softmax() {
        let mut g = Gc::default();
        let x = rt::<R3>(seed("log_softmax"), Dom::U(-3.0, 3.0));
        g.check("axis 0", &x, |x| wsum(&x.log_softmax::<0>()));
        g.check("axis 1", &x, |x| wsum(&x.log_softmax::<1>()));
        g.check("axis 2", &x, |x| wsum(&x.log_softmax::<2>()));
        g.check("axis 1 of a transposed view", &x, |x| {
            wsum(&x.transpose::<1, 2>().log_softmax::<1>())
        });
        g.finish();
    }
}

mod gradcheck_matmul {
    use super::*;

    #[test]
    fn matmul() {
        let mut g = Gc::default();
        both(
            &mut g,
            "[2, 3] @ [3, 4]",
            |a: &T<(C<2>, C<3>)>, b: &T<(C<3>, C<4>)>| a.matmul(b),
        );
        both(
            &mut g,
            "[3] @ [3, 4]",
            |a: &T<(C<3>,)>, b: &T<(C<3>, C<4>)>| a.matmul(b),
        );
        both(
            &mut g,
            "[2, 3] @ [3]",
            |a: &T<(C<2>, C<3>)>, b: &T<(C<3>,)>| a.matmul(b),
        );
        both(&mut g, "[3] @ [3]", |a: &T<(C<3>,)>, b: &T<(C<3>,)>| {
            a.matmul(b)
        });
        both(
            &mut g,
            "[2, 2, 3] @ [2, 3, 4]",
            |a: &T<(C<2>, C<2>, C<3>)>, b: &T<(C<2>, C<3>, C<4>)>| a.matmul(b),
        );
        both(
            &mut g,
            "[2, 2, 3] @ [3, 4]",
            |a: &T<(C<2>, C<2>, C<3>)>, b: &T<(C<3>, C<4>)>| a.matmul(b),
        );
        both(
            &mut g,
            "[2, 3] @ [2, 3, 4]",
            |a: &T<(C<2>, C<3>)>, b: &T<(C<2>, C<3>, C<4>)>| a.matmul(b),
        );
        both(
            &mut g,
            "[One, 2, 3] @ [2, 3, 4]",
            |a: &T<(One, C<2>, C<3>)>, b: &T<(C<2>, C<3>, C<4>)>| a.matmul(b),
        );
        g.finish();
    }

    /// Transposed (non-contiguous) operands.
    #[test]
    fn matmul_transposed_views() {
        let mut g = Gc::default();
        both(
            &mut g,
            "a.t() @ b",
            |a: &T<(C<3>, C<2>)>, b: &T<(C<3>, C<4>)>| a.t().matmul(b),
        );
        both(
            &mut g,
            "a @ b.t()",
            |a: &T<(C<2>, C<3>)>, b: &T<(C<4>, C<3>)>| a.matmul(&b.t()),
        );
        both(
            &mut g,
            "a.t() @ b.t()",
            |a: &T<(C<3>, C<2>)>, b: &T<(C<4>, C<3>)>| a.t().matmul(&b.t()),
        );
        both(
            &mut g,
            "a.expand([2, 2, 3]) @ b (stride-0 batch)",
            |a: &T<(C<2>, C<3>)>, b: &T<(C<2>, C<3>, C<4>)>| {
                a.expand((C::<2>, C::<2>, C::<3>)).matmul(b)
            },
        );
        both(
            &mut g,
            "batched a @ b.transpose(1, 2)",
            |a: &T<(C<2>, C<2>, C<3>)>, b: &T<(C<2>, C<4>, C<3>)>| a.matmul(&b.transpose::<1, 2>()),
        );
        g.finish();
    }
}

mod gradcheck_index {
    use super::*;

    #[test]
    fn index_select() {
        let mut g = Gc::default();
        let idx = I::<(C<5>,)>::from_vec(vec![2, 0, 2, 3, 2], (C,)).unwrap();
        let x = rt::<(C<4>, C<3>)>(1, ANY);
        g.check("axis 0, repeated indices", &x, |x| {
            wsum(&x.index_select::<0, _>(&idx))
        });
        let idx = I::<(C<3>,)>::from_vec(vec![1, 1, 3], (C,)).unwrap();
        let x = rt::<M34>(2, ANY);
        g.check("axis 1, repeated indices", &x, |x| {
            wsum(&x.index_select::<1, _>(&idx))
        });
        g.check("axis 1 of a transposed view", &x, |x| {
            wsum(&x.t().index_select::<0, _>(&idx))
        });
        // A strided (sliced) index: [2, 9, 0, 9, 2, 9][0..6 step 2] = [2, 0, 2].
        let long = I::<(C<6>,)>::from_vec(vec![2, 9, 0, 9, 2, 9], (C,)).unwrap();
        let strided = long.slice::<0>(0, 6, 2);
        let x = rt::<(C<4>, C<3>)>(10, ANY);
        g.check("axis 0, strided index view", &x, |x| {
            wsum(&x.index_select::<0, _>(&strided))
        });
        g.finish();
    }

    #[test]
    fn gather() {
        let mut g = Gc::default();
        let idx =
            I::<(C<3>, C<5>)>::from_vec(vec![0, 3, 3, 1, 2, 2, 2, 0, 1, 3, 1, 0, 0, 3, 2], (C, C))
                .unwrap();
        let x = rt::<M34>(3, ANY);
        g.check("axis 1, repeated indices", &x, |x| {
            wsum(&x.gather::<1, _>(&idx))
        });
        let idx = I::<(C<3>, C<2>)>::from_vec(vec![3, 0, 3, 3, 1, 2], (C, C)).unwrap();
        let x = rt::<(C<4>, C<3>)>(4, ANY);
        g.check("axis 0, index smaller than x", &x, |x| {
            wsum(&x.gather::<0, _>(&idx))
        });
        // A transposed (non-contiguous) index.
        let idx_t =
            I::<(C<5>, C<3>)>::from_vec(vec![0, 3, 3, 1, 2, 2, 2, 0, 1, 3, 1, 0, 0, 3, 2], (C, C))
                .unwrap();
        let x = rt::<M34>(11, ANY);
        g.check("axis 1, transposed index view", &x, |x| {
            wsum(&x.gather::<1, _>(&idx_t.t()))
        });
        g.finish();
    }

    #[test]
    fn scatter_add() {
        let mut g = Gc::default();
        let idx = I::<(C<3>, C<3>)>::from_vec(vec![0, 3, 3, 0, 1, 3, 2, 1, 3], (C, C)).unwrap();
        let x = rt::<(C<4>, C<3>)>(5, ANY);
        let src = rt::<(C<3>, C<3>)>(6, ANY);
        g.check("axis 0, d/dself", &x, |x| {
            wsum(&x.scatter_add::<0, _>(&idx, &src))
        });
        g.check("axis 0, d/dsrc", &src, |s| {
            wsum(&x.scatter_add::<0, _>(&idx, s))
        });
        let idx = I::<(C<2>, C<5>)>::from_vec(vec![0, 3, 3, 1, 0, 2, 2, 2, 1, 3], (C, C)).unwrap();
        let x = rt::<M34>(7, ANY);
        let src = rt::<(C<2>, C<5>)>(8, ANY);
        g.check("axis 1, d/dself", &x, |x| {
            wsum(&x.scatter_add::<1, _>(&idx, &src))
        });
        g.check("axis 1, d/dsrc", &src, |s| {
            wsum(&x.scatter_add::<1, _>(&idx, s))
        });
        g.finish();
    }

    #[test]
    fn embedding() {
        let mut g = Gc::default();
        let idx = I::<(C<2>, C<4>)>::from_vec(vec![1, 4, 1, 0, 3, 3, 1, 2], (C, C)).unwrap();
        let w = rt::<(C<5>, C<3>)>(9, ANY);
        g.check("[2, 4] indices into a [5, 3] table", &w, |w| {
            wsum(&w.embedding(&idx))
        });
        g.finish();
    }
}

mod gradcheck_cat {
    use super::*;

    #[test]
    fn cat() {
        let mut g = Gc::default();
        let a = rand_t((Dyn(1), C::<3>), 1, ANY);
        let b = rand_t((Dyn(2), C::<3>), 2, ANY);
        let c = rand_t((Dyn(3), C::<3>), 3, ANY);
        let f0 = |a: &T<(Dyn, C<3>)>, b: &T<(Dyn, C<3>)>, c: &T<(Dyn, C<3>)>| {
            wsum(&forma::cat::<0, _, _>(&[a.clone(), b.clone(), c.clone()]))
        };
        g.check("axis 0, d/da", &a, |x| f0(x, &b, &c));
        g.check("axis 0, d/db", &b, |x| f0(&a, x, &c));
        g.check("axis 0, d/dc", &c, |x| f0(&a, &b, x));
        let a = rand_t((C::<2>, Dyn(2)), 4, ANY);
        let b = rand_t((C::<2>, Dyn(3)), 5, ANY);
        let f1 = |a: &T<(C<2>, Dyn)>, b: &T<(C<2>, Dyn)>| {
            wsum(&forma::cat::<1, _, _>(&[a.clone(), b.clone()]))
        };
        g.check("axis 1, d/da", &a, |x| f1(x, &b));
        g.check("axis 1, d/db", &b, |x| f1(&a, x));
        // The same tensor twice: both pieces' gradients accumulate.
        g.check("axis 1, [a, a]", &a, |x| f1(x, x));
        g.finish();
    }

    #[test]
    fn stack() {
        let mut g = Gc::default();
        let a = rt::<(C<2>, C<3>)>(6, ANY);
        let b = rt::<(C<2>, C<3>)>(7, ANY);
        let c = rt::<(C<2>, C<3>)>(8, ANY);
        type M = T<(C<2>, C<3>)>;
        let s0 = |a: &M, b: &M, c: &M| {
            wsum(&forma::stack::<0, _, _>(&[a.clone(), b.clone(), c.clone()]))
        };
        g.check("axis 0, d/da", &a, |x| s0(x, &b, &c));
        g.check("axis 0, d/db", &b, |x| s0(&a, x, &c));
        g.check("axis 0, d/dc", &c, |x| s0(&a, &b, x));
        let s1 = |a: &M, b: &M| wsum(&forma::stack::<1, _, _>(&[a.clone(), b.clone()]));
        g.check("axis 1, d/da", &a, |x| s1(x, &b));
        g.check("axis 1, d/db", &b, |x| s1(&a, x));
        let s2 = |a: &M, b: &M| wsum(&forma::stack::<2, _, _>(&[a.clone(), b.clone()]));
        g.check("axis 2, d/da", &a, |x| s2(x, &b));
        g.check("axis 2, d/db", &b, |x| s2(&a, x));
        g.finish();
    }
}

mod gradcheck_view {
    use super::*;

    #[test]
    fn transpose_permute() {
        let mut g = Gc::default();
        let x = rt::<R3>(1, ANY);
        g.check("transpose(0, 2)", &x, |x| wsum(&x.transpose::<0, 2>()));
        g.check("transpose(0, 2).contiguous()", &x, |x| {
            wsum(&x.transpose::<0, 2>().contiguous())
        });
        g.check("permute(2, 0, 1)", &x, |x| {
            wsum(&x.permute::<(Ax<2>, Ax<0>, Ax<1>)>())
        });
        g.check("permute(1, 2, 0) then exp", &x, |x| {
            wsum(&x.permute::<(Ax<1>, Ax<2>, Ax<0>)>().exp())
        });
        let m = rt::<M34>(2, ANY);
        g.check("t()", &m, |m| wsum(&m.t()));
        g.check("t() then matmul", &m, |m| {
            wsum(&m.t().matmul(&rt::<(C<3>, C<2>)>(3, ANY)))
        });
        g.finish();
    }

    #[test]
    fn unsqueeze_squeeze() {
        let mut g = Gc::default();
        let x = rt::<M34>(4, ANY);
        g.check("unsqueeze(1)", &x, |x| wsum(&x.unsqueeze::<1>()));
        g.check("unsqueeze(0) broadcast against [2, 3, 4]", &x, |x| {
            wsum(&(&x.unsqueeze::<0>() * &rt::<R3>(5, ANY)))
        });
        g.check("unsqueeze(2).squeeze(2)", &x, |x| {
            wsum(&x.unsqueeze::<2>().squeeze::<2>())
        });
        let y = rt::<(C<3>, C<1>, C<4>)>(6, ANY);
        g.check("squeeze(1) of a C<1>", &y, |y| wsum(&y.squeeze::<1>()));
        g.finish();
    }

    #[test]
    fn narrow_slice() {
        let mut g = Gc::default();
        let x = rt::<(C<3>, C<5>)>(7, ANY);
        g.check("narrow(1, 1, 3)", &x, |x| wsum(&x.narrow::<1>(1, 3)));
        g.check("narrow(0, 1, 2)", &x, |x| wsum(&x.narrow::<0>(1, 2)));
        g.check("narrow_static::<1, 2>(2)", &x, |x| {
            wsum(&x.narrow_static::<1, 2>(2))
        });
        g.check("slice(1, 1..5 step 2)", &x, |x| {
            wsum(&x.slice::<1>(1, 5, 2))
        });
        let y = rt::<(C<7>, C<2>)>(8, ANY);
        g.check("slice(0, 0..7 step 3)", &y, |y| {
            wsum(&y.slice::<0>(0, 7, 3))
        });
        g.check("narrow of a transposed view", &y, |y| {
            wsum(&y.t().narrow::<1>(2, 4))
        });
        g.finish();
    }

    #[test]
    fn expand() {
        let mut g = Gc::default();
        let x = rt::<(C<3>, One)>(9, ANY);
        g.check("[3, One] -> [2, 3, 4]", &x, |x| {
            wsum(&x.expand((C::<2>, C::<3>, C::<4>)))
        });
        let v = rt::<(C<4>,)>(10, ANY);
        g.check("[4] -> [3, 4]", &v, |v| wsum(&v.expand((C::<3>, C::<4>))));
        let k = rt::<R3>(11, ANY);
        g.check("sum_keepdim(1) -> expand_as", &k, |k| {
            wsum(&k.sum_keepdim::<1>().expand_as(k))
        });
        g.finish();
    }

    #[test]
    fn reshape_flatten() {
        let mut g = Gc::default();
        let x = rt::<(C<2>, C<6>)>(12, ANY);
        g.check("reshape [2, 6] -> [3, 4]", &x, |x| {
            wsum(&x.reshape::<(C<3>, C<4>)>())
        });
        g.check("reshape [2, 6] -> [Dyn, 3]", &x, |x| {
            wsum(&x.reshape::<(Dyn, C<3>)>())
        });
        let y = rt::<(C<4>, C<3>)>(13, ANY);
        g.check("reshape of a transposed view (copy)", &y, |y| {
            wsum(&y.t().reshape::<(C<2>, C<6>)>())
        });
        let z = rt::<R3>(14, ANY);
        g.check("flatten [2, 3, 4] -> [2, 12]", &z, |z| {
            wsum(&z.flatten::<C<12>>())
        });
        g.check("flatten_all", &z, |z| wsum(&z.flatten_all()));
        g.check("flatten_all of a permuted view", &z, |z| {
            wsum(&z.permute::<(Ax<2>, Ax<0>, Ax<1>)>().flatten_all())
        });
        g.finish();
    }

    #[test]
    fn split_chunk() {
        let mut g = Gc::default();
        let x = rt::<(C<3>, C<5>)>(15, ANY);
        // Pieces reordered and one dropped: its gradient must be zero.
        g.check("split(2, axis 1) -> cat([p2, p0])", &x, |x| {
            let p = x.split::<1>(2);
            wsum(&forma::cat::<1, _, _>(&[p[2].clone(), p[0].clone()]))
        });
        let y = rt::<(C<5>, C<3>)>(16, ANY);
        g.check("chunk(2, axis 0) -> cat([p1, p0])", &y, |y| {
            let p = y.chunk::<0>(2);
            wsum(&forma::cat::<0, _, _>(&[p[1].clone(), p[0].clone()]))
        });
        g.finish();
    }
}

/// A tensor used on two paths: the gradients of both must add up.
mod gradcheck_twice {
    use super::*;

    #[test]
    fn accumulation() {
        let mut g = Gc::default();
        let x = rt::<M34>(1, ANY);
        g.check("x * sin(x)", &x, |x| wsum(&(x * &x.sin())));
        g.check("x.exp() + x.exp()", &x, |x| wsum(&(x.exp() + x.exp())));
        g.check("x * x.clone() (clones share the variable)", &x, |x| {
            wsum(&(x * &x.clone()))
        });
        g.check("x - x.mean_keepdim(0)", &x, |x| {
            wsum(&(x - &x.mean_keepdim::<0>()))
        });
        let p = rt::<M34>(2, Dom::U(0.5, 2.0));
        g.check("x / x.sum_keepdim(1)", &p, |x| {
            wsum(&(x / &x.sum_keepdim::<1>()))
        });
        let s = rt::<(C<3>, C<3>)>(3, ANY);
        g.check("x + x.t()", &s, |x| wsum(&(x + &x.t())));
        g.check("x @ x", &s, |x| wsum(&x.matmul(x)));
        g.check("x @ x.t()", &s, |x| wsum(&x.matmul(&x.t())));
        let y = rt::<(C<4>, C<3>)>(4, ANY);
        g.check("split(2, axis 0): p0 * p1", &y, |y| {
            let p = y.split::<0>(2);
            wsum(&(&p[0] * &p[1]))
        });
        g.finish();
    }
}

mod gradcheck_cmp {
    use super::*;

    fn mask<S: ConstShape>(seed: u64) -> B<S> {
        let v = data(S::VALUE.numel(), seed, Dom::U(0.0, 1.0))
            .into_iter()
            .map(|u| u < 0.5)
            .collect();
        Tensor::from_vec(v, S::VALUE).unwrap()
    }

    #[test]
    fn where_cond() {
        let mut g = Gc::default();
        let cond = mask::<M34>(1);
        let a = rt::<M34>(2, ANY);
        let b = rt::<M34>(3, ANY);
        g.check("same sizes, d/da", &a, |a| {
            wsum(&forma::where_cond(&cond, a, &b))
        });
        g.check("same sizes, d/db", &b, |b| {
            wsum(&forma::where_cond(&cond, &a, b))
        });
        let cond = mask::<(C<4>,)>(4);
        let b = rt::<(C<4>,)>(5, ANY);
        g.check("cond [4], b [4] broadcast, d/da", &a, |a| {
            wsum(&forma::where_cond(&cond, a, &b))
        });
        g.check("cond [4], b [4] broadcast, d/db", &b, |b| {
            wsum(&forma::where_cond(&cond, &a, b))
        });
        g.finish();
    }

    #[test]
    fn masked_fill() {
        let mut g = Gc::default();
        let x = rt::<M34>(6, ANY);
        let m = mask::<M34>(7);
        g.check("same-size mask", &x, |x| wsum(&x.masked_fill(&m, -1.5)));
        let m = mask::<(C<4>,)>(8);
        g.check("[4] mask broadcast", &x, |x| wsum(&x.masked_fill(&m, 2.0)));
        g.finish();
    }
}

mod gradcheck_conv {
    use super::*;

    #[test]
    fn conv2d() {
        let mut g = Gc::default();
        both(
            &mut g,
            "plain",
            |x: &T<(C<2>, C<3>, C<6>, C<6>)>, w: &T<(C<4>, C<3>, C<3>, C<3>)>| {
                x.conv2d(w, Conv2dParams::default())
            },
        );
        both(
            &mut g,
            "stride 2 padding 1",
            |x: &T<(C<1>, C<2>, C<7>, C<7>)>, w: &T<(C<3>, C<2>, C<3>, C<3>)>| {
                x.conv2d(
                    w,
                    Conv2dParams {
                        stride: [2, 2],
                        padding: [1, 1],
                        ..Default::default()
                    },
                )
            },
        );
        both(
            &mut g,
            "dilation 2 padding 1",
            |x: &T<(C<1>, C<2>, C<7>, C<7>)>, w: &T<(C<2>, C<2>, C<3>, C<3>)>| {
                x.conv2d(
                    w,
                    Conv2dParams {
                        padding: [1, 1],
                        dilation: [2, 2],
                        ..Default::default()
                    },
                )
            },
        );
        both(
            &mut g,
            "groups 2 padding 1",
            |x: &T<(C<1>, C<4>, C<5>, C<5>)>, w: &T<(C<6>, C<2>, C<3>, C<3>)>| {
                x.conv2d(
                    w,
                    Conv2dParams {
                        padding: [1, 1],
                        groups: 2,
                        ..Default::default()
                    },
                )
            },
        );
        g.finish();
    }

    #[test]
    fn conv1d() {
        let mut g = Gc::default();
        let x = rt::<(C<2>, C<3>, C<8>)>(1, ANY);
        let w = rt::<(C<4>, C<3>, C<3>)>(2, ANY);
        g.check("padding 1, d/dx", &x, |x| wsum(&x.conv1d(&w, 1, 1, 1, 1)));
        g.check("padding 1, d/dw", &w, |w| wsum(&x.conv1d(w, 1, 1, 1, 1)));
        let x = rt::<(C<1>, C<2>, C<9>)>(3, ANY);
        let w = rt::<(C<2>, C<1>, C<3>)>(4, ANY);
        g.check("stride 2 dilation 2 groups 2, d/dx", &x, |x| {
            wsum(&x.conv1d(&w, 2, 0, 2, 2))
        });
        g.check("stride 2 dilation 2 groups 2, d/dw", &w, |w| {
            wsum(&x.conv1d(w, 2, 0, 2, 2))
        });
        g.finish();
    }

    /// The per-channel bias the conv layers add (`forma::core::ops::conv::add_channel_bias`).
    #[test]
    fn channel_bias() {
        let mut g = Gc::default();
        let x = rt::<(C<2>, C<3>, C<4>, C<4>)>(5, ANY);
        let b = rt::<(C<3>,)>(6, ANY);
        g.check("d/dx", &x, |x| wsum(&add_channel_bias(x, &b)));
        g.check("d/dbias", &b, |b| wsum(&add_channel_bias(&x, b)));
        g.finish();
    }
}

mod gradcheck_pool {
    use super::*;

    fn p3s2p1() -> Pool2dParams {
        Pool2dParams {
            stride: [2, 2],
            padding: [1, 1],
            ..Pool2dParams::new([3, 3])
        }
    }

    #[test]
    fn max_pool2d() {
        let mut g = Gc::default();
        let x = rt::<(C<2>, C<2>, C<6>, C<6>)>(1, Dom::Distinct);
        g.check("2x2", &x, |x| {
            wsum(&x.max_pool2d(Pool2dParams::new([2, 2])))
        });
        let x = rt::<(C<1>, C<2>, C<7>, C<7>)>(2, Dom::Distinct);
        g.check("3x3 stride 2 padding 1 (overlapping)", &x, |x| {
            wsum(&x.max_pool2d(p3s2p1()))
        });
        g.finish();
    }

    #[test]
    fn avg_pool2d() {
        let mut g = Gc::default();
        let x = rt::<(C<2>, C<2>, C<6>, C<6>)>(3, ANY);
        g.check("2x2", &x, |x| {
            wsum(&x.avg_pool2d(Pool2dParams::new([2, 2])))
        });
        let x = rt::<(C<1>, C<2>, C<7>, C<7>)>(4, ANY);
        g.check("3x3 stride 2 padding 1", &x, |x| {
            wsum(&x.avg_pool2d(p3s2p1()))
        });
        g.check("3x3 stride 2 padding 1, count_include_pad false", &x, |x| {
            wsum(&x.avg_pool2d(Pool2dParams {
                count_include_pad: false,
                ..p3s2p1()
            }))
        });
        let x = rt::<(C<1>, C<1>, C<5>, C<5>)>(5, ANY);
        g.check("2x2 ceil_mode", &x, |x| {
            wsum(&x.avg_pool2d(Pool2dParams {
                ceil_mode: true,
                ..Pool2dParams::new([2, 2])
            }))
        });
        g.finish();
    }

    #[test]
    fn pool1d() {
        let mut g = Gc::default();
        let x = rt::<(C<2>, C<3>, C<8>)>(6, Dom::Distinct);
        g.check("max_pool1d(2, 2, 0)", &x, |x| {
            wsum(&x.try_max_pool1d(2, 2, 0).unwrap())
        });
        g.check("avg_pool1d(3, 2, 1)", &x, |x| {
            wsum(&x.try_avg_pool1d(3, 2, 1).unwrap())
        });
        g.finish();
    }
}

// ================================================================== fixtures

/// f64 gradients against PyTorch's: the same math in another order.
const TOL: Tol = Tol {
    rtol: 1e-10,
    atol: 1e-12,
};

/// Runs the cases of one family of `grad_ops.safetensors` and reports every
/// failure (and every case of the family the test did not run) at the end.
struct Fx {
    fx: Fixture,
    family: &'static str,
    /// Whether `finish` requires every case of the family to have run.
    coverage: bool,
    done: BTreeSet<String>,
    failures: Vec<String>,
}

fn all(results: Vec<Result<(), String>>) -> Result<(), String> {
    let errs: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

impl Fx {
    fn new(family: &'static str) -> Self {
        Fx {
            fx: Fixture::load("grad_ops"),
            family,
            coverage: true,
            done: BTreeSet::new(),
            failures: Vec::new(),
        }
    }

    /// Cases picked from any family (no coverage requirement).
    fn picked() -> Self {
        Fx {
            coverage: false,
            ..Fx::new("")
        }
    }

    /// A non-differentiable operand (`<case>.idx`, `.cond`, `.mask`).
    fn konst<S: Shape, E: FixtureElem>(&self, key: &str) -> Tensor<S, E> {
        self.fx.tensor(key, &Cpu)
    }

    fn leaf<S: Shape>(&self, case: &str, i: usize) -> T<S> {
        self.fx
            .tensor::<S, f64, Cpu>(&format!("{case}.in{i}"), &Cpu)
            .requires_grad()
    }

    /// Compares the forward, then backpropagates `<case>.gout`.
    fn backward<So: Shape>(&self, case: &str, y: &T<So>) -> Result<(), String> {
        self.fx
            .compare(y, &format!("{case}.out"), TOL)
            .map_err(|e| format!("forward: {e}"))?;
        let g: T<So> = self.fx.tensor(&format!("{case}.gout"), &Cpu);
        y.try_backward_with(&g)
            .map_err(|e| format!("backward failed: {e}"))
    }

    /// Like [`Fx::backward`] with the upstream gradient as a non-contiguous
    /// view (the transpose of a transposed copy: same values, strides `[1, m]`).
    fn backward_strided<A: Dim, Bd: Dim>(&self, case: &str, y: &T<(A, Bd)>) -> Result<(), String> {
        self.fx
            .compare(y, &format!("{case}.out"), TOL)
            .map_err(|e| format!("forward: {e}"))?;
        let g: T<(A, Bd)> = self.fx.tensor(&format!("{case}.gout"), &Cpu);
        let g = g.t().contiguous().t();
        assert!(
            !g.is_contiguous(),
            "{case}: the upstream gradient should be a strided view"
        );
        y.try_backward_with(&g)
            .map_err(|e| format!("backward failed: {e}"))
    }

    fn grad<S: Shape>(&self, case: &str, i: usize, x: &T<S>) -> Result<(), String> {
        match x.grad() {
            None => Err(format!("grad{i}: no gradient reached input {i}")),
            Some(g) => self
                .fx
                .compare(&g, &format!("{case}.grad{i}"), TOL)
                .map_err(|e| format!("grad{i}: {e}")),
        }
    }

    fn run(&mut self, case: &str, body: impl FnOnce(&Self) -> Result<(), String>) {
        assert!(
            case.starts_with(self.family),
            "{case} is not in family {}",
            self.family
        );
        assert!(self.done.insert(case.to_string()), "{case} checked twice");
        match catch_unwind(AssertUnwindSafe(|| body(self))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.failures.push(format!("{case}: {e}")),
            Err(p) => self
                .failures
                .push(format!("{case}: panicked: {}", panic_msg(&*p))),
        }
    }

    fn case1<S: Shape, So: Shape>(&mut self, case: &str, f: impl FnOnce(&T<S>) -> T<So>) {
        self.run(case, |c| {
            let x = c.leaf::<S>(case, 0);
            let y = f(&x);
            c.backward(case, &y)?;
            c.grad(case, 0, &x)
        });
    }

    fn case2<Sa: Shape, Sb: Shape, So: Shape>(
        &mut self,
        case: &str,
        f: impl FnOnce(&T<Sa>, &T<Sb>) -> T<So>,
    ) {
        self.run(case, |c| {
            let (a, b) = (c.leaf::<Sa>(case, 0), c.leaf::<Sb>(case, 1));
            let y = f(&a, &b);
            c.backward(case, &y)?;
            all(vec![c.grad(case, 0, &a), c.grad(case, 1, &b)])
        });
    }

    fn case3<Sa: Shape, Sb: Shape, Sc: Shape, So: Shape>(
        &mut self,
        case: &str,
        f: impl FnOnce(&T<Sa>, &T<Sb>, &T<Sc>) -> T<So>,
    ) {
        self.run(case, |c| {
            let (a, b, d) = (
                c.leaf::<Sa>(case, 0),
                c.leaf::<Sb>(case, 1),
                c.leaf::<Sc>(case, 2),
            );
            let y = f(&a, &b, &d);
            c.backward(case, &y)?;
            all(vec![
                c.grad(case, 0, &a),
                c.grad(case, 1, &b),
                c.grad(case, 2, &d),
            ])
        });
    }

    fn case1_strided<S: Shape, A: Dim, Bd: Dim>(
        &mut self,
        case: &str,
        f: impl FnOnce(&T<S>) -> T<(A, Bd)>,
    ) {
        self.run(case, |c| {
            let x = c.leaf::<S>(case, 0);
            let y = f(&x);
            c.backward_strided(case, &y)?;
            c.grad(case, 0, &x)
        });
    }

    fn case2_strided<Sa: Shape, Sb: Shape, A: Dim, Bd: Dim>(
        &mut self,
        case: &str,
        f: impl FnOnce(&T<Sa>, &T<Sb>) -> T<(A, Bd)>,
    ) {
        self.run(case, |c| {
            let (a, b) = (c.leaf::<Sa>(case, 0), c.leaf::<Sb>(case, 1));
            let y = f(&a, &b);
            c.backward_strided(case, &y)?;
            all(vec![c.grad(case, 0, &a), c.grad(case, 1, &b)])
        });
    }

    #[track_caller]
    fn finish(mut self) {
        let prefix = if self.family.is_empty() {
            String::new()
        } else {
            format!("{}.", self.family)
        };
        let stored: BTreeSet<String> = self
            .fx
            .keys()
            .into_iter()
            .filter(|k| k.starts_with(&prefix))
            .filter_map(|k| k.strip_suffix(".gout").map(str::to_string))
            .collect();
        if self.coverage {
            for case in stored.difference(&self.done) {
                self.failures.push(format!(
                    "{case}: stored in the fixture but not checked here"
                ));
            }
        }
        for case in self.done.difference(&stored) {
            self.failures
                .push(format!("{case}: checked here but missing from the fixture"));
        }
        if !self.failures.is_empty() {
            panic!(
                "{} of {} `{}` cases differ from PyTorch:\n- {}",
                self.failures.len(),
                self.done.len(),
                self.family,
                self.failures.join("\n- ")
            );
        }
    }
}

mod fixture {
    use super::*;

    #[test]
    fn provenance() {
        let fx = Fixture::load("grad_ops");
        let meta = fx.metadata();
        assert_eq!(
            meta.get("generator").map(String::as_str),
            Some("tools/gen_grad_fixtures.py")
        );
        assert!(
            meta.get("torch").is_some_and(|v| v.starts_with('2')),
            "missing torch version: {meta:?}"
        );
    }

    type Unary = fn(&T<M34>) -> T<M34>;

    /// Every unary op with the parameters `tools/gen_grad_fixtures.py` uses.
    const UNARY: &[(&str, Unary)] = &[
        ("neg", |x| x.neg()),
        ("exp", |x| x.exp()),
        ("log", |x| x.log()),
        ("log1p", |x| x.log1p()),
        ("sqrt", |x| x.sqrt()),
        ("rsqrt", |x| x.rsqrt()),
        ("recip", |x| x.recip()),
        ("square", |x| x.square()),
        ("abs", |x| x.abs()),
        ("sin", |x| x.sin()),
        ("cos", |x| x.cos()),
        ("tanh", |x| x.tanh()),
        ("sigmoid", |x| x.sigmoid()),
        ("relu", |x| x.relu()),
        ("gelu", |x| x.gelu()),
        ("gelu_tanh", |x| x.gelu_tanh()),
        ("silu", |x| x.silu()),
        ("hardswish", |x| x.hardswish()),
        ("leaky_relu", |x| x.leaky_relu(0.2)),
        ("leaky_relu_default", |x| x.leaky_relu(0.01)),
        ("pow_scalar", |x| x.pow_scalar(2.5)),
        ("pow_scalar_int", |x| x.pow_scalar(3.0)),
        ("pow_scalar_neg", |x| x.pow_scalar(-1.5)),
        ("add_scalar", |x| x.add_scalar(1.5)),
        ("mul_scalar", |x| x.mul_scalar(-2.5)),
        ("div_scalar", |x| x.div_scalar(3.0)),
        ("clamp", |x| x.clamp(-0.5, 0.75)),
        ("clamp_min", |x| x.clamp_min(-0.5)),
        ("clamp_max", |x| x.clamp_max(0.75)),
    ];

    /// The ops checked at their exact kinks (0, -0, the clamp bounds,
    /// hardswish's -3 and 3).
    const KINK: &[&str] = &[
        "relu",
        "abs",
        "leaky_relu",
        "clamp",
        "clamp_min",
        "clamp_max",
        "pow_scalar_int",
        "square",
        "hardswish",
    ];

    #[test]
    fn unary() {
        let mut c = Fx::new("unary");
        for &(name, f) in UNARY {
            c.case1(&format!("unary.{name}.x"), f);
        }
        for name in KINK {
            let f = UNARY.iter().find(|(n, _)| n == name).unwrap().1;
            c.case1(&format!("unary.{name}.kink"), f);
        }
        c.finish();
    }

    macro_rules! binary_fixture {
        ($c:ident: $($op:ident),*) => {$(
            $c.case2(concat!("binary.", stringify!($op), ".same"), |a: &T<M34>, b: &T<M34>| a.$op(b));
            $c.case2(concat!("binary.", stringify!($op), ".bcast"), |a: &T<(C<2>, C<3>)>, b: &T<(C<3>,)>| a.$op(b));
            $c.case2(concat!("binary.", stringify!($op), ".keepdim"), |a: &T<(C<2>, C<3>)>, b: &T<(C<2>, One)>| a.$op(b));
            $c.case2(concat!("binary.", stringify!($op), ".outer"), |a: &T<(C<3>, One)>, b: &T<(C<4>,)>| a.$op(b));
            $c.case2(concat!("binary.", stringify!($op), ".3d"), |a: &T<(C<2>, One, C<4>)>, b: &T<(C<3>, One)>| a.$op(b));
        )*};
    }

    #[test]
    fn binary() {
        let mut c = Fx::new("binary");
        binary_fixture!(c: add, sub, mul, div, pow, maximum, minimum, fmax, fmin);
        c.case2("binary.maximum.ties", |a: &T<M34>, b: &T<M34>| a.maximum(b));
        c.case2("binary.minimum.ties", |a: &T<M34>, b: &T<M34>| a.minimum(b));
        c.case2("binary.fmax.ties", |a: &T<M34>, b: &T<M34>| a.fmax(b));
        c.case2("binary.fmin.ties", |a: &T<M34>, b: &T<M34>| a.fmin(b));
        c.case2("binary.fmax.nan", |a: &T<M34>, b: &T<M34>| a.fmax(b));
        c.case2("binary.fmin.nan", |a: &T<M34>, b: &T<M34>| a.fmin(b));
        c.case2("binary.pow.kink", |a: &T<M34>, b: &T<M34>| a.pow(b));
        c.finish();
    }

    macro_rules! reduce_fixture {
        ($c:ident: $($op:ident, $keep:ident, $all:ident;)*) => {$(
            $c.case1(concat!("reduce.", stringify!($op), ".ax0"), |x: &T<R3>| x.$op::<0>());
            $c.case1(concat!("reduce.", stringify!($op), ".ax1"), |x: &T<R3>| x.$op::<1>());
            $c.case1(concat!("reduce.", stringify!($op), ".ax2"), |x: &T<R3>| x.$op::<2>());
            $c.case1(concat!("reduce.", stringify!($op), ".keep1"), |x: &T<R3>| x.$keep::<1>());
            $c.case1(concat!("reduce.", stringify!($op), ".all"), |x: &T<R3>| x.$all());
        )*};
    }

    #[test]
    fn reduce() {
        let mut c = Fx::new("reduce");
        reduce_fixture! {c:
            sum, sum_keepdim, sum_all;
            mean, mean_keepdim, mean_all;
            max, max_keepdim, max_all;
            min, min_keepdim, min_all;
            prod, prod_keepdim, prod_all;
            logsumexp, logsumexp_keepdim, logsumexp_all;
        }
        c.case1("reduce.var.ax1", |x: &T<R3>| x.var::<1>(true));
        c.case1("reduce.var.ax0b", |x: &T<R3>| x.var::<0>(false));
        c.case1("reduce.var.keep2", |x: &T<R3>| x.var_keepdim::<2>(true));
        c.case1("reduce.var.all", |x: &T<R3>| x.var_all(true));
        c.case1("reduce.var.allb", |x: &T<R3>| x.var_all(false));
        c.case1("reduce.std.ax1", |x: &T<R3>| x.std::<1>(true));
        c.case1("reduce.std.ax0b", |x: &T<R3>| x.std::<0>(false));
        c.case1("reduce.std.keep2", |x: &T<R3>| x.std_keepdim::<2>(true));
        c.case1("reduce.std.all", |x: &T<R3>| x.std_all(true));
        c.case1("reduce.std.allb", |x: &T<R3>| x.std_all(false));
        // Ties share the gradient evenly (PyTorch's amax/amin and max()).
        c.case1("reduce.max.ties1", |x: &T<R3>| x.max::<1>());
        c.case1("reduce.min.ties2", |x: &T<R3>| x.min::<2>());
        c.case1("reduce.max.tiesall", |x: &T<R3>| x.max_all());
        c.case1("reduce.min.tiesall", |x: &T<R3>| x.min_all());
        c.case1("reduce.prod.zeros2", |x: &T<R3>| x.prod::<2>());
        c.case1("reduce.prod.zerosall", |x: &T<(C<2>, C<3>)>| x.prod_all());
        c.finish();
    }

    #[test]
    fn softmax() {
        let mut c = Fx::new("softmax");
        c.case1("softmax.softmax.ax0", |x: &T<R3>| x.softmax::<0>());
        c.case1("softmax.softmax.ax1", |x: &T<R3>| x.softmax::<1>());
        c.case1("softmax.softmax.ax2", |x: &T<R3>| x.softmax::<2>());
        c.case1("softmax.softmax.big", |x: &T<M34>| x.softmax::<1>());
        c.case1("softmax.log_softmax.ax0", |x: &T<R3>| x.log_softmax::<0>());
        c.case1("softmax.log_softmax.ax1", |x: &T<R3>| x.log_softmax::<1>());
        c.case1("softmax.log_softmax.ax2", |x: &T<R3>| x.log_softmax::<2>());
        c.case1("softmax.log_softmax.big", |x: &T<M34>| x.log_softmax::<1>());
        c.finish();
    }

    #[test]
    fn matmul() {
        let mut c = Fx::new("matmul");
        c.case2("matmul.mm", |a: &T<(C<2>, C<3>)>, b: &T<(C<3>, C<4>)>| {
            a.matmul(b)
        });
        c.case2("matmul.vm", |a: &T<(C<3>,)>, b: &T<(C<3>, C<4>)>| {
            a.matmul(b)
        });
        c.case2("matmul.mv", |a: &T<(C<2>, C<3>)>, b: &T<(C<3>,)>| {
            a.matmul(b)
        });
        c.case2("matmul.vv", |a: &T<(C<3>,)>, b: &T<(C<3>,)>| a.matmul(b));
        c.case2(
            "matmul.bmm",
            |a: &T<(C<2>, C<2>, C<3>)>, b: &T<(C<2>, C<3>, C<4>)>| a.matmul(b),
        );
        c.case2(
            "matmul.bcast_right",
            |a: &T<(C<2>, C<2>, C<3>)>, b: &T<(C<3>, C<4>)>| a.matmul(b),
        );
        c.case2(
            "matmul.bcast_left",
            |a: &T<(C<2>, C<3>)>, b: &T<(C<2>, C<3>, C<4>)>| a.matmul(b),
        );
        c.case2(
            "matmul.bcast_one",
            |a: &T<(One, C<2>, C<3>)>, b: &T<(C<2>, C<3>, C<4>)>| a.matmul(b),
        );
        c.case2(
            "matmul.t_left",
            |a: &T<(C<3>, C<2>)>, b: &T<(C<3>, C<4>)>| a.t().matmul(b),
        );
        c.case2(
            "matmul.t_right",
            |a: &T<(C<2>, C<3>)>, b: &T<(C<4>, C<3>)>| a.matmul(&b.t()),
        );
        c.finish();
    }

    #[test]
    fn index() {
        let mut c = Fx::new("index");
        let idx: I<(C<5>,)> = c.konst("index.index_select0.idx");
        c.case1("index.index_select0", |x: &T<(C<4>, C<3>)>| {
            x.index_select::<0, _>(&idx)
        });
        let idx: I<(C<3>,)> = c.konst("index.index_select1.idx");
        c.case1("index.index_select1", |x: &T<M34>| {
            x.index_select::<1, _>(&idx)
        });
        let idx: I<(C<3>, C<5>)> = c.konst("index.gather1.idx");
        c.case1("index.gather1", |x: &T<M34>| x.gather::<1, _>(&idx));
        let idx: I<(C<3>, C<2>)> = c.konst("index.gather0.idx");
        c.case1("index.gather0", |x: &T<(C<4>, C<3>)>| {
            x.gather::<0, _>(&idx)
        });
        let idx: I<(C<3>, C<3>)> = c.konst("index.scatter_add0.idx");
        c.case2(
            "index.scatter_add0",
            |x: &T<(C<4>, C<3>)>, s: &T<(C<3>, C<3>)>| x.scatter_add::<0, _>(&idx, s),
        );
        let idx: I<(C<2>, C<5>)> = c.konst("index.scatter_add1.idx");
        c.case2("index.scatter_add1", |x: &T<M34>, s: &T<(C<2>, C<5>)>| {
            x.scatter_add::<1, _>(&idx, s)
        });
        let idx: I<(C<2>, C<4>)> = c.konst("index.embedding.idx");
        c.case1("index.embedding", |w: &T<(C<5>, C<3>)>| w.embedding(&idx));
        c.finish();
    }

    #[test]
    fn cat() {
        type R = T<(Dyn, C<3>)>;
        type Q = T<(C<2>, Dyn)>;
        type M = T<(C<2>, C<3>)>;
        let mut c = Fx::new("cat");
        c.case3("cat.cat0", |a: &R, b: &R, d: &R| {
            forma::cat::<0, _, _>(&[a.clone(), b.clone(), d.clone()])
        });
        c.case2("cat.cat1", |a: &Q, b: &Q| {
            forma::cat::<1, _, _>(&[a.clone(), b.clone()])
        });
        c.case3("cat.stack0", |a: &M, b: &M, d: &M| {
            forma::stack::<0, _, _>(&[a.clone(), b.clone(), d.clone()])
        });
        c.case2("cat.stack1", |a: &M, b: &M| {
            forma::stack::<1, _, _>(&[a.clone(), b.clone()])
        });
        c.case2("cat.stack2", |a: &M, b: &M| {
            forma::stack::<2, _, _>(&[a.clone(), b.clone()])
        });
        c.finish();
    }

    #[test]
    fn view() {
        let mut c = Fx::new("view");
        c.case1("view.transpose", |x: &T<R3>| x.transpose::<0, 2>());
        c.case1("view.t", |x: &T<M34>| x.t());
        c.case1("view.permute", |x: &T<R3>| {
            x.permute::<(Ax<2>, Ax<0>, Ax<1>)>()
        });
        c.case1("view.unsqueeze", |x: &T<M34>| x.unsqueeze::<1>());
        c.case1("view.squeeze", |x: &T<(C<3>, C<1>, C<4>)>| x.squeeze::<1>());
        c.case1("view.narrow", |x: &T<(C<3>, C<5>)>| x.narrow::<1>(1, 3));
        c.case1("view.narrow_static", |x: &T<(C<3>, C<5>)>| {
            x.narrow_static::<1, 2>(2)
        });
        c.case1("view.slice1", |x: &T<(C<4>, C<5>)>| x.slice::<1>(1, 5, 2));
        c.case1("view.slice0", |x: &T<(C<7>, C<2>)>| x.slice::<0>(0, 7, 3));
        c.case1("view.expand", |x: &T<(C<3>, One)>| {
            x.expand((C::<2>, C::<3>, C::<4>))
        });
        c.case1("view.reshape", |x: &T<(C<2>, C<6>)>| {
            x.reshape::<(C<3>, C<4>)>()
        });
        c.case1("view.reshape_nc", |x: &T<(C<4>, C<3>)>| {
            x.t().reshape::<(C<2>, C<6>)>()
        });
        c.case1("view.flatten", |x: &T<R3>| x.flatten::<C<12>>());
        c.case1("view.flatten_all", |x: &T<(C<2>, C<3>)>| x.flatten_all());
        c.case1("view.split", |x: &T<(C<3>, C<5>)>| {
            let p = x.split::<1>(2);
            forma::cat::<1, _, _>(&[p[2].clone(), p[0].clone()])
        });
        c.case1("view.chunk", |x: &T<(C<5>, C<3>)>| {
            let p = x.chunk::<0>(2);
            forma::cat::<0, _, _>(&[p[1].clone(), p[0].clone()])
        });
        c.case1("view.contiguous", |x: &T<M34>| x.t().contiguous());
        c.finish();
    }

    #[test]
    fn twice() {
        let mut c = Fx::new("twice");
        c.case1("twice.mul_sin", |x: &T<M34>| x * &x.sin());
        c.case1("twice.add_t", |x: &T<(C<3>, C<3>)>| x + &x.t());
        c.case1("twice.matmul_self", |x: &T<(C<3>, C<3>)>| x.matmul(x));
        c.case1("twice.div_sum_keepdim", |x: &T<M34>| {
            x / &x.sum_keepdim::<1>()
        });
        c.case1("twice.sub_mean_keepdim", |x: &T<M34>| {
            x - &x.mean_keepdim::<0>()
        });
        c.case1("twice.split_mul", |x: &T<(C<4>, C<3>)>| {
            let p = x.split::<0>(2);
            &p[0] * &p[1]
        });
        c.finish();
    }

    #[test]
    fn cmp() {
        let mut c = Fx::new("cmp");
        let cond: B<M34> = c.konst("cmp.where.cond");
        c.case2("cmp.where", |a: &T<M34>, b: &T<M34>| {
            where_cond(&cond, a, b)
        });
        let cond: B<(C<4>,)> = c.konst("cmp.where_bcast.cond");
        c.case2("cmp.where_bcast", |a: &T<M34>, b: &T<(C<4>,)>| {
            where_cond(&cond, a, b)
        });
        let mask: B<M34> = c.konst("cmp.masked_fill.mask");
        c.case1("cmp.masked_fill", |x: &T<M34>| x.masked_fill(&mask, -1.5));
        let mask: B<(C<4>,)> = c.konst("cmp.masked_fill_bcast.mask");
        c.case1("cmp.masked_fill_bcast", |x: &T<M34>| {
            x.masked_fill(&mask, 2.0)
        });
        c.finish();
    }

    /// Backward closures must accept an upstream gradient with any strides
    /// (as `try_backward_with` allows); every 2-d-output case again with a
    /// transposed-layout upstream gradient.
    #[test]
    fn strided_upstream_gradient() {
        let mut c = Fx::picked();
        c.case1_strided("unary.exp.x", |x: &T<M34>| x.exp());
        c.case1_strided("unary.relu.x", |x: &T<M34>| x.relu());
        c.case1_strided("unary.clamp.x", |x: &T<M34>| x.clamp(-0.5, 0.75));
        c.case2_strided("binary.mul.bcast", |a: &T<(C<2>, C<3>)>, b: &T<(C<3>,)>| {
            a.mul(b)
        });
        c.case2_strided(
            "binary.div.keepdim",
            |a: &T<(C<2>, C<3>)>, b: &T<(C<2>, One)>| a.div(b),
        );
        c.case2_strided(
            "binary.maximum.outer",
            |a: &T<(C<3>, One)>, b: &T<(C<4>,)>| a.maximum(b),
        );
        c.case2_strided("binary.pow.same", |a: &T<M34>, b: &T<M34>| a.pow(b));
        c.case1_strided("reduce.sum.ax0", |x: &T<R3>| x.sum::<0>());
        c.case1_strided("reduce.mean.ax2", |x: &T<R3>| x.mean::<2>());
        c.case1_strided("reduce.max.ax0", |x: &T<R3>| x.max::<0>());
        c.case1_strided("reduce.min.ax1", |x: &T<R3>| x.min::<1>());
        c.case1_strided("reduce.prod.ax0", |x: &T<R3>| x.prod::<0>());
        c.case1_strided("reduce.logsumexp.ax0", |x: &T<R3>| x.logsumexp::<0>());
        c.case1_strided("reduce.var.ax0b", |x: &T<R3>| x.var::<0>(false));
        c.case1_strided("reduce.std.ax0b", |x: &T<R3>| x.std::<0>(false));
        c.case1_strided("softmax.softmax.big", |x: &T<M34>| x.softmax::<1>());
        c.case1_strided("softmax.log_softmax.big", |x: &T<M34>| x.log_softmax::<1>());
        c.case2_strided("matmul.mm", |a: &T<(C<2>, C<3>)>, b: &T<(C<3>, C<4>)>| {
            a.matmul(b)
        });
        c.case2_strided(
            "matmul.t_left",
            |a: &T<(C<3>, C<2>)>, b: &T<(C<3>, C<4>)>| a.t().matmul(b),
        );
        c.case2_strided(
            "matmul.t_right",
            |a: &T<(C<2>, C<3>)>, b: &T<(C<4>, C<3>)>| a.matmul(&b.t()),
        );
        let idx: I<(C<5>,)> = c.konst("index.index_select0.idx");
        c.case1_strided("index.index_select0", |x: &T<(C<4>, C<3>)>| {
            x.index_select::<0, _>(&idx)
        });
        let idx: I<(C<3>,)> = c.konst("index.index_select1.idx");
        c.case1_strided("index.index_select1", |x: &T<M34>| {
            x.index_select::<1, _>(&idx)
        });
        let idx: I<(C<3>, C<5>)> = c.konst("index.gather1.idx");
        c.case1_strided("index.gather1", |x: &T<M34>| x.gather::<1, _>(&idx));
        let idx: I<(C<3>, C<3>)> = c.konst("index.scatter_add0.idx");
        c.case2_strided(
            "index.scatter_add0",
            |x: &T<(C<4>, C<3>)>, s: &T<(C<3>, C<3>)>| x.scatter_add::<0, _>(&idx, s),
        );
        c.case2_strided("cat.cat1", |a: &T<(C<2>, Dyn)>, b: &T<(C<2>, Dyn)>| {
            forma::cat::<1, _, _>(&[a.clone(), b.clone()])
        });
        c.case1_strided("view.t", |x: &T<M34>| x.t());
        c.case1_strided("view.narrow", |x: &T<(C<3>, C<5>)>| x.narrow::<1>(1, 3));
        c.case1_strided("view.slice1", |x: &T<(C<4>, C<5>)>| x.slice::<1>(1, 5, 2));
        c.case1_strided("view.reshape", |x: &T<(C<2>, C<6>)>| {
            x.reshape::<(C<3>, C<4>)>()
        });
        c.case1_strided("view.flatten", |x: &T<R3>| x.flatten::<C<12>>());
        c.case1_strided("view.contiguous", |x: &T<M34>| x.t().contiguous());
        c.case1_strided("view.squeeze", |x: &T<(C<3>, C<1>, C<4>)>| x.squeeze::<1>());
        let cond: B<M34> = c.konst("cmp.where.cond");
        c.case2_strided("cmp.where", |a: &T<M34>, b: &T<M34>| {
            where_cond(&cond, a, b)
        });
        let mask: B<M34> = c.konst("cmp.masked_fill.mask");
        c.case1_strided("cmp.masked_fill", |x: &T<M34>| x.masked_fill(&mask, -1.5));
        c.case1_strided("twice.matmul_self", |x: &T<(C<3>, C<3>)>| x.matmul(x));
        c.case1_strided("twice.div_sum_keepdim", |x: &T<M34>| {
            x / &x.sum_keepdim::<1>()
        });
        c.finish();
    }

    #[test]
    fn conv() {
        let mut c = Fx::new("conv");
        c.case2(
            "conv.conv2d",
            |x: &T<(C<2>, C<3>, C<6>, C<6>)>, w: &T<(C<4>, C<3>, C<3>, C<3>)>| {
                x.conv2d(w, Conv2dParams::default())
            },
        );
        c.case2(
            "conv.conv2d_s2p1",
            |x: &T<(C<1>, C<2>, C<7>, C<7>)>, w: &T<(C<3>, C<2>, C<3>, C<3>)>| {
                x.conv2d(
                    w,
                    Conv2dParams {
                        stride: [2, 2],
                        padding: [1, 1],
                        ..Default::default()
                    },
                )
            },
        );
        c.case2(
            "conv.conv2d_dil",
            |x: &T<(C<1>, C<2>, C<7>, C<7>)>, w: &T<(C<2>, C<2>, C<3>, C<3>)>| {
                x.conv2d(
                    w,
                    Conv2dParams {
                        padding: [1, 1],
                        dilation: [2, 2],
                        ..Default::default()
                    },
                )
            },
        );
        c.case2(
            "conv.conv2d_groups",
            |x: &T<(C<1>, C<4>, C<5>, C<5>)>, w: &T<(C<6>, C<2>, C<3>, C<3>)>| {
                x.conv2d(
                    w,
                    Conv2dParams {
                        padding: [1, 1],
                        groups: 2,
                        ..Default::default()
                    },
                )
            },
        );
        c.case2(
            "conv.conv1d",
            |x: &T<(C<2>, C<3>, C<8>)>, w: &T<(C<4>, C<3>, C<3>)>| x.conv1d(w, 1, 1, 1, 1),
        );
        c.case2(
            "conv.conv1d_s2d2g2",
            |x: &T<(C<1>, C<2>, C<9>)>, w: &T<(C<2>, C<1>, C<3>)>| x.conv1d(w, 2, 0, 2, 2),
        );
        c.case2(
            "conv.bias",
            |x: &T<(C<2>, C<3>, C<4>, C<4>)>, b: &T<(C<3>,)>| add_channel_bias(x, b),
        );
        c.finish();
    }

    #[test]
    fn pool() {
        let mut c = Fx::new("pool");
        let p3 = Pool2dParams {
            stride: [2, 2],
            padding: [1, 1],
            ..Pool2dParams::new([3, 3])
        };
        c.case1("pool.max2", |x: &T<(C<2>, C<2>, C<6>, C<6>)>| {
            x.max_pool2d(Pool2dParams::new([2, 2]))
        });
        c.case1("pool.max3s2p1", |x: &T<(C<1>, C<2>, C<7>, C<7>)>| {
            x.max_pool2d(p3)
        });
        c.case1("pool.avg2", |x: &T<(C<2>, C<2>, C<6>, C<6>)>| {
            x.avg_pool2d(Pool2dParams::new([2, 2]))
        });
        c.case1("pool.avg3s2p1", |x: &T<(C<1>, C<2>, C<7>, C<7>)>| {
            x.avg_pool2d(p3)
        });
        c.case1("pool.avg3s2p1_nopad", |x: &T<(C<1>, C<2>, C<7>, C<7>)>| {
            x.avg_pool2d(Pool2dParams {
                count_include_pad: false,
                ..p3
            })
        });
        c.case1("pool.avg_ceil", |x: &T<(C<1>, C<1>, C<5>, C<5>)>| {
            x.avg_pool2d(Pool2dParams {
                ceil_mode: true,
                ..Pool2dParams::new([2, 2])
            })
        });
        c.case1("pool.max1d", |x: &T<(C<2>, C<3>, C<8>)>| {
            x.try_max_pool1d(2, 2, 0).unwrap()
        });
        c.case1("pool.avg1d", |x: &T<(C<2>, C<3>, C<8>)>| {
            x.try_avg_pool1d(3, 2, 1).unwrap()
        });
        c.finish();
    }
}

// ================================================================== semantics

/// A gradient cannot pass silently through a non-differentiable op.
///
/// Comparisons (`eq`, `lt`, ...) return `Tensor<_, bool>` and `argmax`/`argmin`
/// return `Tensor<_, i64>`. `requires_grad` and `backward` exist only for
/// float dtypes (`E: Float`), so `x.gt(&y).requires_grad()` or
/// `x.argmax::<1>().backward()` do not compile: a mask or an index can never
/// be a leaf or carry a gradient, and no float op consumes them as a
/// differentiable operand (`where_cond`/`masked_fill`/`gather` take them as
/// constants). The tests below check the run-time side of the same fact.
mod semantics {
    use super::*;

    fn on_tape() -> T<M34> {
        rt::<M34>(1, ANY).requires_grad().exp()
    }

    #[test]
    fn comparisons_and_argmax_are_off_the_tape() {
        let x = on_tape();
        let y = rt::<M34>(2, ANY).requires_grad();
        assert!(x.needs_grad() && y.needs_grad());
        assert!(
            !x.gt(&y).needs_grad(),
            "a bool mask must not be on the tape"
        );
        assert!(!x.eq(&x).needs_grad());
        assert!(
            !x.argmax::<1>().needs_grad(),
            "an i64 index must not be on the tape"
        );
        assert!(!x.argmin::<0>().needs_grad());
        // A mask made from tape tensors selects, but only the selected values carry gradients.
        let m = x.gt(&y);
        let z = where_cond(&m, &x, &y);
        assert!(z.needs_grad());
    }

    /// A cast records a backward that casts the gradient back, as in
    /// PyTorch: through f32 and back, the gradient reaching an f64 leaf is
    /// the f32 gradient widened.
    #[test]
    fn to_dtype_on_the_tape_casts_the_gradient_back() {
        let x = rt::<M34>(3, ANY).requires_grad();
        let y = x.to_dtype::<f32>();
        assert_eq!(y.tape_var().unwrap().grad_fn(), Some("to_dtype"));
        y.square().sum_all().backward();
        let want: Vec<f64> = x
            .to_vec()
            .iter()
            .map(|&v| f64::from(2.0 * (v as f32)))
            .collect();
        assert_eq!(x.grad().unwrap().to_vec(), want);
    }

    /// One backward crosses dtypes both ways and adds the paths: `h` is
    /// used directly (f64) and through a round trip in bf16 (whose
    /// gradient is rounded to bf16 on the way back); `h`'s own backward
    /// runs once (a second run would find its graph freed).
    #[test]
    fn a_graph_that_crosses_dtypes_accumulates_every_path_once() {
        let x = rt::<M34>(4, ANY).requires_grad();
        let h = x.mul_scalar(3.0);
        let low = h.to_dtype::<half::bf16>().mul_scalar(1.0 + 1.0 / 64.0);
        let back = low.to_dtype::<f64>();
        let w = 1.0 + 1.0 / 512.0; // not a bf16 value: rounds to 1
        let loss = (&h.sum_all() + &back.sum_all().mul_scalar(w)).sum_all();
        loss.backward();
        // d/dh = 1 + bf16(bf16(w) * (1 + 2^-6)) = 1 + (1 + 2^-6), times 3.
        let g = 3.0 * (1.0 + (1.0 + 1.0 / 64.0));
        assert_eq!(x.grad().unwrap().to_vec(), vec![g; 12]);
    }

    #[test]
    fn to_dtype_to_a_type_without_gradients_is_an_error_on_the_tape() {
        let err = on_tape().try_to_dtype::<i64>().map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("cannot carry a gradient"), "{err}");
        assert!(err.to_string().contains("detach()"), "{err}");
        // Detached or under no_grad, the same cast is fine.
        let x = on_tape();
        assert!(!x.detach().to_dtype::<i64>().needs_grad());
        let _guard = forma::core::tape::no_grad();
        assert!(!x.to_dtype::<f32>().needs_grad());
    }

    #[test]
    fn to_dtype_after_detach_or_under_no_grad_is_allowed() {
        let x = on_tape();
        let a = x.detach().to_dtype::<f32>();
        assert!(!a.needs_grad());
        assert_eq!(
            a.to_vec(),
            x.to_vec().iter().map(|&v| v as f32).collect::<Vec<_>>()
        );
        let _guard = forma::core::tape::no_grad();
        let b = x.to_dtype::<f32>();
        assert!(!b.needs_grad());
    }

    /// A device move records a backward that moves the gradient home.
    #[test]
    fn to_device_on_the_tape_moves_the_gradient_back() {
        let x = rt::<M34>(5, ANY).requires_grad();
        let y = x.exp().to_device(&Cpu);
        assert_eq!(y.tape_var().unwrap().grad_fn(), Some("to_device"));
        y.sum_all().backward();
        let want: Vec<f64> = x.to_vec().iter().map(|v| v.exp()).collect();
        assert_eq!(x.grad().unwrap().to_vec(), want);
    }

    /// Every float op either records its backward or refuses a tape input;
    /// an output silently off the tape would leave the parameters without
    /// gradients while `backward` succeeds through the rest of the graph.
    #[test]
    fn conv_and_pool_on_the_tape_record_or_refuse() {
        let x = rt::<(C<1>, C<2>, C<5>, C<5>)>(5, ANY).requires_grad();
        let w = rt::<(C<3>, C<2>, C<3>, C<3>)>(6, ANY).requires_grad();
        let b = rt::<(C<2>,)>(7, ANY).requires_grad();
        let mut silent = Vec::new();
        let mut probe = |name: &str, r: forma::Result<bool>| {
            if let Ok(false) = r {
                silent.push(name.to_string());
            }
        };
        probe(
            "conv2d",
            x.try_conv2d(&w, Conv2dParams::default())
                .map(|y| y.needs_grad()),
        );
        probe(
            "conv2d (only the weight on the tape)",
            x.detach()
                .try_conv2d(&w, Conv2dParams::default())
                .map(|y| y.needs_grad()),
        );
        probe(
            "max_pool2d",
            x.try_max_pool2d(Pool2dParams::new([2, 2]))
                .map(|y| y.needs_grad()),
        );
        probe(
            "avg_pool2d",
            x.try_avg_pool2d(Pool2dParams::new([2, 2]))
                .map(|y| y.needs_grad()),
        );
        let xb = x.detach();
        probe(
            "add_channel_bias (only the bias on the tape)",
            catch_unwind(AssertUnwindSafe(|| add_channel_bias(&xb, &b).needs_grad()))
                .map_err(|_| forma::Error::invalid("add_channel_bias", "panicked")),
        );
        assert!(
            silent.is_empty(),
            "outputs silently off the tape although an input requires a gradient: {silent:?}"
        );
    }

    /// An op whose output is not on the tape although its input is: backward
    /// must fail loudly rather than leave the input without a gradient.
    #[test]
    fn backward_from_a_tensor_off_the_tape_is_an_error() {
        let x = rt::<M34>(4, ANY);
        let err = x.sum_all().try_backward().unwrap_err();
        assert!(err.to_string().contains("requires_grad"), "{err}");
    }
}

// ================================================================== harness

/// The checks above can fail: a wrong gradient is caught by both harnesses.
mod harness {
    use super::*;

    #[test]
    fn gradcheck_catches_a_wrong_gradient() {
        let x = rt::<M34>(1, ANY);
        let mut g = Gc::default();
        // The tape sees only `x.sum_all()`; the numeric gradient also sees the detached exp.
        g.check("detached exp", &x, |x| {
            x.detach().exp().sum_all() + x.sum_all()
        });
        // Value of `wsum(x)`, tape gradient of `wsum(x.t())`: caught only
        // because the weights are not symmetric (a backward that forgot to
        // transpose would be caught the same way).
        let sq = rt::<(C<3>, C<3>)>(2, ANY);
        g.check("untransposed gradient", &sq, |x| {
            wsum(&x.t()) + (wsum(x) - wsum(&x.t())).detach()
        });
        assert_eq!((g.passed, g.failures.len()), (0, 2), "{:?}", g.failures);
    }

    #[test]
    fn fixture_comparison_catches_a_wrong_gradient() {
        let mut c = Fx::picked();
        c.case1("unary.exp.x", |x: &T<M34>| {
            x.exp().detach() + x - x.detach()
        });
        c.case1("unary.sin.x", |x: &T<M34>| x.sin());
        assert_eq!(c.failures.len(), 1, "{:?}", c.failures);
        assert!(
            c.failures[0].starts_with("unary.exp.x: grad0"),
            "{:?}",
            c.failures
        );
    }
}
