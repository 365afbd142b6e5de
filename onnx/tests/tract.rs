//! Every exported model runs in tract (a maintained Rust ONNX runtime) and
//! gives Forma's own output within 1e-5 relative, at two batch sizes (and
//! two sequence lengths where there is one) from one exported file: the
//! symbolic axes are real.

use forma::nn::layers::{
    BatchNorm2d, Conv2d, Embedding, Flatten, LayerNorm, Linear, MaxPool2d, Relu,
    TransformerEncoderLayer,
};
use forma::prelude::*;
use forma::TensorData;
use forma_onnx::to_onnx_bytes;
use tract_onnx::prelude::{self as tp, Framework, InferenceModelExt, IntoRunnable};

/// An input for tract: its sizes and values.
enum In {
    F32(Vec<usize>, Vec<f32>),
    I64(Vec<usize>, Vec<i64>),
}

/// Runs the ONNX model in `bytes` on `inputs` in tract; the first output.
fn tract_run(bytes: &[u8], inputs: Vec<In>) -> (Vec<usize>, Vec<f32>) {
    let model = tract_onnx::onnx()
        .model_for_read(&mut &bytes[..])
        .expect("tract reads the file")
        .into_optimized()
        .expect("tract optimises the model")
        .into_runnable()
        .expect("tract plans the model");
    let ins: tp::TVec<tp::TValue> = inputs
        .into_iter()
        .map(|i| match i {
            In::F32(d, v) => tp::Tensor::from_shape(&d, &v).unwrap().into(),
            In::I64(d, v) => tp::Tensor::from_shape(&d, &v).unwrap().into(),
        })
        .collect();
    let out = model.run(ins).expect("tract runs the model");
    let t = out[0].to_plain_array_view::<f32>().expect("an f32 output");
    (t.shape().to_vec(), t.iter().copied().collect())
}

fn assert_close(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: lengths");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * scale.max(w.abs()) + 1e-6,
            "{name}[{i}]: tract {g} vs forma {w}"
        );
    }
}

/// Exports `model` at the example, then checks tract against Forma at
/// each of `runs`.
fn check<M, X, Y>(name: &str, model: &M, example: X, runs: Vec<(X, Vec<In>)>)
where
    M: forma::nn::Module + Forward<X, Y>,
    X: forma_onnx::Traced,
    Y: forma_onnx::Traced + ToVec,
{
    let graph = forma::nn::capture::capture(model, example).expect("capture");
    let bytes = to_onnx_bytes(&graph, &[]).expect("export");
    let mut record = Vec::new();
    for (x, ins) in runs {
        let want = model.try_forward(x).expect("forma forward");
        record.push(json_run(&ins, &want.dims_vec(), &want.values()));
        let (dims, got) = tract_run(&bytes, ins);
        assert_eq!(dims, want.dims_vec(), "{name}: output sizes");
        assert_close(name, &got, &want.values());
    }
    // `tools/check_onnx.py` sets this to run the same files in ONNX Runtime.
    if let Some(dir) = std::env::var_os("FORMA_ONNX_OUT") {
        let dir = std::path::Path::new(&dir);
        std::fs::write(dir.join(format!("{name}.onnx")), &bytes).unwrap();
        let runs = format!("{{\"runs\": [{}]}}", record.join(", "));
        std::fs::write(dir.join(format!("{name}.json")), runs).unwrap();
    }
}

/// One run as JSON: the inputs and Forma's output.
fn json_run(ins: &[In], dims: &[usize], out: &[f32]) -> String {
    fn list<T: std::fmt::Display>(v: &[T]) -> String {
        let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
        format!("[{}]", items.join(", "))
    }
    let inputs: Vec<String> = ins
        .iter()
        .map(|i| match i {
            In::F32(d, v) => format!(
                "{{\"dtype\": \"float32\", \"dims\": {}, \"values\": {}}}",
                list(d),
                list(v)
            ),
            In::I64(d, v) => format!(
                "{{\"dtype\": \"int64\", \"dims\": {}, \"values\": {}}}",
                list(d),
                list(v)
            ),
        })
        .collect();
    format!(
        "{{\"inputs\": [{}], \"output\": {{\"dims\": {}, \"values\": {}}}}}",
        inputs.join(", "),
        list(dims),
        list(out)
    )
}

/// A forward's output, read for comparison.
trait ToVec {
    fn dims_vec(&self) -> Vec<usize>;
    fn values(&self) -> Vec<f32>;
}

impl<S: Shape> ToVec for Tensor<S> {
    fn dims_vec(&self) -> Vec<usize> {
        self.dims().to_vec()
    }
    fn values(&self) -> Vec<f32> {
        self.to_vec()
    }
}

/// A random f32 input of `shape`: the Forma tensor and tract's copy.
fn f32_input<S: Shape>(shape: S, rng: &mut Rng) -> (Tensor<S>, Vec<In>) {
    let x = Tensor::<S>::randn(shape, rng);
    let dims = x.dims().to_vec();
    let v = x.to_vec();
    (x, vec![In::F32(dims, v)])
}

#[derive(Module, Sequential)]
#[sequential(input = [B, 6], output = [B, 3])]
struct Mlp {
    fc1: Linear<6, 16>,
    act: Relu,
    fc2: Linear<16, 3>,
}

#[test]
fn mlp_runs_in_tract_at_two_batch_sizes() {
    let mut rng = Rng::seed_from(0);
    let model = Mlp {
        fc1: Linear::new(&Cpu, &mut rng),
        act: Relu,
        fc2: Linear::new(&Cpu, &mut rng),
    };
    let mk = |b: usize, rng: &mut Rng| f32_input((Dyn(b), C), rng);
    let (example, _) = mk(2, &mut rng);
    let runs = vec![mk(1, &mut rng), mk(5, &mut rng)];
    check("mlp", &model, example, runs);
}

#[derive(Module, Sequential)]
#[sequential(input = [B, 1, 12, 12], output = [B, 10])]
struct Cnn {
    conv: Conv2d<1, 4, 3>,
    bn: BatchNorm2d<4>,
    act: Relu,
    pool: MaxPool2d<2>,
    flatten: Flatten,
    fc: Linear<100, 10>,
}

#[test]
fn cnn_with_batch_norm_runs_in_tract_at_two_batch_sizes() {
    let mut rng = Rng::seed_from(1);
    let mut model = Cnn {
        conv: Conv2d::new(&Cpu, &mut rng),
        bn: BatchNorm2d::new(&Cpu),
        act: Relu,
        pool: MaxPool2d,
        flatten: Flatten,
        fc: Linear::new(&Cpu, &mut rng),
    };
    // Running statistics that are not the identity, as after training.
    model
        .bn
        .running_mean
        .as_ref()
        .unwrap()
        .try_assign_data(&TensorData::from_vec(&[0.1f32, -0.2, 0.3, 0.0], vec![4]).unwrap())
        .unwrap();
    model
        .bn
        .running_var
        .as_ref()
        .unwrap()
        .try_assign_data(&TensorData::from_vec(&[1.5f32, 0.5, 2.0, 1.0], vec![4]).unwrap())
        .unwrap();
    model.eval();
    let mk = |b: usize, rng: &mut Rng| f32_input((Dyn(b), C, C, C), rng);
    let (example, _) = mk(2, &mut rng);
    let runs = vec![mk(1, &mut rng), mk(3, &mut rng)];
    check("cnn", &model, example, runs);
}

/// The training example's LeNet (examples/src/train/mod.rs), layer for layer.
#[derive(Module, Sequential)]
#[sequential(input = [B, 1, 28, 28], output = [B, 10])]
struct LeNet {
    conv1: Conv2d<1, 8, 5, 1, 2>,
    act1: Relu,
    pool1: MaxPool2d<2>,
    conv2: Conv2d<8, 16, 5>,
    act2: Relu,
    pool2: MaxPool2d<2>,
    flatten: Flatten,
    fc1: Linear<400, 64>,
    act3: Relu,
    fc2: Linear<64, 10>,
}

#[test]
fn the_training_examples_lenet_runs_in_tract_at_two_batch_sizes() {
    let mut rng = Rng::seed_from(11);
    let model = LeNet {
        conv1: Conv2d::new(&Cpu, &mut rng),
        act1: Relu,
        pool1: MaxPool2d,
        conv2: Conv2d::new(&Cpu, &mut rng),
        act2: Relu,
        pool2: MaxPool2d,
        flatten: Flatten,
        fc1: Linear::new(&Cpu, &mut rng),
        act3: Relu,
        fc2: Linear::new(&Cpu, &mut rng),
    };
    let mk = |b: usize, rng: &mut Rng| f32_input((Dyn(b), C, C, C), rng);
    let (example, _) = mk(2, &mut rng);
    let runs = vec![mk(1, &mut rng), mk(5, &mut rng)];
    check("lenet", &model, example, runs);
}

#[derive(Module)]
struct Encoder {
    layers: Vec<TransformerEncoderLayer<16, 4, 32>>,
    norm: LayerNorm<16>,
}

impl Forward<Tensor<(Dyn, Dyn, C<16>)>, Tensor<(Dyn, Dyn, C<16>)>> for Encoder {
    fn try_forward(
        &self,
        x: Tensor<(Dyn, Dyn, C<16>)>,
    ) -> forma::Result<Tensor<(Dyn, Dyn, C<16>)>> {
        let mut h = x;
        for i in 0..self.layers.len() {
            h = forma::nn::child!(self.layers[i], h)?;
        }
        forma::nn::child!(self.norm, h)
    }
}

#[test]
fn transformer_encoder_stack_runs_in_tract_at_two_batches_and_lengths() {
    let mut rng = Rng::seed_from(2);
    let mut model = Encoder {
        layers: (0..2)
            .map(|_| TransformerEncoderLayer::new(&Cpu, &mut rng))
            .collect(),
        norm: LayerNorm::new(&Cpu),
    };
    model.eval();
    let mk = |b: usize, s: usize, rng: &mut Rng| f32_input((Dyn(b), Dyn(s), C), rng);
    let (example, _) = mk(2, 5, &mut rng);
    let runs = vec![mk(1, 3, &mut rng), mk(3, 7, &mut rng)];
    check("encoder", &model, example, runs);
}

#[derive(Module)]
struct Tagger {
    embed: Embedding<20, 8>,
    norm: LayerNorm<8>,
    fc: Linear<8, 5>,
}

impl Forward<Tensor<(Dyn, Dyn), i64>, Tensor<(Dyn, Dyn, C<5>)>> for Tagger {
    fn try_forward(&self, ids: Tensor<(Dyn, Dyn), i64>) -> forma::Result<Tensor<(Dyn, Dyn, C<5>)>> {
        let h: Tensor<(Dyn, Dyn, C<8>)> = forma::nn::child!(self.embed, ids)?;
        let h: Tensor<(Dyn, Dyn, C<8>)> = forma::nn::child!(self.norm, h)?;
        forma::nn::child!(self.fc, h)
    }
}

#[test]
fn embedding_tagger_takes_int64_ids_in_tract() {
    let mut rng = Rng::seed_from(3);
    let model = Tagger {
        embed: Embedding::new(&Cpu, &mut rng),
        norm: LayerNorm::new(&Cpu),
        fc: Linear::new(&Cpu, &mut rng),
    };
    let mk = |b: usize, s: usize, seed: i64| {
        let v: Vec<i64> = (0..(b * s) as i64).map(|i| (i * 7 + seed) % 20).collect();
        let x = Tensor::<(Dyn, Dyn), i64>::from_vec(v.clone(), (Dyn(b), Dyn(s))).unwrap();
        (x, vec![In::I64(vec![b, s], v)])
    };
    let (example, _) = mk(2, 4, 0);
    let runs = vec![mk(1, 6, 3), mk(3, 2, 5)];
    check("tagger", &model, example, runs);
}

#[test]
fn pre_norm_gelu_encoder_runs_in_tract() {
    use forma::nn::layers::{Activation, TransformerOptions};
    let mut rng = Rng::seed_from(4);
    let options = TransformerOptions {
        activation: Activation::Gelu,
        norm_first: true,
        ..Default::default()
    };
    let mut model = Encoder {
        layers: vec![TransformerEncoderLayer::with_options(
            options, &Cpu, &mut rng,
        )],
        norm: LayerNorm::new(&Cpu),
    };
    model.eval();
    let mk = |b: usize, s: usize, rng: &mut Rng| f32_input((Dyn(b), Dyn(s), C), rng);
    let (example, _) = mk(2, 4, &mut rng);
    let runs = vec![mk(1, 2, &mut rng), mk(2, 6, &mut rng)];
    check("encoder_prenorm_gelu", &model, example, runs);
}

/// Causal self-attention over `[batch, heads, seq, dim]`.
#[derive(Module)]
struct Causal;

impl Forward<Tensor<(Dyn, C<2>, Dyn, C<4>)>, Tensor<(Dyn, C<2>, Dyn, C<4>)>> for Causal {
    fn try_forward(
        &self,
        x: Tensor<(Dyn, C<2>, Dyn, C<4>)>,
    ) -> forma::Result<Tensor<(Dyn, C<2>, Dyn, C<4>)>> {
        let q = x.mul_scalar(0.5).tanh();
        x.try_scaled_dot_product_attention::<Dyn, C<4>, (Dyn, C<2>, Dyn, Dyn)>(
            &q, &x, None, true, None,
        )
    }
}

#[test]
fn causal_attention_masks_by_the_run_time_length_in_tract() {
    let mut rng = Rng::seed_from(5);
    let mk = |b: usize, s: usize, rng: &mut Rng| f32_input((Dyn(b), C, Dyn(s), C), rng);
    let (example, _) = mk(1, 3, &mut rng);
    let runs = vec![mk(2, 5, &mut rng), mk(1, 1, &mut rng)];
    check("causal_attention", &Causal, example, runs);
}

/// vocab 99, context 64, hidden 32 (QKV 96), 4 heads, MLP 128: the model
/// suite's tiny GPT-2.
type TinyGpt2 = forma_models::gpt2::Gpt2LMHeadModel<99, 64, 32, 96, 4, 128>;
/// vocab 99, hidden 32, 4 heads, intermediate 37, 40 positions, 2 types.
type TinyBert = forma_models::bert::Bert<99, 32, 4, 37, 40, 2>;

impl<const H: usize> ToVec for forma_models::bert::BertOutputs<H> {
    fn dims_vec(&self) -> Vec<usize> {
        self.last_hidden_state.dims().to_vec()
    }
    fn values(&self) -> Vec<f32> {
        self.last_hidden_state.to_vec()
    }
}

/// Token ids `[b, s]` below 99, their inputs for tract.
fn ids(b: usize, s: usize, seed: i64) -> (Tensor<(Dyn, Dyn), i64>, Vec<In>) {
    let v: Vec<i64> = (0..(b * s) as i64).map(|i| (i * 13 + seed) % 99).collect();
    let x = Tensor::<(Dyn, Dyn), i64>::from_vec(v.clone(), (Dyn(b), Dyn(s))).unwrap();
    (x, vec![In::I64(vec![b, s], v)])
}

/// A tiny model file of the model suite (Hugging Face weights and keys,
/// written by tools/gen_model_fixtures.py).
fn model_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tools/fixtures/models")
        .join(name)
}

#[test]
fn gpt2_logits_run_in_tract_at_two_batches_and_lengths() {
    let model = TinyGpt2::from_safetensors(model_fixture("gpt2_tiny.safetensors"), &Cpu)
        .unwrap()
        .model;
    let (example, _) = ids(2, 5, 0);
    check("gpt2", &model, example, vec![ids(1, 3, 1), ids(3, 9, 2)]);
}

#[test]
fn bert_hidden_states_run_in_tract_at_two_batches_and_lengths() {
    let model = TinyBert::from_safetensors(model_fixture("bert_tiny.safetensors"), &Cpu)
        .unwrap()
        .model;
    let (example, _) = ids(2, 5, 0);
    check("bert", &model, example, vec![ids(1, 3, 1), ids(3, 9, 2)]);
}

/// A bidirectional two-layer LSTM feeding a GRU.
#[derive(Module)]
struct Recurrent {
    lstm: forma::nn::layers::Lstm<3, 5, true>,
    gru: forma::nn::layers::Gru<10, 4>,
}

impl Forward<Tensor<(Dyn, Dyn, C<3>)>, Tensor<(Dyn, Dyn, C<4>)>> for Recurrent {
    fn try_forward(&self, x: Tensor<(Dyn, Dyn, C<3>)>) -> forma::Result<Tensor<(Dyn, Dyn, C<4>)>> {
        let h: Tensor<(Dyn, Dyn, C<10>)> = forma::nn::child!(self.lstm, x)?;
        forma::nn::child!(self.gru, h)
    }
}

#[test]
fn lstm_and_gru_run_in_tract_as_onnx_recurrent_ops() {
    let mut rng = Rng::seed_from(8);
    let model = Recurrent {
        lstm: forma::nn::layers::Lstm::new(2, &Cpu, &mut rng),
        gru: forma::nn::layers::Gru::new(1, &Cpu, &mut rng),
    };
    let mk = |b: usize, s: usize, rng: &mut Rng| f32_input((Dyn(b), Dyn(s), C), rng);
    let (example, _) = mk(2, 4, &mut rng);
    let runs = vec![mk(1, 3, &mut rng), mk(3, 7, &mut rng)];
    check("lstm_gru", &model, example, runs);
}

/// conv-bn-relu-conv-bn plus a shortcut (a strided 1x1 conv and bn when
/// the block downsamples), then relu: torchvision's `BasicBlock`.
#[derive(Module)]
struct Block<const I: usize, const O: usize, const S: usize> {
    conv1: Conv2d<I, O, 3, S, 1>,
    bn1: BatchNorm2d<O>,
    conv2: Conv2d<O, O, 3, 1, 1>,
    bn2: BatchNorm2d<O>,
    #[module(rename = "downsample.0")]
    down_conv: Option<Conv2d<I, O, 1, S>>,
    #[module(rename = "downsample.1")]
    down_bn: Option<BatchNorm2d<O>>,
}

type Image<const CH: usize> = Tensor<(Dyn, C<CH>, Dyn, Dyn)>;

impl<const I: usize, const O: usize, const S: usize> Block<I, O, S> {
    fn new(rng: &mut Rng) -> Self {
        let mut conv1: Conv2d<I, O, 3, S, 1> = Conv2d::new(&Cpu, rng);
        let mut conv2: Conv2d<O, O, 3, 1, 1> = Conv2d::new(&Cpu, rng);
        conv1.bias = None;
        conv2.bias = None;
        let down = I != O || S != 1;
        let down_conv = down.then(|| {
            let mut c: Conv2d<I, O, 1, S> = Conv2d::new(&Cpu, rng);
            c.bias = None;
            c
        });
        let down_bn = down.then(|| stats(BatchNorm2d::new(&Cpu), rng));
        Block {
            conv1,
            bn1: stats(BatchNorm2d::new(&Cpu), rng),
            conv2,
            bn2: stats(BatchNorm2d::new(&Cpu), rng),
            down_conv,
            down_bn,
        }
    }

    fn run(&self, x: Image<I>) -> forma::Result<Image<O>> {
        let h: Image<O> = self.conv1.try_forward_as("conv1", x.clone())?;
        let h: Image<O> = self.bn1.try_forward_as("bn1", h)?;
        let h: Image<O> = self.conv2.try_forward_as("conv2", h.relu())?;
        let h: Image<O> = self.bn2.try_forward_as("bn2", h)?;
        let skip: Image<O> = match (&self.down_conv, &self.down_bn) {
            (Some(conv), Some(bn)) => forma::nn::scope::run("downsample", || {
                let s: Image<O> = conv.try_forward_as(0, x)?;
                bn.try_forward_as(1, s)
            })?,
            _ => x.into_dyn().try_reshape_to(h.shape())?,
        };
        Ok((h + skip).relu())
    }
}

/// Running statistics and affine parameters that are not the identity.
fn stats<const CH: usize>(bn: BatchNorm2d<CH>, rng: &mut Rng) -> BatchNorm2d<CH> {
    for (t, lo) in [(&bn.running_mean, -0.5), (&bn.running_var, 0.5)] {
        let v: Vec<f32> = (0..CH)
            .map(|i| lo + (i as f32 * 0.37).sin().abs())
            .collect();
        t.as_ref()
            .unwrap()
            .try_assign_data(&TensorData::from_vec(&v, vec![CH]).unwrap())
            .unwrap();
    }
    let w = Tensor::<(Dyn,)>::randn((Dyn(CH),), rng).to_vec();
    bn.weight
        .as_ref()
        .unwrap()
        .try_assign_data(&TensorData::from_vec(&w, vec![CH]).unwrap())
        .unwrap();
    bn
}

/// A ResNet in miniature: a stem, a plain block and a downsampling one,
/// global average pooling and a classifier.
#[derive(Module)]
struct ResNet {
    conv1: Conv2d<3, 8, 3, 1, 1>,
    bn1: BatchNorm2d<8>,
    layer1: Block<8, 8, 1>,
    layer2: Block<8, 16, 2>,
    fc: Linear<16, 5>,
}

impl Forward<Tensor<(Dyn, C<3>, C<12>, C<12>)>, Tensor<(Dyn, C<5>)>> for ResNet {
    fn try_forward(
        &self,
        x: Tensor<(Dyn, C<3>, C<12>, C<12>)>,
    ) -> forma::Result<Tensor<(Dyn, C<5>)>> {
        // The spatial sizes as `Dyn` (the blocks' type): the same values.
        let x: Image<3> = x.try_reshape_to((Dyn(x.dims()[0]), C, Dyn(12), Dyn(12)))?;
        let h: Image<8> = self.conv1.try_forward_as("conv1", x)?;
        let h: Image<8> = self.bn1.try_forward_as("bn1", h)?;
        let h = forma::nn::scope::run("layer1", || self.layer1.run(h.relu()))?;
        let h = forma::nn::scope::run("layer2", || self.layer2.run(h))?;
        let pooled: Tensor<(Dyn, C<16>)> = h.mean::<3>().mean::<2>();
        self.fc.try_forward_as("fc", pooled)
    }
}

#[test]
fn resnet_with_batch_norm_runs_in_tract_at_two_batch_sizes() {
    let mut rng = Rng::seed_from(9);
    let mut model = ResNet {
        conv1: Conv2d::new(&Cpu, &mut rng),
        bn1: stats(BatchNorm2d::new(&Cpu), &mut rng),
        layer1: Block::new(&mut rng),
        layer2: Block::new(&mut rng),
        fc: Linear::new(&Cpu, &mut rng),
    };
    model.eval();
    let mk = |b: usize, rng: &mut Rng| f32_input((Dyn(b), C, C, C), rng);
    let (example, _) = mk(2, &mut rng);
    let runs = vec![mk(1, &mut rng), mk(4, &mut rng)];
    check("resnet", &model, example, runs);
}

/// Transposed convolution, GroupNorm, SiLU, average pooling without the
/// padded zeros, a permute, RMSNorm, log-softmax and a cumulative sum.
#[derive(Module)]
struct Zoo {
    up: forma::nn::layers::ConvTranspose2d<4, 6, 3, 2, 1, 1>,
    gn: forma::nn::layers::GroupNorm<3, 6>,
    rms: forma::nn::layers::RMSNorm<6>,
}

impl Forward<Tensor<(Dyn, C<4>, C<5>, C<5>)>, Tensor<(Dyn, C<25>, C<6>)>> for Zoo {
    fn try_forward(
        &self,
        x: Tensor<(Dyn, C<4>, C<5>, C<5>)>,
    ) -> forma::Result<Tensor<(Dyn, C<25>, C<6>)>> {
        let b = x.dims()[0];
        let h: Tensor<(Dyn, C<6>, C<10>, C<10>)> = forma::nn::child!(self.up, x)?;
        let h: Tensor<(Dyn, C<6>, C<10>, C<10>)> = forma::nn::child!(self.gn, h)?;
        let p = Pool2dParams {
            kernel: [3, 3],
            stride: [2, 2],
            padding: [1, 1],
            dilation: [1, 1],
            ceil_mode: false,
            count_include_pad: false,
        };
        let h = h.silu().try_avg_pool2d(p)?;
        let h: Tensor<(Dyn, C<6>, C<5>, C<5>)> = h.try_reshape_to((Dyn(b), C, C, C))?;
        let h = h.permute::<(Ax<0>, Ax<2>, Ax<3>, Ax<1>)>();
        let h: Tensor<(Dyn, C<5>, C<5>, C<6>)> = forma::nn::child!(self.rms, h)?;
        let h: Tensor<(Dyn, C<25>, C<6>)> = h.try_reshape_to((Dyn(b), C, C))?;
        Ok(h.log_softmax::<2>().cumsum::<1>())
    }
}

#[test]
fn transposed_conv_group_and_rms_norm_pooling_and_scans_run_in_tract() {
    let mut rng = Rng::seed_from(10);
    let model = Zoo {
        up: forma::nn::layers::ConvTranspose2d::new(&Cpu, &mut rng),
        gn: forma::nn::layers::GroupNorm::new(&Cpu),
        rms: forma::nn::layers::RMSNorm::new(&Cpu),
    };
    let mk = |b: usize, rng: &mut Rng| f32_input((Dyn(b), C, C, C), rng);
    let (example, _) = mk(2, &mut rng);
    let runs = vec![mk(1, &mut rng), mk(3, &mut rng)];
    check("zoo", &model, example, runs);
}
