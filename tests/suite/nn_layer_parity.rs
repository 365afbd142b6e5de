//! Parity of every layer in `nn::layers` (attention, transformer and
//! recurrent layers have their own suite) with PyTorch, from
//! `tools/fixtures/layers.safetensors` (written by
//! `tools/gen_layer_fixtures.py`; its docstring gives the key conventions).
//!
//! For each case, in float64:
//! - the PyTorch module's `state_dict` is loaded with a strict
//!   `load_state_dict` (so the key names and shapes must be PyTorch's), and
//!   the layer's own `state_dict` keys and shapes, in order, and its `repr()`
//!   must equal PyTorch's `state_dict()` and `str(module)`;
//! - the forward output, and the gradients of `sum(y * gy)` (a fixed random
//!   `gy`) with respect to every float input and every parameter (every one
//!   the layer has, and every one PyTorch has) must match PyTorch's within
//!   rtol 1e-10 / atol 1e-12: the results differ from PyTorch's only by
//!   summation order (and, for the normalisations, PyTorch's `x * scale +
//!   shift` rewrite), a few units in the last place of values of order one;
//! - BatchNorm in training mode must also leave PyTorch's running statistics
//!   and `num_batches_tracked` behind.
//!
//! Dropout's training mode is random, so its keep rate and scaling are
//! checked statistically. Besides parity: the transposed convolution passes
//! `gradcheck` for its input and weight and refuses bad options with an error;
//! the default initialisations have PyTorch's bounds; an embedding index out
//! of range is an error value.

use crate::common;

use common::*;
use forma::core::ops::conv::ConvTranspose2dParams;
use forma::core::tape::{gradcheck, no_grad, GradcheckOptions};
use forma::core::Backend;
use forma::nn::layers::{
    AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, BatchNorm1d, BatchNorm2d, BatchNormOptions, Bilinear,
    Conv1d, Conv2d, Conv2dRect, ConvTranspose2d, Dropout, Embedding, Flatten, Gelu, GeluTanh,
    GroupNorm, Identity, LayerNorm, LeakyRelu, Linear, LogSoftmax, MaxPool1d, MaxPool2d,
    MaxUnpool2d, PaddingMode, RMSNorm, Relu, Sigmoid, Silu, Softmax, Tanh,
};
use forma::nn::module::{downcast_ref, Cx, Visitor};
use forma::nn::{Role, StateDict};
use forma::prelude::*;
use forma::TensorData;
use std::marker::PhantomData;
use std::sync::OnceLock;

/// f64 against f64: see the module docs for why this is not exact.
const TOL: Tol = Tol {
    rtol: 1e-10,
    atol: 1e-12,
};

fn fixture() -> &'static Fixture {
    static FX: OnceLock<Fixture> = OnceLock::new();
    FX.get_or_init(|| Fixture::load("layers"))
}

fn rng() -> Rng {
    Rng::seed_from(7)
}

// ================================================================== harness

/// Loads `case.sd.*` into `m` with a strict `load_state_dict`, then compares
/// the layer's `state_dict` keys and shapes and its repr with PyTorch's.
fn load<M: Module>(case: &str, m: &mut M, ck: &mut Checks) {
    let fx = fixture();
    let prefix = format!("{case}.sd.");
    let mut sd = StateDict::new();
    for key in fx.keys() {
        let Some(name) = key.strip_prefix(&prefix) else {
            continue;
        };
        let data = if name.ends_with("num_batches_tracked") {
            let a = fx.array::<i64>(&key);
            TensorData::from_vec(&a.data, a.shape)
        } else {
            let a = fx.array::<f64>(&key);
            TensorData::from_vec(&a.data, a.shape)
        };
        sd.insert(name, data.expect("the fixture's values fill their shape"));
    }
    if let Err(e) = m.load_state_dict(&sd) {
        ck.fail(format!(
            "{case}: load_state_dict refused PyTorch's state_dict: {e}"
        ));
    }
    check_keys_and_repr(case, m, ck);
}

/// The layer's `state_dict` keys and shapes and its repr against PyTorch's.
fn check_keys_and_repr<M: Module>(case: &str, m: &M, ck: &mut Checks) {
    let meta = fixture().metadata();
    let got: Vec<String> = m
        .state_dict()
        .iter()
        .map(|(k, d)| {
            let dims: Vec<String> = d.dims().iter().map(|n| n.to_string()).collect();
            format!("{k}:{}", dims.join("x"))
        })
        .collect();
    let got = got.join(";");
    match meta.get(&format!("{case}.keys")) {
        Some(want) if *want == got => {}
        want => ck.fail(format!(
            "{case}: state_dict keys {got:?}, PyTorch's {want:?}"
        )),
    }
    let repr = m.repr();
    match meta.get(&format!("{case}.repr")) {
        Some(want) if *want == repr => {}
        want => ck.fail(format!("{case}: repr {repr:?}, PyTorch's {want:?}")),
    }
}

/// Compares the output with `case.y` and backpropagates `case.gy` from it
/// (the gradient of `sum(y * gy)`).
fn backward<S: Shape, D: TestDevice>(case: &str, y: &Tensor<S, f64, D>, dev: &D, ck: &mut Checks) {
    let fx = fixture();
    ck.close(y, &format!("{case}.y"), TOL);
    let gy = fx.tensor::<S, f64, D>(&format!("{case}.gy"), dev);
    if let Err(e) = y.try_backward_with(&gy) {
        ck.fail(format!("{case}: backward failed: {e}"));
    }
}

/// Compares the gradient an input received with `case.grad.<name>`.
fn input_grad<S: Shape, D: TestDevice>(
    case: &str,
    name: &str,
    x: &Tensor<S, f64, D>,
    ck: &mut Checks,
) {
    let key = format!("{case}.grad.{name}");
    match x.grad() {
        Some(g) => ck.close(&g, &key, TOL),
        None => ck.fail(format!("{key}: the input received no gradient")),
    }
}

/// Compares every parameter's gradient with `case.grad.<dotted name>`, and
/// checks that PyTorch has no parameter gradient the layer lacks.
fn param_grads<M: Module, D: TestDevice>(case: &str, m: &M, inputs: &[&str], ck: &mut Checks) {
    struct Grads<'a, D> {
        case: &'a str,
        seen: Vec<String>,
        failures: Vec<String>,
        passed: usize,
        _device: PhantomData<D>,
    }
    impl<D: TestDevice> Visitor for Grads<'_, D> {
        fn tensor<S: Shape, E: Dtype, B: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, B>) {
            if cx.role() != Role::Parameter {
                return;
            }
            let key = format!("{}.grad.{}", self.case, cx.path());
            self.seen.push(cx.path().to_string());
            let Some(t) = downcast_ref::<S, E, B, f64, D>(t) else {
                self.failures
                    .push(format!("{key}: not an f64 tensor on the test device"));
                return;
            };
            if !fixture().has(&key) {
                self.failures
                    .push(format!("{key}: PyTorch has no such parameter"));
                return;
            }
            match t.grad() {
                None => self.failures.push(format!("{key}: no gradient")),
                Some(g) => match fixture().compare(&g, &key, TOL) {
                    Ok(()) => self.passed += 1,
                    Err(msg) => self.failures.push(format!("{key}: {msg}")),
                },
            }
        }
    }
    let mut v = Grads::<D> {
        case,
        seen: Vec::new(),
        failures: Vec::new(),
        passed: 0,
        _device: PhantomData,
    };
    m.visit(&mut Cx::new(), &mut v);
    for f in v.failures {
        ck.fail(f);
    }
    let prefix = format!("{case}.grad.");
    for key in fixture().keys() {
        if let Some(name) = key.strip_prefix(&prefix) {
            if !inputs.contains(&name) && !v.seen.iter().any(|s| s == name) {
                ck.fail(format!("{key}: PyTorch's parameter `{name}` is missing"));
            }
        }
    }
}

/// The `state_dict` after a training step against PyTorch's (`case.after.*`).
fn check_after<M: Module>(case: &str, m: &M, ck: &mut Checks) {
    let fx = fixture();
    for (k, d) in m.state_dict().iter() {
        let key = format!("{case}.after.{k}");
        let result = if k.ends_with("num_batches_tracked") {
            close(&d.to_vec::<i64>(), &fx.i64(&key).0, EXACT)
        } else {
            close(&d.to_vec::<f64>(), &fx.f64(&key).0, TOL)
        };
        if let Err(msg) = result {
            ck.fail(format!("{key}: {msg}"));
        }
    }
}

/// A one-input layer: load, forward `case.x` as `SX` (the output typed `SY`),
/// backward, and compare the output and every gradient.
fn one_input<M, SX, SY, D>(case: &str, mut m: M, dev: &D, ck: &mut Checks) -> M
where
    M: Module + Forward<Tensor<SX, f64, D>, Tensor<SY, f64, D>>,
    SX: Shape,
    SY: Shape,
    D: TestDevice,
{
    load(case, &mut m, ck);
    let x = fixture()
        .tensor::<SX, f64, D>(&format!("{case}.x"), dev)
        .requires_grad();
    let y = m.forward(x.clone());
    backward(case, &y, dev, ck);
    input_grad(case, "x", &x, ck);
    param_grads::<M, D>(case, &m, &["x"], ck);
    m
}

type T<S, D> = Tensor<S, f64, D>;

/// Every size `Dyn`: the unpooling cases' maps.
type Map<D> = T<Shape![Dyn, Dyn, Dyn, Dyn], D>;

/// Pools `case.x` with indices, unpools, backpropagates `case.gu`, and
/// compares the values, the indices, the map, the input's gradient and the
/// unpooling layer's repr with PyTorch's.
#[allow(clippy::type_complexity)]
fn unpool_case<D: TestDevice>(
    case: &str,
    dev: &D,
    ck: &mut Checks,
    pool: impl Fn(Map<D>) -> (Map<D>, Tensor<Shape![Dyn, Dyn, Dyn, Dyn], i64, D>),
    unpool: impl Fn((Map<D>, Tensor<Shape![Dyn, Dyn, Dyn, Dyn], i64, D>)) -> (Map<D>, String),
) {
    let fx = fixture();
    let x = fx
        .tensor::<Shape![Dyn, Dyn, Dyn, Dyn], f64, D>(&format!("{case}.x"), dev)
        .requires_grad();
    let (y, idx) = pool(x.clone());
    ck.close(&y, &format!("{case}.y"), TOL);
    if let Err(msg) = close(&idx.to_vec(), &fx.i64(&format!("{case}.idx")).0, EXACT) {
        ck.fail(format!("{case}.idx: {msg}"));
    }
    let (u, repr) = unpool((y, idx));
    ck.close(&u, &format!("{case}.u"), TOL);
    let gu = fx.tensor::<Shape![Dyn, Dyn, Dyn, Dyn], f64, D>(&format!("{case}.gu"), dev);
    if let Err(e) = u.try_backward_with(&gu) {
        ck.fail(format!("{case}: backward failed: {e}"));
    }
    input_grad(case, "x", &x, ck);
    match fx.metadata().get(&format!("{case}.repr")) {
        Some(want) if *want == repr => {}
        want => ck.fail(format!("{case}: repr {repr:?}, PyTorch's {want:?}")),
    }
}

/// [`one_input`] for one case, the shapes written as in `Shape!`:
/// `check!(ck, dev, "case", layer, [Dyn, 3, 6, 6] => [Dyn, 3, 3, 3])`.
macro_rules! check {
    ($ck:ident, $dev:ident, $case:literal, $layer:expr, [$($x:tt)*] => [$($y:tt)*]) => {
        one_input::<_, Shape![$($x)*], Shape![$($y)*], _>($case, $layer, $dev, &mut $ck)
    };
}

// ================================================================== layers

device_tests! {
    /// Linear with and without a bias, on 2-d and 3-d inputs.
    fn linear<D>(dev) {
        let mut ck = Checks::new(fixture());
        let m = Linear::<5, 3, f64, D>::new(dev, &mut rng());
        let m = check!(ck, dev, "linear", m, [Dyn, 5] => [Dyn, 3]);
        // Without the tape, the bias added inside the product (where the
        // backend fuses it).
        {
            let _g = no_grad();
            let x = fixture().tensor::<Shape![Dyn, 5], f64, D>("linear.x", dev);
            ck.close(&m.forward(x), "linear.y", TOL);
        }
        let m = Linear::<5, 3, f64, D>::with_bias(false, dev, &mut rng());
        check!(ck, dev, "linear_nobias", m, [Dyn, 3, 5] => [Dyn, 3, 3]);
        ck.finish();
    }

    /// Bilinear with and without a bias, on 2-d and 3-d input pairs.
    fn bilinear<D>(dev) {
        let mut ck = Checks::new(fixture());
        let fx = fixture();
        let case = "bilinear";
        let mut m = Bilinear::<3, 4, 2, f64, D>::new(dev, &mut rng());
        load(case, &mut m, &mut ck);
        let x1 = fx.tensor::<Shape![Dyn, 3], f64, D>("bilinear.x1", dev).requires_grad();
        let x2 = fx.tensor::<Shape![Dyn, 4], f64, D>("bilinear.x2", dev).requires_grad();
        let y: T<Shape![Dyn, 2], D> = m.forward((x1.clone(), x2.clone()));
        backward(case, &y, dev, &mut ck);
        input_grad(case, "x1", &x1, &mut ck);
        input_grad(case, "x2", &x2, &mut ck);
        param_grads::<_, D>(case, &m, &["x1", "x2"], &mut ck);

        let case = "bilinear_nobias";
        let mut m = Bilinear::<3, 4, 2, f64, D>::with_bias(false, dev, &mut rng());
        load(case, &mut m, &mut ck);
        let x1 = fx.tensor::<Shape![Dyn, 3, 3], f64, D>("bilinear_nobias.x1", dev).requires_grad();
        let x2 = fx.tensor::<Shape![Dyn, 3, 4], f64, D>("bilinear_nobias.x2", dev).requires_grad();
        let y: T<Shape![Dyn, 3, 2], D> = m.forward((x1.clone(), x2.clone()));
        backward(case, &y, dev, &mut ck);
        input_grad(case, "x1", &x1, &mut ck);
        input_grad(case, "x2", &x2, &mut ck);
        param_grads::<_, D>(case, &m, &["x1", "x2"], &mut ck);
        ck.finish();
    }

    /// Conv1d with stride, padding, dilation and groups, and a plain one
    /// without a bias.
    fn conv1d<D>(dev) {
        let mut ck = Checks::new(fixture());
        let m = Conv1d::<4, 6, 3, 2, 1, 2, f64, D>::with_options(2, true, dev, &mut rng());
        check!(ck, dev, "conv1d", m, [Dyn, 4, 11] => [Dyn, 6, 5]);
        let m = Conv1d::<3, 2, 3, 1, 0, 1, f64, D>::with_options(1, false, dev, &mut rng());
        check!(ck, dev, "conv1d_plain", m, [Dyn, 3, 7] => [Dyn, 2, 5]);
        ck.finish();
    }

    /// Conv2d with stride and padding, and with dilation and groups.
    fn conv2d<D>(dev) {
        let mut ck = Checks::new(fixture());
        let m = Conv2d::<3, 4, 3, 2, 1, 1, f64, D>::new(dev, &mut rng());
        check!(ck, dev, "conv2d", m, [Dyn, 3, 7, 7] => [Dyn, 4, 4, 4]);
        let m = Conv2d::<4, 6, 3, 1, 0, 2, f64, D>::with_options(2, false, dev, &mut rng());
        check!(ck, dev, "conv2d_groups", m, [Dyn, 4, 8, 8] => [Dyn, 6, 4, 4]);
        ck.finish();
    }

    /// MaxPool2d with indices and MaxUnpool2d on them: the indices exactly,
    /// the unpooled map and the input's gradient through both, for windows
    /// that do not overlap, for overlapping ones whose maxima repeat (the
    /// last value kept, every copy given the gradient) and with PyTorch's
    /// `output_size`.
    fn max_unpool<D>(dev) {
        let mut ck = Checks::new(fixture());
        unpool_case::<D>("unpool", dev, &mut ck, |x| MaxPool2d::<2>.forward_with_indices(x), |yi| {
            (MaxUnpool2d::<2>.forward(yi), MaxUnpool2d::<2>.repr())
        });
        unpool_case::<D>("unpool_overlap", dev, &mut ck, |x| {
            MaxPool2d::<3, 2, 1>.forward_with_indices(x)
        }, |yi| (MaxUnpool2d::<3, 2, 1>.forward(yi), MaxUnpool2d::<3, 2, 1>.repr()));
        unpool_case::<D>("unpool_size", dev, &mut ck, |x| MaxPool2d::<2>.forward_with_indices(x), |yi| {
            let u = MaxUnpool2d::<2>.try_forward_with_size(yi, [5, 5]).unwrap();
            (u, MaxUnpool2d::<2>.repr())
        });
        let (y, idx): (Map<D>, _) = MaxPool2d::<2>.forward_with_indices(
            fixture().tensor::<Shape![Dyn, Dyn, Dyn, Dyn], f64, D>("unpool_size.x", dev),
        );
        if MaxUnpool2d::<2>.try_forward_with_size((y, idx), [6, 5]).is_ok() {
            ck.fail("unpool_size: an output size a stride past the default was accepted");
        }
        ck.finish();
    }

    /// Conv2d and Conv1d with the padding filled by reflection, replication
    /// or wrapping (`padding_mode`): outputs, gradients and reprs.
    fn conv_padding_modes<D>(dev) {
        let mut ck = Checks::new(fixture());
        for (case, mode) in [
            ("conv2d_reflect", PaddingMode::Reflect),
            ("conv2d_replicate", PaddingMode::Replicate),
            ("conv2d_circular", PaddingMode::Circular),
        ] {
            let m = Conv2d::<3, 4, 3, 2, 1, 1, f64, D>::new(dev, &mut rng()).padding_mode(mode);
            one_input::<_, Shape![Dyn, 3, 7, 6], Shape![Dyn, 4, 4, 3], _>(case, m, dev, &mut ck);
        }
        let m = Conv1d::<2, 3, 5, 1, 2, 2, f64, D>::with_options(1, false, dev, &mut rng())
            .padding_mode(PaddingMode::Reflect);
        check!(ck, dev, "conv1d_reflect", m, [Dyn, 2, 9] => [Dyn, 3, 5]);
        ck.finish();
    }

    /// Non-square convolutions: a kernel, stride, padding and dilation per
    /// axis; a tall kernel with reflected padding in two groups.
    fn conv2d_rect<D>(dev) {
        let mut ck = Checks::new(fixture());
        let m = Conv2dRect::<3, 4, 1, 3, 2, 1, 0, 1, 1, 2, f64, D>::new(dev, &mut rng());
        check!(ck, dev, "conv2d_rect", m, [Dyn, 3, 7, 6] => [Dyn, 4, 4, 4]);
        let m = Conv2dRect::<2, 4, 3, 1, 1, 1, 1, 0, 1, 1, f64, D>::with_options(2, false, dev, &mut rng())
            .padding_mode(PaddingMode::Reflect);
        check!(ck, dev, "conv2d_rect_reflect", m, [Dyn, 2, 5, 4] => [Dyn, 4, 5, 4]);
        ck.finish();
    }

    /// ConvTranspose2d with stride, padding, output padding and groups; with
    /// dilation and an output padding that reaches the stride; and plain.
    fn conv_transpose2d<D>(dev) {
        let mut ck = Checks::new(fixture());
        let mut r = rng();
        let m = ConvTranspose2d::<4, 6, 3, 2, 1, 1, 1, f64, D>::with_options(2, true, dev, &mut r);
        check!(ck, dev, "convt", m, [Dyn, 4, 4, 4] => [Dyn, 6, 8, 8]);
        let m = ConvTranspose2d::<2, 3, 3, 1, 0, 1, 2, f64, D>::with_options(1, false, dev, &mut r);
        check!(ck, dev, "convt_dilated", m, [Dyn, 2, 4, 4] => [Dyn, 3, 9, 9]);
        let m = ConvTranspose2d::<3, 2, 2, 1, 0, 0, 1, f64, D>::new(dev, &mut r);
        check!(ck, dev, "convt_plain", m, [Dyn, 3, 3, 3] => [Dyn, 2, 4, 4]);
        ck.finish();
    }

    /// Max and average pooling, 1-d and 2-d, with and without padding.
    fn pooling<D>(dev) {
        let mut ck = Checks::new(fixture());
        check!(ck, dev, "maxpool2d", MaxPool2d::<2>, [Dyn, 3, 6, 6] => [Dyn, 3, 3, 3]);
        check!(ck, dev, "maxpool2d_pad", MaxPool2d::<3, 2, 1>, [Dyn, 2, 7, 7] => [Dyn, 2, 4, 4]);
        check!(ck, dev, "avgpool2d", AvgPool2d::<2>, [Dyn, 3, 6, 6] => [Dyn, 3, 3, 3]);
        check!(ck, dev, "avgpool2d_pad", AvgPool2d::<3, 2, 1>, [Dyn, 2, 7, 7] => [Dyn, 2, 4, 4]);
        check!(ck, dev, "maxpool2d_dil_ceil", MaxPool2d::<3, 2, 1, 2, true>, [Dyn, 2, 8, 9] => [Dyn, 2, 4, 4]);
        check!(ck, dev, "avgpool2d_ceil_nopad", AvgPool2d::<3, 2, 1, true, false>, [Dyn, 2, 6, 7] => [Dyn, 2, 4, 4]);
        check!(ck, dev, "maxpool1d", MaxPool1d::<2>, [Dyn, 3, 8] => [Dyn, 3, 4]);
        check!(ck, dev, "maxpool1d_pad", MaxPool1d::<3, 2, 1>, [Dyn, 3, 9] => [Dyn, 3, 5]);
        check!(ck, dev, "avgpool1d", AvgPool1d::<2>, [Dyn, 3, 8] => [Dyn, 3, 4]);
        check!(ck, dev, "avgpool1d_pad", AvgPool1d::<3, 2, 1>, [Dyn, 3, 9] => [Dyn, 3, 5]);
        ck.finish();
    }

    /// Adaptive average pooling: uneven windows (down and up), even windows,
    /// and global pooling.
    fn adaptive_avg_pool2d<D>(dev) {
        let mut ck = Checks::new(fixture());
        let m = AdaptiveAvgPool2d::<3, 2>;
        check!(ck, dev, "adaptive", m, [Dyn, 3, 7, 5] => [Dyn, 3, 3, 2]);
        let m = AdaptiveAvgPool2d::<4, 3>;
        check!(ck, dev, "adaptive_up", m, [Dyn, 2, 3, 2] => [Dyn, 2, 4, 3]);
        let m = AdaptiveAvgPool2d::<2, 2>;
        check!(ck, dev, "adaptive_div", m, [Dyn, 2, 6, 4] => [Dyn, 2, 2, 2]);
        let m = AdaptiveAvgPool2d::<1, 1>;
        check!(ck, dev, "adaptive_global", m, [Dyn, 3, 5, 5] => [Dyn, 3, 1, 1]);
        ck.finish();
    }

    /// BatchNorm2d in training mode (batch statistics, running statistics
    /// updated like PyTorch's) and in eval mode (running statistics).
    fn batch_norm2d<D>(dev) {
        let mut ck = Checks::new(fixture());
        let m = BatchNorm2d::<3, f64, D>::new(dev);
        let m = check!(ck, dev, "bn2d_train", m, [Dyn, 3, 3, 3] => [Dyn, 3, 3, 3]);
        check_after("bn2d_train", &m, &mut ck);
        let mut m = BatchNorm2d::<3, f64, D>::new(dev);
        m.eval();
        let m = check!(ck, dev, "bn2d_eval", m, [Dyn, 3, 3, 3] => [Dyn, 3, 3, 3]);
        if m.num_batches_tracked.as_ref().map(Tensor::item) != Some(0) {
            ck.fail("bn2d_eval: eval mode counted a batch");
        }
        ck.finish();
    }

    /// BatchNorm1d on `[n, c]` and `[n, c, l]`, in training and eval mode.
    fn batch_norm1d<D>(dev) {
        let mut ck = Checks::new(fixture());
        let m = BatchNorm1d::<4, f64, D>::new(dev);
        let m = check!(ck, dev, "bn1d_train", m, [Dyn, 4] => [Dyn, 4]);
        check_after("bn1d_train", &m, &mut ck);
        let m = BatchNorm1d::<4, f64, D>::new(dev);
        let m = check!(ck, dev, "bn1d_train_3d", m, [Dyn, 4, 5] => [Dyn, 4, 5]);
        check_after("bn1d_train_3d", &m, &mut ck);
        let mut m = BatchNorm1d::<4, f64, D>::new(dev);
        m.eval();
        check!(ck, dev, "bn1d_eval", m, [Dyn, 4] => [Dyn, 4]);
        let mut m = BatchNorm1d::<4, f64, D>::new(dev);
        m.eval();
        check!(ck, dev, "bn1d_eval_3d", m, [Dyn, 4, 5] => [Dyn, 4, 5]);
        ck.finish();
    }

    /// The norms' options: BatchNorm without affine parameters (training),
    /// without a bias (eval), with a cumulative average (`momentum=None`,
    /// three batches already counted), without running statistics (the
    /// batch's used in eval mode too; none kept in training); LayerNorm
    /// without affine parameters and without a bias.
    fn norm_options<D>(dev) {
        let mut ck = Checks::new(fixture());
        let opts = BatchNormOptions::default();
        let m = BatchNorm2d::<3, f64, D>::with_options(BatchNormOptions { affine: false, ..opts }, dev);
        let m = check!(ck, dev, "bn2d_noaffine_train", m, [Dyn, 3, 3, 3] => [Dyn, 3, 3, 3]);
        check_after("bn2d_noaffine_train", &m, &mut ck);
        let mut m = BatchNorm2d::<3, f64, D>::with_options(BatchNormOptions { bias: false, ..opts }, dev);
        m.eval();
        check!(ck, dev, "bn2d_nobias_eval", m, [Dyn, 3, 3, 3] => [Dyn, 3, 3, 3]);
        let m = BatchNorm1d::<4, f64, D>::with_options(BatchNormOptions { momentum: None, ..opts }, dev);
        let m = check!(ck, dev, "bn1d_cma_train", m, [Dyn, 4] => [Dyn, 4]);
        check_after("bn1d_cma_train", &m, &mut ck);
        let stateless = BatchNormOptions { track_running_stats: false, ..opts };
        let mut m = BatchNorm2d::<3, f64, D>::with_options(stateless, dev);
        m.eval();
        check!(ck, dev, "bn2d_nostats_eval", m, [Dyn, 3, 3, 3] => [Dyn, 3, 3, 3]);
        let plain = BatchNormOptions { momentum: None, affine: false, ..stateless };
        let m = BatchNorm1d::<4, f64, D>::with_options(plain, dev);
        let m = check!(ck, dev, "bn1d_plain_train", m, [Dyn, 4, 5] => [Dyn, 4, 5]);
        if !m.state_dict().is_empty() {
            ck.fail("bn1d_plain_train: a layer without running statistics kept some");
        }
        let m = LayerNorm::<6, f64, D>::with_options(1e-5, false, true, dev);
        check!(ck, dev, "layernorm_plain", m, [Dyn, 3, 6] => [Dyn, 3, 6]);
        let m = LayerNorm::<6, f64, D>::with_options(1e-5, true, false, dev);
        check!(ck, dev, "layernorm_nobias", m, [Dyn, 6] => [Dyn, 6]);
        ck.finish();
    }

    /// LayerNorm, GroupNorm (4-d, 3-d and 2-d inputs, with and without the
    /// affine parameters) and RMSNorm (eps None, which is f64's epsilon, and
    /// a stated eps).
    fn normalisation<D>(dev) {
        let mut ck = Checks::new(fixture());
        let m = LayerNorm::<6, f64, D>::new(dev);
        let m = check!(ck, dev, "layernorm", m, [Dyn, 3, 6] => [Dyn, 3, 6]);
        // Without the tape, the fused kernel (where the backend has one).
        {
            let _g = no_grad();
            let x = fixture().tensor::<Shape![Dyn, 3, 6], f64, D>("layernorm.x", dev);
            ck.close(&m.forward(x), "layernorm.y", TOL);
        }
        let m = GroupNorm::<2, 6, f64, D>::new(dev);
        check!(ck, dev, "groupnorm", m, [Dyn, 6, 3, 3] => [Dyn, 6, 3, 3]);
        let m = GroupNorm::<3, 6, f64, D>::new(dev);
        check!(ck, dev, "groupnorm_3d", m, [Dyn, 6, 4] => [Dyn, 6, 4]);
        let m = GroupNorm::<2, 4, f64, D>::with_options(1e-5, false, dev);
        check!(ck, dev, "groupnorm_plain", m, [Dyn, 4] => [Dyn, 4]);
        let m = RMSNorm::<6, f64, D>::new(dev);
        check!(ck, dev, "rmsnorm", m, [Dyn, 3, 6] => [Dyn, 3, 6]);
        let m = RMSNorm::<5, f64, D>::with_eps(Some(1e-6), dev);
        check!(ck, dev, "rmsnorm_eps", m, [Dyn, 5] => [Dyn, 5]);
        let m = RMSNorm::<3, f64, D>::new(dev);
        check!(ck, dev, "rmsnorm_tiny", m, [Dyn, 3] => [Dyn, 3]);
        ck.finish();
    }

    /// Embedding, and with a padding row: read by the forward, but no
    /// gradient reaches it (PyTorch's gradient there is zero).
    fn embedding<D>(dev) {
        let mut ck = Checks::new(fixture());
        let fx = fixture();
        for (case, padding) in [("embedding", None), ("embedding_pad", Some(2))] {
            let mut m = Embedding::<10, 4, f64, D>::with_padding_idx(padding, dev, &mut rng());
            load(case, &mut m, &mut ck);
            let idx = fx.tensor::<Shape![Dyn, 5], i64, D>(&format!("{case}.idx"), dev);
            let y: T<Shape![Dyn, 5, 4], D> = m.forward(idx);
            backward(case, &y, dev, &mut ck);
            param_grads::<_, D>(case, &m, &[], &mut ck);
        }
        ck.finish();
    }

    /// Embedding with `max_norm`: the rows read are rescaled in place before
    /// the lookup (the table after the forward is PyTorch's), in the 2-norm
    /// and the 1-norm; the gradient is the plain lookup's.
    fn embedding_max_norm<D>(dev) {
        let mut ck = Checks::new(fixture());
        let fx = fixture();
        for (case, max_norm, p) in [("embedding_maxnorm", 1.5, 2.0), ("embedding_maxnorm_l1", 2.0, 1.0)] {
            let mut m = Embedding::<10, 4, f64, D>::new(dev, &mut rng()).max_norm(max_norm, p);
            load(case, &mut m, &mut ck);
            let idx = fx.tensor::<Shape![Dyn, 5], i64, D>(&format!("{case}.idx"), dev);
            let y: T<Shape![Dyn, 5, 4], D> = m.forward(idx);
            ck.close(&m.weight, &format!("{case}.after.weight"), TOL);
            backward(case, &y, dev, &mut ck);
            param_grads::<_, D>(case, &m, &[], &mut ck);
        }
        ck.finish();
    }

    /// Every activation, softmax and log-softmax along a positive and a
    /// negative dim.
    fn activations<D>(dev) {
        let mut ck = Checks::new(fixture());
        check!(ck, dev, "relu", Relu, [Dyn, 4, 5] => [Dyn, 4, 5]);
        check!(ck, dev, "gelu", Gelu, [Dyn, 4, 5] => [Dyn, 4, 5]);
        check!(ck, dev, "gelu_tanh", GeluTanh, [Dyn, 4, 5] => [Dyn, 4, 5]);
        check!(ck, dev, "tanh", Tanh, [Dyn, 4, 5] => [Dyn, 4, 5]);
        check!(ck, dev, "sigmoid", Sigmoid, [Dyn, 4, 5] => [Dyn, 4, 5]);
        check!(ck, dev, "silu", Silu, [Dyn, 4, 5] => [Dyn, 4, 5]);
        check!(ck, dev, "identity", Identity, [Dyn, 4, 5] => [Dyn, 4, 5]);
        check!(ck, dev, "leaky_relu", LeakyRelu::default(), [Dyn, 4, 5] => [Dyn, 4, 5]);
        check!(ck, dev, "leaky_relu_02", LeakyRelu::new(0.2), [Dyn, 4, 5] => [Dyn, 4, 5]);
        check!(ck, dev, "softmax_last", Softmax::<-1>, [Dyn, 4, 5] => [Dyn, 4, 5]);
        check!(ck, dev, "softmax_1", Softmax::<1>, [Dyn, 4, 5] => [Dyn, 4, 5]);
        check!(ck, dev, "log_softmax_1", LogSoftmax::<1>, [Dyn, 4, 5] => [Dyn, 4, 5]);
        check!(ck, dev, "log_softmax_last", LogSoftmax::<-1>, [Dyn, 4, 5] => [Dyn, 4, 5]);
        ck.finish();
    }

    /// Flatten, and Dropout in eval mode (the identity, gradient included).
    fn flatten_and_dropout_eval<D>(dev) {
        let mut ck = Checks::new(fixture());
        check!(ck, dev, "flatten", Flatten, [Dyn, 3, 4, 5] => [Dyn, 60]);
        let mut drop = Dropout::new(0.3, &mut rng());
        drop.eval();
        check!(ck, dev, "dropout_eval", drop, [Dyn, 5] => [Dyn, 5]);
        ck.finish();
    }

    /// Dropout in training mode keeps `1 - p` of the elements, scales them by
    /// `1 / (1 - p)`, and passes the gradient through the same mask.
    fn dropout_train<D>(dev) {
        let mut ck = Checks::new(fixture());
        let drop = Dropout::new(0.25, &mut rng());
        check_keys_and_repr("dropout_train", &drop, &mut ck);
        let n = 100_000;
        let x = T::<(Dyn,), D>::ones_on((Dyn(n),), dev).requires_grad();
        let y = drop.forward(x.clone());
        let yv = y.to_vec();
        let kept = yv.iter().filter(|v| **v != 0.0).count() as f64 / n as f64;
        // 4.6 standard deviations of the binomial rate (sqrt(p (1 - p) / n) = 0.00137).
        assert!((kept - 0.75).abs() < 0.0063, "kept {kept}");
        let scaled = yv.iter().all(|v| *v == 0.0 || *v == 1.0 / 0.75);
        assert!(scaled, "kept values are scaled by 1 / (1 - p)");
        y.try_backward_with(&y.ones_like()).unwrap();
        assert_eq!(x.grad().unwrap().to_vec(), yv, "the gradient goes through the same mask");
        // Only failures were recorded here (no fixture comparison).
        if ck.count() > 0 {
            ck.finish();
        }
    }
}

// ================================================================== beyond parity

device_tests! {
    /// The transposed convolution's gradients against finite differences, for
    /// its input and its weight, over stride, padding, output padding,
    /// dilation (with an output padding not below the stride) and groups.
    fn conv_transpose2d_gradcheck<D>(dev) {
        let opts = GradcheckOptions { eps: 1e-6, atol: 1e-8, rtol: 1e-6 };
        let cases = [
            ([2, 2], [1, 1], [1, 1], [1, 1], 2),
            ([1, 2], [0, 1], [1, 0], [2, 1], 1),
            ([3, 1], [1, 0], [2, 0], [1, 2], 1),
        ];
        let mut r = rng();
        for (stride, padding, output_padding, dilation, groups) in cases {
            let p = ConvTranspose2dParams { stride, padding, output_padding, dilation, groups };
            let x = T::<Shape![2, 4, 3, 4], D>::normal_on((C, C, C, C), 0.0, 1.0, &mut r, dev);
            let wshape = (C, Dyn(4 / groups), C, C);
            let w = T::<Shape![4, Dyn, 3, 2], D>::normal_on(wshape, 0.0, 1.0, &mut r, dev);
            let y0 = x.conv_transpose2d(&w, p);
            let g = T::<Shape![2, Dyn, Dyn, Dyn], D>::normal_on(y0.shape(), 0.0, 1.0, &mut r, dev);
            let g = g.into_dyn();
            let weighted = |y: T<(C<2>, Dyn, Dyn, Dyn), D>| (&y.into_dyn() * &g).sum_all();
            gradcheck(&x, |x| weighted(x.conv_transpose2d(&w, p)), opts)
                .unwrap_or_else(|e| panic!("input gradient, {p:?}: {e}"));
            gradcheck(&w, |w| weighted(x.conv_transpose2d(w, p)), opts)
                .unwrap_or_else(|e| panic!("weight gradient, {p:?}: {e}"));
        }
    }

    /// A transposed convolution is the input gradient of a convolution: for
    /// every `u`, `<conv2d(u, w), x> = <conv_transpose2d(x, w), u>`.
    fn conv_transpose2d_is_the_adjoint_of_conv2d<D>(dev) {
        let mut r = rng();
        let p = ConvTranspose2dParams {
            stride: [2, 3],
            padding: [1, 0],
            output_padding: [1, 2],
            dilation: [1, 2],
            groups: 3,
        };
        let x = T::<(C<2>, C<6>, C<3>, C<3>), D>::normal_on((C, C, C, C), 0.0, 1.0, &mut r, dev);
        let w = T::<(C<6>, C<2>, C<3>, C<3>), D>::normal_on((C, C, C, C), 0.0, 1.0, &mut r, dev);
        let y = x.conv_transpose2d(&w, p);
        assert_eq!(y.dims()[..], [2, 6, 6, 13]);
        let u = T::<(C<2>, Dyn, Dyn, Dyn), D>::normal_on(y.shape(), 0.0, 1.0, &mut r, dev);
        let cu = u.conv2d(&w, p.conv());
        let lhs = (&cu.into_dyn() * &x.into_dyn()).sum_all().item();
        let rhs = (&y.into_dyn() * &u.into_dyn()).sum_all().item();
        assert!((lhs - rhs).abs() <= 1e-10 * lhs.abs().max(1.0), "{lhs} vs {rhs}");
    }

    /// Bad transposed-convolution options are error values naming the op.
    fn conv_transpose2d_refuses_bad_options<D>(dev) {
        let x = T::<(C<1>, C<4>, C<3>, C<3>), D>::zeros_on((C, C, C, C), dev);
        let w = T::<(C<4>, C<2>, C<3>, C<3>), D>::zeros_on((C, C, C, C), dev);
        let bad = |p: ConvTranspose2dParams| x.try_conv_transpose2d(&w, p).unwrap_err().to_string();
        let p = ConvTranspose2dParams::default();
        let e = bad(ConvTranspose2dParams { stride: [2, 2], output_padding: [2, 0], ..p });
        assert!(e.contains("conv_transpose2d") && e.contains("output padding"), "{e}");
        let e = bad(ConvTranspose2dParams { groups: 3, ..p });
        assert!(e.contains("groups"), "{e}");
        let e = bad(ConvTranspose2dParams { padding: [3, 3], ..p });
        assert!(e.contains("no output"), "{e}");
        let w3 = T::<(C<3>, C<2>, C<3>, C<3>), D>::zeros_on((C, C, C, C), dev);
        assert!(x.try_conv_transpose2d(&w3, p).is_err());
        let y = x.try_conv_transpose2d(&w, ConvTranspose2dParams { groups: 2, ..p }).unwrap();
        assert_eq!(y.dims()[..], [1, 4, 5, 5]);
    }

    /// An index outside the table is an error from `try_forward`.
    fn embedding_index_out_of_range<D>(dev) {
        let m = Embedding::<10, 4, f64, D>::new(dev, &mut rng());
        let idx = Tensor::<(C<2>,), i64, D>::from_vec_on(vec![3, 10], (C,), dev).unwrap();
        let e = m.try_lookup(&idx).unwrap_err().to_string();
        assert!(e.contains("10"), "{e}");
        let idx = Tensor::<(C<2>,), i64, D>::from_vec_on(vec![3, -1], (C,), dev).unwrap();
        assert!(m.try_lookup(&idx).is_err());
    }
}

/// The largest absolute value, and whether all lie within `bound`.
fn spread(v: &[f32], bound: f32) -> (f32, bool) {
    let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    (max, v.iter().all(|x| x.abs() <= bound))
}

/// Default initialisations: PyTorch's bounds and distributions.
#[test]
fn default_inits_follow_pytorch() {
    let mut r = rng();
    // Bilinear: U(-1/sqrt(in1), 1/sqrt(in1)) for weight and bias.
    let bl = Bilinear::<16, 8, 32>::new(&Cpu, &mut r);
    let b = 1.0 / 16f32.sqrt();
    let (max, inside) = spread(&bl.weight.to_vec(), b);
    assert!(
        inside && max > 0.98 * b,
        "Bilinear weight: max {max}, bound {b}"
    );
    let (_, inside) = spread(&bl.bias.as_ref().unwrap().to_vec(), b);
    assert!(inside);
    // Conv1d: fan_in = in / groups * k.
    let c = Conv1d::<8, 16, 5>::with_options(2, true, &Cpu, &mut r);
    assert_eq!(c.weight.dims()[..], [16, 4, 5]);
    let b = 1.0 / 20f32.sqrt();
    let (max, inside) = spread(&c.weight.to_vec(), b);
    assert!(
        inside && max > 0.95 * b,
        "Conv1d weight: max {max}, bound {b}"
    );
    // ConvTranspose2d: weight [in, out / groups, k, k], fan_in = out / groups * k * k.
    let t = ConvTranspose2d::<8, 12, 3>::with_options(2, true, &Cpu, &mut r);
    assert_eq!(t.weight.dims()[..], [8, 6, 3, 3]);
    let b = 1.0 / 54f32.sqrt();
    let (max, inside) = spread(&t.weight.to_vec(), b);
    assert!(
        inside && max > 0.95 * b,
        "ConvTranspose2d weight: max {max}, bound {b}"
    );
    let (_, inside) = spread(&t.bias.as_ref().unwrap().to_vec(), b);
    assert!(inside);
    // Embedding: N(0, 1) with the padding row zeroed.
    let e = Embedding::<500, 8>::with_padding_idx(Some(3), &Cpu, &mut r);
    let w = e.weight.to_vec();
    assert!(w[24..32].iter().all(|v| *v == 0.0));
    let n = w.len() as f32;
    let mean = w.iter().sum::<f32>() / n;
    let var = w.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / n;
    assert!(
        mean.abs() < 0.05 && (var - 1.0).abs() < 0.06,
        "mean {mean}, var {var}"
    );
    // Norms: ones and zeros; BatchNorm1d's buffers as BatchNorm2d's.
    let g = GroupNorm::<4, 8>::new(&Cpu);
    assert_eq!(g.weight.as_ref().unwrap().to_vec(), vec![1.0; 8]);
    assert_eq!(g.bias.as_ref().unwrap().to_vec(), vec![0.0; 8]);
    assert_eq!(RMSNorm::<3>::new(&Cpu).weight.to_vec(), vec![1.0; 3]);
    let bn = BatchNorm1d::<2>::new(&Cpu);
    assert_eq!(bn.running_var.unwrap().to_vec(), vec![1.0; 2]);
    assert_eq!(bn.running_mean.unwrap().to_vec(), vec![0.0; 2]);
    assert_eq!(bn.num_batches_tracked.unwrap().item(), 0);
}

/// RMSNorm's `eps: None` is the element type's epsilon, as
/// `torch.finfo(dtype).eps`.
#[test]
fn rms_norm_default_eps_is_the_dtype_epsilon() {
    assert_eq!(
        RMSNorm::<2, f32>::new(&Cpu).effective_eps(),
        f32::EPSILON as f64
    );
    assert_eq!(RMSNorm::<2, f64>::new(&Cpu).effective_eps(), f64::EPSILON);
    assert_eq!(
        RMSNorm::<2, f16>::new(&Cpu).effective_eps(),
        f16::EPSILON.to_f64()
    );
    assert_eq!(
        RMSNorm::<2, f64>::with_eps(Some(1e-6), &Cpu).effective_eps(),
        1e-6
    );
}

/// The fixture records its generator and PyTorch version.
#[test]
fn fixture_provenance() {
    let meta = fixture().metadata();
    assert_eq!(
        meta.get("generator").map(String::as_str),
        Some("tools/gen_layer_fixtures.py")
    );
    assert!(meta.get("torch").is_some_and(|v| v.starts_with('2')));
}
