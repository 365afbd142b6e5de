//! Sequence layers against PyTorch (`tools/fixtures/seq_layers.safetensors`,
//! written by `tools/gen_seq_fixtures.py`), in float64: MultiheadAttention
//! (no mask, bool and float key padding and attention masks, causal,
//! `bias=False`, head-averaged weights, `add_bias_kv`, `add_zero_attn`,
//! `kdim`/`vdim`), TransformerEncoderLayer (post- and
//! pre-norm, ReLU and GELU, key padding or causal masks),
//! TransformerDecoderLayer (post- and pre-norm, causal self-attention,
//! target and memory padding masks), LSTM and GRU (2 layers, with and without
//! an initial state, bidirectional, `bias=False`; LSTM `proj_size`); and
//! `SeqFirst`, PyTorch's `batch_first=False` (LSTM, GRU, MHA, encoder and
//! decoder layers).
//!
//! Each case loads PyTorch's random weights through a strict
//! `load_state_dict` (so every key and shape must be PyTorch's), checks the
//! state_dict keys, shapes and order and the repr against PyTorch's, runs the
//! layer in eval mode, and compares the outputs and the gradients of
//! `sum_i sum(y_i * w_i)` with respect to every float input and every
//! parameter, within rtol 1e-9 / atol 1e-12 (the same math in another
//! summation order; PyTorch's attention may take a fused kernel).

use crate::common;

use common::{close, Checks, Fixture, Tol};
use forma::core::TensorData;
use forma::nn::layers::{
    Activation, AttnMasks, Gru, Lstm, Mask, MultiheadAttention, RnnOptions, SeqFirst,
    TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer,
    TransformerOptions,
};
use forma::nn::module::parameters;
use forma::nn::{Module, StateDict};
use forma::prelude::*;

const TOL: Tol = Tol {
    rtol: 1e-9,
    atol: 1e-12,
};

type Seq = Tensor<(Dyn, Dyn, C<8>), f64>;
type Seq3 = Tensor<(Dyn, Dyn, C<3>), f64>;
type Any3 = Tensor<(Dyn, Dyn, Dyn), f64>;
type Bool2 = Tensor<(Dyn, Dyn), bool>;

fn fixture() -> Fixture {
    Fixture::load("seq_layers")
}

/// PyTorch's state_dict keys and shapes for `case`, in order, from the
/// metadata's `[["key", [dims..]], ...]`.
fn torch_keys(fx: &Fixture, case: &str) -> Vec<(String, Vec<usize>)> {
    let meta = fx.metadata();
    let text = meta
        .get(&format!("{case}.keys"))
        .unwrap_or_else(|| panic!("no keys recorded for {case}"));
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    for tok in text.split(',') {
        let tok = tok.trim_matches(|c: char| c == '[' || c == ']' || c == '"' || c == ' ');
        if tok.is_empty() {
            continue;
        }
        match tok.parse::<usize>() {
            Ok(n) => out.last_mut().expect("a key comes first").1.push(n),
            Err(_) => out.push((tok.to_string(), Vec::new())),
        }
    }
    assert!(!out.is_empty(), "{case}: no keys parsed from {text}");
    out
}

/// Checks `m`'s state_dict keys, shapes and order against PyTorch's and its
/// repr against `str(module)`, then loads PyTorch's weights strictly.
fn load<M: Module>(fx: &Fixture, case: &str, m: &mut M) {
    let want = torch_keys(fx, case);
    let got: Vec<(String, Vec<usize>)> = m
        .state_dict()
        .iter()
        .map(|(k, d)| (k.to_string(), d.dims().to_vec()))
        .collect();
    assert_eq!(got, want, "{case}: state_dict keys and shapes");
    let repr = fx.metadata()[&format!("{case}.repr")].clone();
    assert_eq!(m.repr(), repr, "{case}: repr");
    let mut sd = StateDict::new();
    for (key, _) in &want {
        let a = fx.array::<f64>(&format!("{case}.p.{key}"));
        sd.insert(key.clone(), TensorData::from_vec(&a.data, a.shape).unwrap());
    }
    let report = m
        .load_state_dict(&sd)
        .expect("PyTorch's weights load strictly");
    let _ = report;
    assert!(!m.is_training(), "{case}: parity runs in eval mode");
}

/// A float input that requires grad.
fn input<S: Shape>(fx: &Fixture, case: &str, name: &str) -> Tensor<S, f64> {
    fx.tensor::<S, f64, Cpu>(&format!("{case}.x.{name}"), &Cpu)
        .requires_grad()
}

/// A constant input (masks).
fn constant<S: Shape, E: common::FixtureElem>(
    fx: &Fixture,
    case: &str,
    name: &str,
) -> Tensor<S, E> {
    fx.tensor::<S, E, Cpu>(&format!("{case}.x.{name}"), &Cpu)
}

/// Compares the outputs, then backpropagates `sum_i sum(y_i * w_i)` and
/// compares the gradients of `inputs` and of every parameter of `m`.
fn finish<M: Module>(fx: &Fixture, case: &str, m: &M, ys: &[Any3], inputs: &[(&str, &Any3)]) {
    let mut checks = Checks::new(fx);
    let mut loss: Option<Tensor<(), f64>> = None;
    for (i, y) in ys.iter().enumerate() {
        checks.close(y, &format!("{case}.y{i}"), TOL);
        let w: Any3 = fx.tensor(&format!("{case}.w{i}"), &Cpu);
        let term = (y * &w).sum_all();
        loss = Some(match loss {
            Some(l) => &l + &term,
            None => term,
        });
    }
    loss.expect("at least one output").backward();
    for (name, x) in inputs {
        match x.grad() {
            Some(g) => checks.close(&g, &format!("{case}.gx.{name}"), TOL),
            None => checks.fail(format!("{case}: input {name} got no gradient")),
        }
    }
    let want = torch_keys(fx, case);
    let params = parameters::<_, f64, Cpu>(m);
    let names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
    let want_names: Vec<&str> = want.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, want_names, "{case}: parameters");
    for p in &params {
        let key = format!("{case}.gp.{}", p.name);
        let expected = fx.array::<f64>(&key);
        match &p.grad {
            Some(g) => {
                if let Err(msg) = close(&g.to_vec(), &expected.data, TOL) {
                    checks.fail(format!("{key}: {msg}"));
                }
            }
            None => checks.fail(format!("{key}: no gradient")),
        }
    }
    checks.finish();
}

fn any3<S: Shape>(t: &Tensor<S, f64>) -> Any3 {
    t.try_into_shape().expect("rank 3")
}

/// [`finish`] for an attention case whose inputs are `q`, `k` and `v`.
fn finish_qkv<M: Module, Q: Shape, K: Shape, V: Shape>(
    fx: &Fixture,
    case: &str,
    m: &M,
    ys: &[Any3],
    (q, k, v): (&Tensor<Q, f64>, &Tensor<K, f64>, &Tensor<V, f64>),
) {
    let ins = [("q", &any3(q)), ("k", &any3(k)), ("v", &any3(v))];
    finish(fx, case, m, ys, &ins);
}

/// The case's bool key padding mask (`true` hides a key) as the only mask.
fn padding(kpm: &Bool2) -> AttnMasks<'_, Dyn, Dyn, Dyn, f64> {
    AttnMasks {
        key_padding_mask: Some(Mask::Hide(kpm)),
        ..AttnMasks::default()
    }
}

// ------------------------------------------------------------------ attention

fn mha(fx: &Fixture, case: &str, bias: bool) -> MultiheadAttention<8, 2, f64> {
    let mut m = MultiheadAttention::with_options(0.0, bias, &Cpu, &mut Rng::seed_from(0));
    m.eval();
    load(fx, case, &mut m);
    m
}

fn qkv(fx: &Fixture, case: &str) -> (Seq, Seq, Seq) {
    (
        input(fx, case, "q"),
        input(fx, case, "k"),
        input(fx, case, "v"),
    )
}

#[test]
fn mha_cross_attention_and_weights() {
    let fx = fixture();
    let case = "mha_cross";
    let m = mha(&fx, case, true);
    let (q, k, v) = qkv(&fx, case);
    let out = m.attend_with_weights(&q, &k, &v, AttnMasks::default());
    finish_qkv(
        &fx,
        case,
        &m,
        &[any3(&out.output), any3(&out.weights)],
        (&q, &k, &v),
    );
}

#[test]
fn mha_key_padding_mask() {
    let fx = fixture();
    let case = "mha_kpm";
    let m = mha(&fx, case, true);
    let (q, k, v) = qkv(&fx, case);
    let kpm: Bool2 = constant(&fx, case, "kpm");
    let y = m.attend(&q, &k, &v, Some(&kpm), false);
    finish_qkv(&fx, case, &m, &[any3(&y)], (&q, &k, &v));
}

#[test]
fn mha_causal_self_attention() {
    let fx = fixture();
    let case = "mha_causal";
    let m = mha(&fx, case, true);
    let x: Seq = input(&fx, case, "x");
    let y = m.attend_with(&x, &x, &x, AttnMasks::causal());
    finish(&fx, case, &m, &[any3(&y)], &[("x", &any3(&x))]);
}

#[test]
fn mha_float_masks_add_to_the_scores() {
    let fx = fixture();
    let case = "mha_float_masks";
    float_masks_case(&fx, case, mha(&fx, case, true));
}

/// Cross-attention under the case's additive `attn_mask` and key padding
/// mask, checked against PyTorch.
fn float_masks_case(fx: &Fixture, case: &str, m: MultiheadAttention<8, 2, f64>) {
    let (q, k, v) = qkv(fx, case);
    let am: Tensor<(Dyn, Dyn), f64> = constant(fx, case, "attn_mask");
    let kpm: Tensor<(Dyn, Dyn), f64> = constant(fx, case, "kpm");
    let masks = AttnMasks {
        key_padding_mask: Some(Mask::Add(&kpm)),
        attn_mask: Some(Mask::Add(&am)),
        is_causal: false,
    };
    let y = m.attend_with(&q, &k, &v, masks);
    finish_qkv(fx, case, &m, &[any3(&y)], (&q, &k, &v));
}

#[test]
fn mha_bool_masks_hide_positions() {
    let fx = fixture();
    let case = "mha_bool_masks";
    let m = mha(&fx, case, true);
    let (q, k, v) = qkv(&fx, case);
    let am: Bool2 = constant(&fx, case, "attn_mask");
    let kpm: Bool2 = constant(&fx, case, "kpm");
    let masks = AttnMasks {
        key_padding_mask: Some(Mask::Hide(&kpm)),
        attn_mask: Some(Mask::Hide(&am)),
        is_causal: false,
    };
    let y = m.attend_with(&q, &k, &v, masks);
    finish_qkv(&fx, case, &m, &[any3(&y)], (&q, &k, &v));
}

/// `add_bias_kv` (and `add_zero_attn`): the layer built with them loads
/// PyTorch's `bias_k`/`bias_v` strictly.
fn mha_extra_kv(
    fx: &Fixture,
    case: &str,
    bias_kv: bool,
    zero_attn: bool,
) -> MultiheadAttention<8, 2, f64> {
    let mut rng = Rng::seed_from(0);
    let mut m =
        MultiheadAttention::with_options(0.0, true, &Cpu, &mut rng).add_zero_attn(zero_attn);
    if bias_kv {
        m = m.add_bias_kv(&mut rng);
    }
    m.eval();
    load(fx, case, &mut m);
    m
}

/// `kdim`/`vdim`: keys 6 wide and values 3 wide, through separate
/// `q/k/v_proj_weight`, with a key padding mask and the weights returned.
#[test]
fn mha_kdim_vdim_with_padding_and_weights() {
    let fx = fixture();
    let case = "mha_kdim_vdim";
    let mut m = MultiheadAttention::<8, 2, f64, Cpu, 6, 3>::new(&Cpu, &mut Rng::seed_from(0));
    m.eval();
    load(&fx, case, &mut m);
    let q: Seq = input(&fx, case, "q");
    let k: Tensor<(Dyn, Dyn, C<6>), f64> = input(&fx, case, "k");
    let v: Tensor<(Dyn, Dyn, C<3>), f64> = input(&fx, case, "v");
    let kpm: Bool2 = constant(&fx, case, "kpm");
    let masks = padding(&kpm);
    let out = m.attend_with_weights(&q, &k, &v, masks);
    finish_qkv(
        &fx,
        case,
        &m,
        &[any3(&out.output), any3(&out.weights)],
        (&q, &k, &v),
    );
}

/// `kdim = vdim = 6` without biases and with `add_bias_kv` (the appended
/// rows are `EMBED` wide, after the projections).
#[test]
fn mha_kdim_without_bias_with_bias_kv() {
    let fx = fixture();
    let case = "mha_kdim_bias_kv";
    let mut rng = Rng::seed_from(0);
    let mut m =
        MultiheadAttention::<8, 2, f64, Cpu, 6, 6>::with_options(0.0, false, &Cpu, &mut rng)
            .add_bias_kv(&mut rng);
    m.eval();
    load(&fx, case, &mut m);
    let q: Seq = input(&fx, case, "q");
    let k: Tensor<(Dyn, Dyn, C<6>), f64> = input(&fx, case, "k");
    let v: Tensor<(Dyn, Dyn, C<6>), f64> = input(&fx, case, "v");
    let y = m.attend_with(&q, &k, &v, AttnMasks::default());
    finish_qkv(&fx, case, &m, &[any3(&y)], (&q, &k, &v));
}

/// `add_bias_kv`: keys and values gain a learned row, the key padding mask
/// a visible column; the head-averaged weights have `S + 1` columns.
#[test]
fn mha_bias_kv_with_padding_and_weights() {
    let fx = fixture();
    let case = "mha_bias_kv";
    let m = mha_extra_kv(&fx, case, true, false);
    let (q, k, v) = qkv(&fx, case);
    let kpm: Bool2 = constant(&fx, case, "kpm");
    let masks = padding(&kpm);
    let out = m.attend_with_weights(&q, &k, &v, masks);
    finish_qkv(
        &fx,
        case,
        &m,
        &[any3(&out.output), any3(&out.weights)],
        (&q, &k, &v),
    );
}

/// `add_bias_kv` and `add_zero_attn` under the causal flag alone (no key
/// padding, no weights returned): as in PyTorch the flag then covers the
/// widened keys, so the appended ones are hidden from every query.
#[test]
fn mha_zero_attn_causal() {
    let fx = fixture();
    let case = "mha_zero_attn_causal";
    let m = mha_extra_kv(&fx, case, true, true);
    let x: Seq = input(&fx, case, "x");
    let y = m.attend_with(&x, &x, &x, AttnMasks::causal());
    finish(&fx, case, &m, &[any3(&y)], &[("x", &any3(&x))]);
}

/// `add_bias_kv` under a causal mask with the weights returned: PyTorch
/// then widens the causal mask, the appended key visible to every query.
#[test]
fn mha_bias_kv_causal_with_weights() {
    let fx = fixture();
    let case = "mha_bias_kv_causal_weights";
    let m = mha_extra_kv(&fx, case, true, false);
    let x: Seq = input(&fx, case, "x");
    let out = m.attend_with_weights(&x, &x, &x, AttnMasks::causal());
    finish(
        &fx,
        case,
        &m,
        &[any3(&out.output), any3(&out.weights)],
        &[("x", &any3(&x))],
    );
}

/// `add_zero_attn` alone, with additive attention and key padding masks.
#[test]
fn mha_zero_attn_float_masks() {
    let fx = fixture();
    let case = "mha_zero_attn_float";
    float_masks_case(&fx, case, mha_extra_kv(&fx, case, false, true));
}

#[test]
fn mha_without_bias() {
    let fx = fixture();
    let case = "mha_nobias";
    let m = mha(&fx, case, false);
    let x: Seq = input(&fx, case, "x");
    let y = m.forward(x.clone());
    finish(&fx, case, &m, &[any3(&y)], &[("x", &any3(&x))]);
}

// ------------------------------------------------------------------ transformer

fn options(activation: Activation, norm_first: bool) -> TransformerOptions {
    TransformerOptions {
        activation,
        norm_first,
        ..TransformerOptions::default()
    }
}

fn encoder(
    fx: &Fixture,
    case: &str,
    opts: TransformerOptions,
) -> TransformerEncoderLayer<8, 2, 16, f64> {
    let mut m = TransformerEncoderLayer::with_options(opts, &Cpu, &mut Rng::seed_from(1));
    m.eval();
    load(fx, case, &mut m);
    m
}

fn encoder_case(case: &str, opts: TransformerOptions, masking: Option<&str>) {
    let fx = fixture();
    let m = encoder(&fx, case, opts);
    let src: Seq = input(&fx, case, "src");
    let y = match masking {
        Some("kpm") => {
            let kpm: Bool2 = constant(&fx, case, "kpm");
            let masks = padding(&kpm);
            m.forward_with(src.clone(), masks)
        }
        Some("causal") => m.forward_with(src.clone(), AttnMasks::causal()),
        _ => m.forward(src.clone()),
    };
    finish(&fx, case, &m, &[any3(&y)], &[("src", &any3(&src))]);
}

#[test]
fn encoder_post_norm_relu_with_padding() {
    encoder_case(
        "enc_post_relu_kpm",
        options(Activation::Relu, false),
        Some("kpm"),
    );
}

#[test]
fn encoder_pre_norm_gelu_with_padding() {
    encoder_case(
        "enc_pre_gelu_kpm",
        options(Activation::Gelu, true),
        Some("kpm"),
    );
}

#[test]
fn encoder_post_norm_gelu_causal() {
    let opts = options(Activation::Gelu, false);
    encoder_case("enc_post_gelu_causal", opts, Some("causal"));
}

#[test]
fn encoder_pre_norm_relu_without_masks() {
    encoder_case("enc_pre_relu_plain", options(Activation::Relu, true), None);
}

/// `bias=False`: no projection biases, layer norms with a weight alone.
#[test]
fn encoder_without_biases() {
    let opts = TransformerOptions {
        bias: false,
        ..options(Activation::Gelu, true)
    };
    encoder_case("enc_nobias", opts, Some("kpm"));
}

fn decoder_case(case: &str, opts: TransformerOptions, tgt_padding: bool) {
    let fx = fixture();
    let mut m =
        TransformerDecoderLayer::<8, 2, 16, f64>::with_options(opts, &Cpu, &mut Rng::seed_from(2));
    m.eval();
    load(&fx, case, &mut m);
    let tgt: Seq = input(&fx, case, "tgt");
    let memory: Seq = input(&fx, case, "memory");
    let mem_kpm: Bool2 = constant(&fx, case, "mem_kpm");
    let tgt_kpm: Option<Bool2> = tgt_padding.then(|| constant(&fx, case, "tgt_kpm"));
    let tgt_masks = AttnMasks {
        key_padding_mask: tgt_kpm.as_ref().map(Mask::Hide),
        ..AttnMasks::causal()
    };
    let memory_masks = AttnMasks {
        key_padding_mask: Some(Mask::Hide(&mem_kpm)),
        ..AttnMasks::default()
    };
    let y = m.forward_with(tgt.clone(), memory.clone(), tgt_masks, memory_masks);
    let ins = [("tgt", &any3(&tgt)), ("memory", &any3(&memory))];
    finish(&fx, case, &m, &[any3(&y)], &ins);
}

#[test]
fn decoder_post_norm_relu_causal_with_memory_padding() {
    decoder_case("dec_post_relu", options(Activation::Relu, false), false);
}

#[test]
fn decoder_pre_norm_gelu_causal_with_both_paddings() {
    decoder_case("dec_pre_gelu", options(Activation::Gelu, true), true);
}

#[test]
fn decoder_without_biases() {
    let opts = TransformerOptions {
        bias: false,
        ..options(Activation::Relu, false)
    };
    decoder_case("dec_nobias", opts, false);
}

#[test]
fn encoder_stack_with_final_norm_and_padding() {
    // nn.TransformerEncoder(pre-norm layer, 2, norm=LayerNorm): keys
    // `layers.N.…` and `norm.…`, the repr with `(0-1): 2 x`, and the
    // output and gradients through both layers.
    let (fx, case) = (fixture(), "enc_stack");
    let opts = options(Activation::Relu, true);
    let mut m = TransformerEncoder::<8, 2, 16, f64>::with_options(
        2,
        opts,
        true,
        &Cpu,
        &mut Rng::seed_from(3),
    );
    m.eval();
    load(&fx, case, &mut m);
    let src: Seq = input(&fx, case, "src");
    let kpm: Bool2 = constant(&fx, case, "kpm");
    let masks = padding(&kpm);
    let y = m.forward_with(src.clone(), masks);
    finish(&fx, case, &m, &[any3(&y)], &[("src", &any3(&src))]);
    // A mask of the wrong size is an error carrying the first layer's path.
    let short = Tensor::<(Dyn, Dyn), bool>::from_vec(vec![false; 4], (Dyn(2), Dyn(2))).unwrap();
    let masks = AttnMasks {
        key_padding_mask: Some(Mask::Hide(&short)),
        ..AttnMasks::default()
    };
    let err = m.try_forward_with(src.detach(), masks).unwrap_err();
    assert_eq!(err.module_path(), Some("layers.0"), "{err}");
}

#[test]
fn decoder_stack_with_final_norm_causal_and_memory_padding() {
    let (fx, case) = (fixture(), "dec_stack");
    let opts = options(Activation::Gelu, false);
    let mut m = TransformerDecoder::<8, 2, 16, f64>::with_options(
        2,
        opts,
        true,
        &Cpu,
        &mut Rng::seed_from(4),
    );
    m.eval();
    load(&fx, case, &mut m);
    let tgt: Seq = input(&fx, case, "tgt");
    let memory: Seq = input(&fx, case, "memory");
    let mem_kpm: Bool2 = constant(&fx, case, "mem_kpm");
    let memory_masks = AttnMasks {
        key_padding_mask: Some(Mask::Hide(&mem_kpm)),
        ..AttnMasks::default()
    };
    let y = m.forward_with(
        tgt.clone(),
        memory.clone(),
        AttnMasks::causal(),
        memory_masks,
    );
    let ins = [("tgt", &any3(&tgt)), ("memory", &any3(&memory))];
    finish(&fx, case, &m, &[any3(&y)], &ins);
}

// ------------------------------------------------------------------ recurrent

fn rnn_options(bias: bool) -> RnnOptions {
    RnnOptions {
        num_layers: 2,
        bias,
        dropout: 0.0,
    }
}

fn lstm_case<const BIDIR: bool>(case: &str, state: bool, bias: bool) {
    let fx = fixture();
    let mut m =
        Lstm::<3, 4, BIDIR, f64>::with_options(rnn_options(bias), &Cpu, &mut Rng::seed_from(3));
    m.eval();
    load(&fx, case, &mut m);
    let x: Tensor<(Dyn, Dyn, C<3>), f64> = input(&fx, case, "x");
    let mut ins = vec![("x", any3(&x))];
    let init = state.then(|| {
        let h0: Tensor<(Dyn, Dyn, C<4>), f64> = input(&fx, case, "h0");
        let c0: Tensor<(Dyn, Dyn, C<4>), f64> = input(&fx, case, "c0");
        ins.push(("h0", any3(&h0)));
        ins.push(("c0", any3(&c0)));
        (h0, c0)
    });
    let (y, (h, c)): (Any3, _) = m.forward_with(x, init);
    let ins: Vec<(&str, &Any3)> = ins.iter().map(|(n, t)| (*n, t)).collect();
    finish(&fx, case, &m, &[y, any3(&h), any3(&c)], &ins);
}

/// LSTM with `proj_size = 2` (hidden 5): `h_0` and the outputs have 2
/// features per direction, `c_0` has 5; `weight_hr_l{k}` projects.
fn lstm_proj_case<const BIDIR: bool>(case: &str) {
    let fx = fixture();
    let mut m = Lstm::<3, 5, BIDIR, f64, Cpu, 2>::with_options(
        rnn_options(true),
        &Cpu,
        &mut Rng::seed_from(3),
    );
    m.eval();
    load(&fx, case, &mut m);
    let x: Tensor<(Dyn, Dyn, C<3>), f64> = input(&fx, case, "x");
    let h0: Tensor<(Dyn, Dyn, C<2>), f64> = input(&fx, case, "h0");
    let c0: Tensor<(Dyn, Dyn, C<5>), f64> = input(&fx, case, "c0");
    let ins = [("x", any3(&x)), ("h0", any3(&h0)), ("c0", any3(&c0))];
    let (y, (h, c)): (Any3, _) = m.forward_with(x, Some((h0, c0)));
    let ins: Vec<(&str, &Any3)> = ins.iter().map(|(n, t)| (*n, t)).collect();
    finish(&fx, case, &m, &[y, any3(&h), any3(&c)], &ins);
}

fn gru_case<const BIDIR: bool>(case: &str, state: bool, bias: bool) {
    let fx = fixture();
    let mut m =
        Gru::<3, 4, BIDIR, f64>::with_options(rnn_options(bias), &Cpu, &mut Rng::seed_from(4));
    m.eval();
    load(&fx, case, &mut m);
    let x: Tensor<(Dyn, Dyn, C<3>), f64> = input(&fx, case, "x");
    let mut ins = vec![("x", any3(&x))];
    let init = state.then(|| {
        let h0: Tensor<(Dyn, Dyn, C<4>), f64> = input(&fx, case, "h0");
        ins.push(("h0", any3(&h0)));
        h0
    });
    let (y, h): (Any3, _) = m.forward_with(x, init);
    let ins: Vec<(&str, &Any3)> = ins.iter().map(|(n, t)| (*n, t)).collect();
    finish(&fx, case, &m, &[y, any3(&h)], &ins);
}

#[test]
fn lstm_two_layers_from_zero_state() {
    lstm_case::<false>("lstm_zero", false, true);
}

#[test]
fn lstm_two_layers_from_given_state() {
    lstm_case::<false>("lstm_state", true, true);
}

#[test]
fn lstm_bidirectional_from_given_state() {
    lstm_case::<true>("lstm_bi_state", true, true);
}

#[test]
fn lstm_bidirectional_without_bias() {
    lstm_case::<true>("lstm_bi_nobias", false, false);
}

#[test]
fn lstm_with_proj_size() {
    lstm_proj_case::<false>("lstm_proj_state");
}

#[test]
fn lstm_bidirectional_with_proj_size() {
    lstm_proj_case::<true>("lstm_proj_bi_state");
}

#[test]
fn gru_two_layers_from_zero_state() {
    gru_case::<false>("gru_zero", false, true);
}

#[test]
fn gru_two_layers_from_given_state() {
    gru_case::<false>("gru_state", true, true);
}

#[test]
fn gru_bidirectional_from_given_state() {
    gru_case::<true>("gru_bi_state", true, true);
}

#[test]
fn gru_bidirectional_without_bias() {
    gru_case::<true>("gru_bi_nobias", false, false);
}

// ------------------------------------------------------------------ beyond parity

#[test]
fn fixture_records_its_provenance() {
    let meta = fixture().metadata();
    assert_eq!(
        meta.get("generator").map(String::as_str),
        Some("tools/gen_seq_fixtures.py")
    );
    assert!(meta.get("torch").is_some_and(|v| v.starts_with('2')));
}

#[test]
fn default_initialisation_follows_pytorch() {
    let mut rng = Rng::seed_from(7);
    let mha = MultiheadAttention::<64, 4>::new(&Cpu, &mut rng);
    // xavier_uniform_ on [192, 64]: bound sqrt(6 / 256).
    let bound = (6.0f32 / 256.0).sqrt();
    let w = mha
        .in_proj_weight
        .as_ref()
        .expect("stacked projections")
        .to_vec();
    assert!(w.iter().all(|v| v.abs() <= bound) && w.iter().any(|v| v.abs() > 0.9 * bound));
    // With kdim = 32: separate projections, each xavier_uniform_ on its own
    // shape ([64, 32]: bound sqrt(6 / 96)).
    let mha = MultiheadAttention::<64, 4, f32, Cpu, 32>::new(&Cpu, &mut rng);
    assert!(mha.in_proj_weight.is_none());
    let k = mha
        .k_proj_weight
        .as_ref()
        .expect("a key projection")
        .to_vec();
    let kb = (6.0f32 / 96.0).sqrt();
    assert!(k.iter().all(|v| v.abs() <= kb) && k.iter().any(|v| v.abs() > 0.9 * kb));
    let v = mha
        .v_proj_weight
        .as_ref()
        .expect("a value projection")
        .to_vec();
    let vb = (6.0f32 / 128.0).sqrt();
    assert!(v.iter().all(|x| x.abs() <= vb) && v.iter().any(|x| x.abs() > 0.9 * vb));
    assert!(mha
        .in_proj_bias
        .as_ref()
        .unwrap()
        .to_vec()
        .iter()
        .all(|v| *v == 0.0));
    let w = mha.out_proj.weight.to_vec();
    assert!(w.iter().all(|v| v.abs() <= 0.125) && w.iter().any(|v| v.abs() > 0.11));
    assert!(mha
        .out_proj
        .bias
        .as_ref()
        .unwrap()
        .to_vec()
        .iter()
        .all(|v| *v == 0.0));

    let lstm = Lstm::<10, 16>::new(2, &Cpu, &mut rng);
    let gru = Gru::<10, 16, true>::new(2, &Cpu, &mut rng);
    for (name, info) in lstm
        .named_parameters()
        .into_iter()
        .chain(gru.named_parameters())
    {
        assert!(info.requires_grad, "{name}");
    }
    let all: Vec<f32> = lstm
        .params
        .cells
        .iter()
        .chain(&gru.params.cells)
        .flat_map(|c| {
            let mut v = c.weight_ih.to_vec();
            v.extend(c.weight_hh.to_vec());
            v.extend(c.bias_ih.as_ref().unwrap().to_vec());
            v.extend(c.bias_hh.as_ref().unwrap().to_vec());
            v
        })
        .collect();
    // U(-1/sqrt(16), 1/sqrt(16)).
    assert!(all.iter().all(|v| v.abs() <= 0.25) && all.iter().any(|v| v.abs() > 0.24));
    assert_eq!(
        lstm.num_parameters(),
        4 * 16 * (10 + 16 + 2) + 4 * 16 * (16 + 16 + 2)
    );
    assert_eq!(gru.params.get(1, true).weight_ih.dims()[..], [48, 32]);
}

#[test]
fn static_and_dynamic_rnn_outputs_agree() {
    let mut rng = Rng::seed_from(8);
    let lstm = Lstm::<3, 4, true>::new(1, &Cpu, &mut rng);
    let x = Tensor::<(Dyn, Dyn, C<3>)>::randn((Dyn(2), Dyn(6), C), &mut rng);
    let stat: Tensor<(Dyn, Dyn, C<8>)> = lstm.forward(x.clone());
    let dynamic: Tensor<(Dyn, Dyn, Dyn)> = lstm.forward(x);
    assert_eq!(stat.to_vec(), dynamic.to_vec());
    assert_eq!(stat.dims()[..], [2, 6, 8]);
}

#[test]
fn bad_run_time_sizes_are_errors() {
    let mut rng = Rng::seed_from(9);
    let gru = Gru::<3, 4>::new(2, &Cpu, &mut rng);
    let x = Tensor::<(Dyn, Dyn, C<3>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
    // h_0 for one layer where the stack has two.
    let h0 = Tensor::<(Dyn, Dyn, C<4>)>::zeros_with((Dyn(1), Dyn(2), C));
    let err = gru
        .try_forward_with::<_, _, C<4>>(x.clone(), Some(h0))
        .unwrap_err();
    assert!(err.to_string().contains("[2, 2, 4]"), "{err}");

    let mha = MultiheadAttention::<8, 2>::new(&Cpu, &mut rng);
    let q = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(3), C), &mut rng);
    let kv = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(4), C), &mut rng);
    let pad = Tensor::<(Dyn, Dyn), bool>::from_vec(vec![false; 6], (Dyn(2), Dyn(3))).unwrap();
    let masks = AttnMasks {
        key_padding_mask: Some(Mask::Hide(&pad)),
        ..AttnMasks::default()
    };
    let err = mha.try_attend_with(&q, &kv, &kv, masks).unwrap_err();
    assert!(
        err.to_string().contains("key_padding_mask of [2, 4]"),
        "{err}"
    );
    let short = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(3), C), &mut rng);
    let err = mha
        .try_attend_with(&q, &kv, &short, AttnMasks::default())
        .unwrap_err();
    assert!(err.to_string().contains("value"), "{err}");
}

#[test]
fn dropout_acts_only_in_training_mode() {
    let mut rng = Rng::seed_from(10);
    let opts = TransformerOptions {
        dropout: 0.5,
        ..TransformerOptions::default()
    };
    let mut layer = TransformerEncoderLayer::<8, 2, 16>::with_options(opts, &Cpu, &mut rng);
    assert!(layer.is_training() && layer.self_attn.training.is_on());
    let x = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(4), C), &mut rng);
    let a = layer.forward(x.clone()).to_vec();
    let b = layer.forward(x.clone()).to_vec();
    assert_ne!(a, b, "training mode draws new dropout masks");
    layer.eval();
    assert!(!layer.self_attn.training.is_on() && !layer.dropout1.training.is_on());
    let c = layer.forward(x.clone()).to_vec();
    assert_eq!(c, layer.forward(x).to_vec());

    let mut lstm = Lstm::<3, 4>::with_options(
        RnnOptions {
            num_layers: 2,
            bias: true,
            dropout: 0.5,
        },
        &Cpu,
        &mut rng,
    );
    assert_eq!(
        lstm.repr(),
        "LSTM(3, 4, num_layers=2, batch_first=True, dropout=0.5)"
    );
    let x = Tensor::<(Dyn, Dyn, C<3>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
    let a: Tensor<(Dyn, Dyn, C<4>)> = lstm.forward(x.clone());
    let b: Tensor<(Dyn, Dyn, C<4>)> = lstm.forward(x.clone());
    assert_ne!(a.to_vec(), b.to_vec());
    lstm.eval();
    let a: Tensor<(Dyn, Dyn, C<4>)> = lstm.forward(x.clone());
    let b: Tensor<(Dyn, Dyn, C<4>)> = lstm.forward(x);
    assert_eq!(a.to_vec(), b.to_vec());
}

// ------------------------------------------------------- batch_first=False

/// `SeqFirst`: PyTorch's default `batch_first=False`, `[seq, batch, F]`
/// tensors in and out; the keys, states and masks are the layer's.
#[test]
fn lstm_sequence_first() {
    let fx = fixture();
    let case = "lstm_seq_first";
    let mut m = SeqFirst(Lstm::<3, 4, true, f64>::new(
        2,
        &Cpu,
        &mut Rng::seed_from(3),
    ));
    m.eval();
    load(&fx, case, &mut m);
    let x: Seq3 = input(&fx, case, "x");
    let h0: Tensor<(Dyn, Dyn, C<4>), f64> = input(&fx, case, "h0");
    let c0: Tensor<(Dyn, Dyn, C<4>), f64> = input(&fx, case, "c0");
    let ins = [("x", any3(&x)), ("h0", any3(&h0)), ("c0", any3(&c0))];
    let (y, (h, c)): (Any3, _) = m.forward_with(x, Some((h0, c0)));
    let ins: Vec<(&str, &Any3)> = ins.iter().map(|(n, t)| (*n, t)).collect();
    finish(&fx, case, &m, &[y, any3(&h), any3(&c)], &ins);
}

#[test]
fn gru_sequence_first_through_forward() {
    let fx = fixture();
    let case = "gru_seq_first";
    let mut m = SeqFirst(Gru::<3, 4, false, f64>::new(
        1,
        &Cpu,
        &mut Rng::seed_from(4),
    ));
    m.eval();
    load(&fx, case, &mut m);
    let x: Seq3 = input(&fx, case, "x");
    let (y, h): (Any3, _) = m.forward_with(x.clone(), None);
    let through_forward: Tensor<(Dyn, Dyn, C<4>), f64> = m.forward(x.clone());
    assert_eq!(any3(&through_forward).to_vec(), y.to_vec());
    finish(&fx, case, &m, &[y, any3(&h)], &[("x", &any3(&x))]);
}

#[test]
fn mha_sequence_first_with_padding_and_weights() {
    let fx = fixture();
    let case = "mha_seq_first";
    let mut m = SeqFirst(MultiheadAttention::<8, 2, f64>::new(
        &Cpu,
        &mut Rng::seed_from(0),
    ));
    m.eval();
    load(&fx, case, &mut m);
    let (q, k, v) = qkv(&fx, case);
    let kpm: Bool2 = constant(&fx, case, "kpm");
    let masks = padding(&kpm);
    let out = m.attend_with_weights(&q, &k, &v, masks);
    finish_qkv(
        &fx,
        case,
        &m,
        &[any3(&out.output), any3(&out.weights)],
        (&q, &k, &v),
    );
}

#[test]
fn encoder_and_decoder_layers_sequence_first() {
    let fx = fixture();
    let opts = |norm_first| TransformerOptions {
        dropout: 0.0,
        ..options(Activation::Relu, norm_first)
    };
    let case = "enc_seq_first";
    let layer = TransformerEncoderLayer::<8, 2, 16, f64>::with_options(
        opts(false),
        &Cpu,
        &mut Rng::seed_from(1),
    );
    let mut m = SeqFirst(layer);
    m.eval();
    load(&fx, case, &mut m);
    let src: Seq = input(&fx, case, "src");
    let y = m.forward_with(src.clone(), AttnMasks::causal());
    finish(&fx, case, &m, &[any3(&y)], &[("src", &any3(&src))]);

    let case = "dec_seq_first";
    let layer = TransformerDecoderLayer::<8, 2, 16, f64>::with_options(
        opts(true),
        &Cpu,
        &mut Rng::seed_from(2),
    );
    let mut m = SeqFirst(layer);
    m.eval();
    load(&fx, case, &mut m);
    let tgt: Seq = input(&fx, case, "tgt");
    let memory: Seq = input(&fx, case, "memory");
    let mem_kpm: Bool2 = constant(&fx, case, "mem_kpm");
    let memory_masks = AttnMasks {
        key_padding_mask: Some(Mask::Hide(&mem_kpm)),
        ..AttnMasks::default()
    };
    let y = m.forward_with(
        tgt.clone(),
        memory.clone(),
        AttnMasks::default(),
        memory_masks,
    );
    let ins = [("tgt", &any3(&tgt)), ("memory", &any3(&memory))];
    finish(&fx, case, &m, &[any3(&y)], &ins);
}
