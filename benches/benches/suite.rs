//! The side-by-side suite of issue 9: every workload in Forma and in PyTorch,
//! measured in the same run, printed as one table with the ratio to PyTorch.
//!
//! ```sh
//! cargo bench -p forma-benches --bench suite              # 3 rounds
//! cargo bench -p forma-benches --bench suite -- --rounds 1 --only matmul,mlp
//! ```
//!
//! PyTorch's side is `benches/suite.py`, one child process for the whole run
//! when `python3` can import `torch` (reported as absent otherwise). Each
//! round measures every workload on both sides back to back, the side that
//! goes first alternating between rounds. Both sides use 2 threads unless
//! `FORMA_BENCH_THREADS` says otherwise, and both measure each workload the
//! same way: warm-up calls, then timed repetitions; the table shows the
//! median over every repetition of every round, with min and max.
//!
//! The f32 peak in the header is measured: an FMA loop (as many independent
//! chains as hide the FMA latency) on every thread at once, the best of a
//! few tries. The nominal figure from the clock `/proc/cpuinfo` reports is
//! printed beside it; a core that boosts past that clock beats it.

use forma::core::autocast::autocast;
use forma::core::tape::no_grad;
use forma::core::DType;
use forma::nn::layers::{
    Conv2d, Flatten, Gru, Linear, Lstm, MaxPool2d, Relu, TransformerEncoderLayer,
};
use forma::nn::loss::{cross_entropy, Mean};
use forma::nn::optim::{Adam, AdamOptions, Sgd, SgdOptions};
use forma::prelude::*;
use forma_benches::{minor_faults, peak_rss_mb, Sample, Table, Torch, Unit, Workload};
use forma_models::bert::{BertConfig, MiniLmL6};
use forma_models::gpt2::{Gpt2Config, Gpt2Small};
use forma_models::resnet::{ResNet18, ResNetConfig};
use forma_models::Sampling;
use std::process::Command;
use std::time::Instant;

/// The nominal f32 peak of one core in GFLOP/s: two FMA ports x the vector
/// lanes (16 with AVX-512, 8 with AVX2+FMA or with AVX-512 on AMD's Zen 4,
/// whose FMA units are 256 bits wide) x 2 flops x the clock `/proc/cpuinfo`
/// gives (2.3 GHz when it gives none); and the ISA and clock, in words.
fn nominal_gflops_per_thread() -> (f64, String) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    // The first value of a field (the first CPU's).
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
    };
    let ghz = field("cpu MHz")
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(2.3, |mhz| mhz / 1e3);
    // AMD before Zen 5 (family 26) runs a 512-bit FMA as two 256-bit halves.
    let amd_256 = field("vendor_id").as_deref() == Some("AuthenticAMD")
        && field("cpu family").and_then(|f| f.parse::<u32>().ok()) < Some(26);
    let (lanes, isa) = match lanes() {
        (l, _) if l > 8.0 && amd_256 => (8.0, "AVX-512 on 256-bit FMA units"),
        other => other,
    };
    (2.0 * lanes * 2.0 * ghz, format!("{isa}, {ghz:.2} GHz"))
}

#[cfg(target_arch = "x86_64")]
fn lanes() -> (f64, &'static str) {
    if std::arch::is_x86_feature_detected!("avx512f") {
        (16.0, "AVX-512")
    } else if std::arch::is_x86_feature_detected!("fma") {
        (8.0, "AVX2+FMA")
    } else {
        (4.0, "SSE")
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn lanes() -> (f64, &'static str) {
    (4.0, "128-bit SIMD")
}

/// The f32 GFLOP/s of `threads` threads each running an FMA loop at once
/// (the best of five tries of 50-100 ms), or `None` without a loop for
/// this CPU.
fn measured_gflops(threads: usize) -> Option<f64> {
    let per_call = fma_loop(1)?;
    let iters = 1usize << 25;
    let best = (0..5)
        .map(|_| {
            let start = Instant::now();
            rayon::broadcast(|_| fma_loop(iters));
            (iters as f64 * per_call * threads as f64) / start.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max);
    Some(best)
}

/// Runs `iters` iterations of 12 independent vector FMAs (the widest this
/// CPU has), in assembly so that nothing is optimised away; returns the
/// flops of one iteration, or `None` without FMA.
#[cfg(target_arch = "x86_64")]
fn fma_loop(iters: usize) -> Option<f64> {
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; the loop only touches the
        // registers it declares.
        unsafe { fma_loop_avx512(iters) };
        Some(12.0 * 16.0 * 2.0)
    } else if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA; as above.
        unsafe { fma_loop_avx2(iters) };
        Some(12.0 * 8.0 * 2.0)
    } else {
        None
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_loop(_iters: usize) -> Option<f64> {
    None
}

/// Defines an FMA loop over one register class: 12 accumulators (more
/// than FMA latency x ports on every x86 core) and two operands, all
/// zeroed first (`$xor`), so no value is ever denormal.
macro_rules! fma_loop_fn {
    ($name:ident, $feature:literal, $class:ident, $xor:literal) => {
        /// # Safety
        /// The CPU has the ISA the loop is compiled for.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        unsafe fn $name(iters: usize) {
            if iters == 0 {
                return;
            }
            // SAFETY: the loop writes only the registers given to it.
            unsafe {
                std::arch::asm!(
                    concat!($xor, " {x}, {x}, {x}"),
                    concat!($xor, " {y}, {y}, {y}"),
                    concat!($xor, " {a0}, {a0}, {a0}"),
                    concat!($xor, " {a1}, {a1}, {a1}"),
                    concat!($xor, " {a2}, {a2}, {a2}"),
                    concat!($xor, " {a3}, {a3}, {a3}"),
                    concat!($xor, " {a4}, {a4}, {a4}"),
                    concat!($xor, " {a5}, {a5}, {a5}"),
                    concat!($xor, " {a6}, {a6}, {a6}"),
                    concat!($xor, " {a7}, {a7}, {a7}"),
                    concat!($xor, " {a8}, {a8}, {a8}"),
                    concat!($xor, " {a9}, {a9}, {a9}"),
                    concat!($xor, " {a10}, {a10}, {a10}"),
                    concat!($xor, " {a11}, {a11}, {a11}"),
                    "2:",
                    "vfmadd231ps {a0}, {x}, {y}",
                    "vfmadd231ps {a1}, {x}, {y}",
                    "vfmadd231ps {a2}, {x}, {y}",
                    "vfmadd231ps {a3}, {x}, {y}",
                    "vfmadd231ps {a4}, {x}, {y}",
                    "vfmadd231ps {a5}, {x}, {y}",
                    "vfmadd231ps {a6}, {x}, {y}",
                    "vfmadd231ps {a7}, {x}, {y}",
                    "vfmadd231ps {a8}, {x}, {y}",
                    "vfmadd231ps {a9}, {x}, {y}",
                    "vfmadd231ps {a10}, {x}, {y}",
                    "vfmadd231ps {a11}, {x}, {y}",
                    "dec {n}",
                    "jnz 2b",
                    n = inout(reg) iters => _,
                    x = out($class) _,
                    y = out($class) _,
                    a0 = out($class) _,
                    a1 = out($class) _,
                    a2 = out($class) _,
                    a3 = out($class) _,
                    a4 = out($class) _,
                    a5 = out($class) _,
                    a6 = out($class) _,
                    a7 = out($class) _,
                    a8 = out($class) _,
                    a9 = out($class) _,
                    a10 = out($class) _,
                    a11 = out($class) _,
                    options(nomem, nostack),
                );
            }
        }
    };
}

fma_loop_fn!(fma_loop_avx2, "avx2,fma", ymm_reg, "vpxor");
fma_loop_fn!(fma_loop_avx512, "avx512f", zmm_reg, "vpxord");

/// Seconds of CPU time the hypervisor has taken from this machine since
/// boot, all CPUs together (`steal` in `/proc/stat`), where Linux says.
fn stolen_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: f64 = stat
        .lines()
        .next()?
        .split_whitespace()
        .nth(8)?
        .parse()
        .ok()?;
    // USER_HZ is 100 on every Linux architecture Forma builds for.
    Some(ticks / 100.0)
}

/// The CPUs this process may run on.
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn threads() -> usize {
    std::env::var("FORMA_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2)
}

// ---- workloads -------------------------------------------------------------

fn matmul(m: usize, k: usize, n: usize, rng: &mut Rng) -> Sample {
    let a = Tensor::<(Dyn, Dyn)>::randn((Dyn(m), Dyn(k)), rng);
    let b = Tensor::<(Dyn, Dyn)>::randn((Dyn(k), Dyn(n)), rng);
    let flops = 2.0 * (m * k * n) as f64;
    let reps = (2e10 / flops).clamp(5.0, 200.0) as usize;
    Sample::time(3, reps, || {
        std::hint::black_box(a.matmul(&b));
    })
    .rate(flops / 1e9)
}

/// A bf16 product: both operands and the result bf16 (PyTorch's
/// `a @ b` on bfloat16 tensors).
fn matmul_bf16(n: usize, rng: &mut Rng) -> Sample {
    let a = Tensor::<(Dyn, Dyn)>::randn((Dyn(n), Dyn(n)), rng).to_dtype::<bf16>();
    let b = Tensor::<(Dyn, Dyn)>::randn((Dyn(n), Dyn(n)), rng).to_dtype::<bf16>();
    let flops = 2.0 * (n * n * n) as f64;
    let reps = (2e10 / flops).clamp(5.0, 200.0) as usize;
    Sample::time(3, reps, || {
        std::hint::black_box(a.matmul(&b));
    })
    .rate(flops / 1e9)
}

#[derive(Module, Sequential, Debug)]
#[sequential(input = [B, 784], output = [B, 10])]
struct Mlp {
    fc1: Linear<784, 512>,
    act1: Relu,
    fc2: Linear<512, 512>,
    act2: Relu,
    fc3: Linear<512, 10>,
}

impl Mlp {
    fn new(rng: &mut Rng) -> Self {
        Mlp {
            fc1: Linear::new(&Cpu, rng),
            act1: Relu,
            fc2: Linear::new(&Cpu, rng),
            act2: Relu,
            fc3: Linear::new(&Cpu, rng),
        }
    }
}

fn mlp_batch(rng: &mut Rng) -> (Tensor<(Dyn, C<784>)>, Tensor<(Dyn,), i64>) {
    let batch = 128;
    let x = Tensor::<(Dyn, C<784>)>::randn((Dyn(batch), C), rng);
    (x, labels(batch))
}

/// Class labels `0, 1, ..., 9, 0, ...` for a batch.
fn labels(batch: usize) -> Tensor<(Dyn,), i64> {
    Tensor::from_vec((0..batch as i64).map(|i| i % 10).collect(), (Dyn(batch),)).unwrap()
}

/// One training step: forward, cross-entropy, backward, optimizer update;
/// the forward and the loss under autocast to `amp` when given (PyTorch's
/// recipe: backward outside the autocast region).
fn train_step<X: Clone, M: Module + Forward<X, Tensor<(Dyn, C<10>)>>>(
    model: &M,
    opt: &mut impl Optimizer,
    x: &X,
    y: &Tensor<(Dyn,), i64>,
    amp: Option<DType>,
) {
    opt.zero_grad(model);
    let loss = {
        let _amp = amp.map(autocast);
        cross_entropy(&model.forward(x.clone()), y, Mean)
    };
    loss.backward();
    opt.step(model);
    std::hint::black_box(loss.item());
}

fn mlp_step(rng: &mut Rng, amp: Option<DType>) -> Sample {
    let model = Mlp::new(rng);
    let mut opt: Adam = Adam::new(AdamOptions::default());
    let (x, y) = mlp_batch(rng);
    Sample::time(5, 50, || train_step(&model, &mut opt, &x, &y, amp))
}

/// The MLP step through `forma::compile`; the first call (the capture) is
/// timed apart and printed.
fn mlp_step_compiled(rng: &mut Rng) -> Sample {
    let model = forma::compile(Mlp::new(rng));
    let mut opt: Adam = Adam::new(AdamOptions::default());
    let (x, y) = mlp_batch(rng);
    let start = Instant::now();
    train_step(&model, &mut opt, &x, &y, None);
    eprintln!(
        "forma compile, mlp step: first call (capture) {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    Sample::time(5, 50, || train_step(&model, &mut opt, &x, &y, None))
}

/// LeNet-5 as usually written today: ReLU and max pooling.
#[derive(Module, Sequential, Debug)]
#[sequential(input = [B, 1, 28, 28], output = [B, 10])]
struct LeNet5 {
    conv1: Conv2d<1, 6, 5, 1, 2>,
    act1: Relu,
    pool1: MaxPool2d<2>,
    conv2: Conv2d<6, 16, 5>,
    act2: Relu,
    pool2: MaxPool2d<2>,
    flatten: Flatten,
    fc1: Linear<400, 120>,
    act3: Relu,
    fc2: Linear<120, 84>,
    act4: Relu,
    fc3: Linear<84, 10>,
}

impl LeNet5 {
    fn new(rng: &mut Rng) -> Self {
        LeNet5 {
            conv1: Conv2d::new(&Cpu, rng),
            act1: Relu,
            pool1: MaxPool2d,
            conv2: Conv2d::new(&Cpu, rng),
            act2: Relu,
            pool2: MaxPool2d,
            flatten: Flatten,
            fc1: Linear::new(&Cpu, rng),
            act3: Relu,
            fc2: Linear::new(&Cpu, rng),
            act4: Relu,
            fc3: Linear::new(&Cpu, rng),
        }
    }
}

fn lenet_step(rng: &mut Rng, amp: Option<DType>) -> Sample {
    let model = LeNet5::new(rng);
    let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(0.01).momentum(0.9));
    let batch = 64;
    let x = Tensor::<(Dyn, C<1>, C<28>, C<28>)>::randn((Dyn(batch), C, C, C), rng);
    let y = labels(batch);
    Sample::time(5, 50, || train_step(&model, &mut opt, &x, &y, amp))
}

/// The LeNet step through `forma::compile`; the first call (the capture)
/// is timed apart and printed.
fn lenet_step_compiled(rng: &mut Rng) -> Sample {
    let model = forma::compile(LeNet5::new(rng));
    let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(0.01).momentum(0.9));
    let batch = 64;
    let x = Tensor::<(Dyn, C<1>, C<28>, C<28>)>::randn((Dyn(batch), C, C, C), rng);
    let y = labels(batch);
    let start = Instant::now();
    train_step(&model, &mut opt, &x, &y, None);
    eprintln!(
        "forma compile, lenet step: first call (capture) {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    Sample::time(5, 50, || train_step(&model, &mut opt, &x, &y, None))
}

/// A 2-layer recurrent net, input 128, hidden 256, batch 32, 64 steps,
/// Adam (issue 36's held-out shape): one training step on the mean square
/// of the last layer's outputs (`$step` returns it as a closure).
macro_rules! rnn_step {
    ($name:ident, $step:ident, $layer:ident) => {
        fn $step(rng: &mut Rng) -> impl FnMut() {
            let net = $layer::<128, 256>::new(2, &Cpu, rng);
            let mut opt: Adam = Adam::new(AdamOptions::default());
            let x = Tensor::<(Dyn, Dyn, C<128>)>::randn((Dyn(32), Dyn(64), C), rng);
            move || {
                opt.zero_grad(&net);
                let y: Tensor<(Dyn, Dyn, C<256>)> = net.forward(x.clone());
                let loss = y.square().mean_all();
                loss.backward();
                opt.step(&net);
                std::hint::black_box(loss.item());
            }
        }

        fn $name(rng: &mut Rng) -> Sample {
            Sample::time(2, 8, $step(rng))
        }
    };
}

rnn_step!(lstm_step, lstm_trainer, Lstm);
rnn_step!(gru_step, gru_trainer, Gru);

/// torchvision's ResNet-18 (BasicBlocks, BatchNorm in training mode) with a
/// 10-class head: one SGD-momentum step on a batch of 16 images 3x64x64
/// (issue 36's held-out shape).
fn resnet_train_model(rng: &mut Rng) -> (ResNet18<10>, Tensor<(Dyn, C<3>, C<64>, C<64>)>) {
    let model = ResNet18::<10>::new(&ResNetConfig::resnet18(), &Cpu, rng);
    let x = Tensor::<(Dyn, C<3>, C<64>, C<64>)>::randn((Dyn(16), C, C, C), rng);
    (model, x)
}

fn resnet_trainer(rng: &mut Rng) -> impl FnMut() {
    let (model, x) = resnet_train_model(rng);
    let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(0.01).momentum(0.9));
    let y = labels(16);
    move || train_step(&model, &mut opt, &x, &y, None)
}

fn resnet_step(rng: &mut Rng) -> Sample {
    Sample::time(2, 5, resnet_trainer(rng))
}

/// ResNet-18 inference (eval mode, no graph) on `batch` images 3x224x224.
fn resnet_infer(batch: usize, rng: &mut Rng) -> Sample {
    let mut model = ResNet18::<1000>::new(&ResNetConfig::resnet18(), &Cpu, rng);
    model.eval();
    let x = Tensor::<(Dyn, C<3>, C<224>, C<224>)>::randn((Dyn(batch), C, C, C), rng);
    let reps = if batch == 1 { 20 } else { 3 };
    Sample::time(2, reps, || {
        let _guard = no_grad();
        let y: Tensor<(Dyn, C<1000>)> = model.forward(x.clone());
        std::hint::black_box(y);
    })
}

/// ResNet-18 inference through `forma::compile`; the first call (the
/// capture) is timed apart and printed.
fn resnet_infer_compiled(batch: usize, rng: &mut Rng) -> Sample {
    let mut model = ResNet18::<1000>::new(&ResNetConfig::resnet18(), &Cpu, rng);
    model.eval();
    let model = forma::compile(model);
    let x = Tensor::<(Dyn, C<3>, C<224>, C<224>)>::randn((Dyn(batch), C, C, C), rng);
    let run = || {
        let _guard = no_grad();
        let y: Tensor<(Dyn, C<1000>)> = model.forward(x.clone());
        std::hint::black_box(y);
    };
    let start = Instant::now();
    run();
    eprintln!(
        "forma compile, resnet18 b{batch}: first call (capture) {:.1} ms; {:?}",
        start.elapsed().as_secs_f64() * 1e3,
        model.stats()
    );
    Sample::time(2, 3, run)
}

/// GPT-2 small (random weights, eval mode) generating 32 tokens greedily
/// after a 16-token prompt with its KV cache; the rate is new tokens per
/// second of the whole call (the prompt's pass included), as PyTorch's
/// `generate(max_new_tokens=32, do_sample=False)` is timed.
fn gpt2_generate(rng: &mut Rng) -> Sample {
    let mut model = Gpt2Small::new(&Gpt2Config::gpt2_small(), &Cpu, rng);
    model.eval();
    let prompt: Vec<i64> = (0..16).map(|i| (i * 997 + 13) % 50257).collect();
    let mut draw = Rng::seed_from(0);
    Sample::time(1, 3, || {
        let ids = model
            .generate(&prompt, 32, Sampling::Greedy, &mut draw)
            .expect("generate 32 tokens");
        assert_eq!(ids.len(), 16 + 32, "the prompt and 32 new tokens");
        std::hint::black_box(ids);
    })
    .rate(32.0)
}

/// all-MiniLM-L6-v2-shaped BERT (random weights, eval mode, no graph) on
/// token ids `[32, 128]`.
fn bert_infer(rng: &mut Rng) -> Sample {
    let mut model = MiniLmL6::new(&BertConfig::minilm_l6(), &Cpu, rng);
    model.eval();
    let (batch, len) = (32, 128);
    let ids: Vec<i64> = (0..batch * len)
        .map(|i| (i as i64 * 7919) % 30522)
        .collect();
    let ids = Tensor::<(Dyn, Dyn), i64>::from_vec(ids, (Dyn(batch), Dyn(len))).unwrap();
    Sample::time(1, 5, || {
        let _guard = no_grad();
        let out = model.run(&ids, None, None).expect("run BERT");
        std::hint::black_box(out);
    })
}

/// The BERT of [`bert_infer`] through `forma::compile`; the first call
/// (the capture) is timed apart and printed.
fn bert_infer_compiled(rng: &mut Rng) -> Sample {
    let mut model = MiniLmL6::new(&BertConfig::minilm_l6(), &Cpu, rng);
    model.eval();
    let model = forma::compile(model);
    let (batch, len) = (32, 128);
    let ids: Vec<i64> = (0..batch * len)
        .map(|i| (i as i64 * 7919) % 30522)
        .collect();
    let ids = Tensor::<(Dyn, Dyn), i64>::from_vec(ids, (Dyn(batch), Dyn(len))).unwrap();
    let run = || {
        let _guard = no_grad();
        let out = model.forward(ids.clone());
        std::hint::black_box(out);
    };
    let start = Instant::now();
    run();
    eprintln!(
        "forma compile, bert b{batch} s{len}: first call (capture) {:.1} ms; {:?}",
        start.elapsed().as_secs_f64() * 1e3,
        model.stats()
    );
    Sample::time(1, 5, run)
}

type EncoderLayer = TransformerEncoderLayer<384, 12, 1536>;

fn encoder(batch: usize, seq: usize, rng: &mut Rng, amp: Option<DType>) -> Sample {
    let mut layers: Vec<EncoderLayer> = (0..6).map(|_| EncoderLayer::new(&Cpu, rng)).collect();
    for layer in &mut layers {
        layer.eval();
    }
    let x = Tensor::<(Dyn, Dyn, C<384>)>::randn((Dyn(batch), Dyn(seq), C), rng);
    let reps = if batch * seq >= 512 { 10 } else { 50 };
    Sample::time(2, reps, || {
        let _guard = no_grad();
        let _amp = amp.map(autocast);
        let mut h = x.clone();
        for layer in &layers {
            h = layer.forward(h);
        }
        std::hint::black_box(h);
    })
}

/// The encoder as one module, for export.
#[derive(Module)]
struct Encoder {
    layers: Vec<EncoderLayer>,
}

impl Forward<Tensor<(Dyn, Dyn, C<384>)>, Tensor<(Dyn, Dyn, C<384>)>> for Encoder {
    fn try_forward(
        &self,
        x: Tensor<(Dyn, Dyn, C<384>)>,
    ) -> forma::Result<Tensor<(Dyn, Dyn, C<384>)>> {
        let mut h = x;
        for i in 0..self.layers.len() {
            h = forma::nn::child!(self.layers[i], h)?;
        }
        Ok(h)
    }
}

fn eval_encoder(rng: &mut Rng) -> Encoder {
    let mut model = Encoder {
        layers: (0..6).map(|_| EncoderLayer::new(&Cpu, rng)).collect(),
    };
    model.eval();
    model
}

/// The encoder through `forma::compile`; the first call (the capture) is
/// timed apart and printed.
fn encoder_compiled(batch: usize, seq: usize, rng: &mut Rng) -> Sample {
    let model = forma::compile(eval_encoder(rng));
    let x = Tensor::<(Dyn, Dyn, C<384>)>::randn((Dyn(batch), Dyn(seq), C), rng);
    let run = || {
        let _guard = no_grad();
        std::hint::black_box(model.forward(x.clone()));
    };
    let start = Instant::now();
    run();
    eprintln!(
        "forma compile, encoder b{batch} s{seq}: first call (capture) {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    let reps = if batch * seq >= 512 { 10 } else { 50 };
    Sample::time(2, reps, run)
}

/// The encoder exported to ONNX bytes (capture, lowering, encoding; the
/// file write is left out on both sides), batch and sequence symbolic.
fn export_onnx_bytes(model: &Encoder, x: &Tensor<(Dyn, Dyn, C<384>)>) -> usize {
    let graph = forma::nn::capture::capture(model, x.clone()).expect("capture the encoder");
    forma_onnx::to_onnx_bytes(&graph, &[])
        .expect("export the encoder")
        .len()
}

fn export_encoder(rng: &mut Rng) -> Sample {
    let model = eval_encoder(rng);
    let x = Tensor::<(Dyn, Dyn, C<384>)>::randn((Dyn(1), Dyn(16), C), rng);
    Sample::time(1, 5, || {
        std::hint::black_box(export_onnx_bytes(&model, &x));
    })
}

/// The export whose peak resident memory is compared, in a child process
/// (`--rss-export`): the model built, then exported once.
fn rss_export_child() {
    let mut rng = Rng::seed_from(0);
    let model = eval_encoder(&mut rng);
    let x = Tensor::<(Dyn, Dyn, C<384>)>::randn((Dyn(1), Dyn(16), C), &mut rng);
    let before = peak_rss_mb().unwrap_or(f64::NAN);
    let bytes = export_onnx_bytes(&model, &x);
    eprintln!(
        "forma encoder export: {:.1} MB file, peak RSS {before:.0} MB before the export",
        bytes as f64 / 1e6
    );
    println!("{}", peak_rss_mb().unwrap_or(f64::NAN));
}

fn rss_export() -> Sample {
    let exe = std::env::current_exe().expect("own path");
    let out = Command::new(exe)
        .arg("--rss-export")
        .env("RAYON_NUM_THREADS", threads().to_string())
        .output()
        .expect("run the export child process");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    Sample::value(text.trim().parse().unwrap_or(f64::NAN))
}

fn gelu_chain(rng: &mut Rng) -> Sample {
    let n = 1 << 22;
    let x = Tensor::<(Dyn,)>::randn((Dyn(n),), rng);
    let w = Tensor::<(Dyn,)>::randn((Dyn(n),), rng);
    let b = Tensor::<(Dyn,)>::randn((Dyn(n),), rng);
    // Effective bytes: three inputs read and one output written. Forma runs
    // the chain as one fused expression (PyTorch eager runs three ops).
    Sample::time(3, 30, || {
        std::hint::black_box(forma::fused((&x, &w, &b), |(x, w, b)| (x * w + b).gelu()));
    })
    .rate(16.0 * n as f64 / 1e9)
}

/// A training process whose peak resident memory is compared, run in a
/// child process (`--rss KIND`) so nothing else counts: `mlp` (the MLP
/// step), `mlp-bf16` (the same under bf16 autocast), `resnet` (the
/// ResNet-18 step), `lstm` (the LSTM step), and the inference processes
/// `encoder` and `encoder-compiled` (the encoder on b8 s128, eager or
/// through `forma::compile`). The peak after `steps`
/// steps is printed, with the minor page faults per step of the second
/// half (fresh pages: 0 when every buffer was reused).
fn rss_child(kind: &str) {
    let mut rng = Rng::seed_from(0);
    let (steps, mut step): (usize, Box<dyn FnMut()>) = match kind {
        "mlp" | "mlp-bf16" => {
            let amp = (kind == "mlp-bf16").then_some(DType::BF16);
            let model = Mlp::new(&mut rng);
            let mut opt: Adam = Adam::new(AdamOptions::default());
            let (x, y) = mlp_batch(&mut rng);
            (
                20,
                Box::new(move || train_step(&model, &mut opt, &x, &y, amp)),
            )
        }
        "resnet" => (6, Box::new(resnet_trainer(&mut rng))),
        "lstm" => (4, Box::new(lstm_trainer(&mut rng))),
        "encoder" | "encoder-compiled" => {
            let model = forma::compile(eval_encoder(&mut rng));
            let x = Tensor::<(Dyn, Dyn, C<384>)>::randn((Dyn(8), Dyn(128), C), &mut rng);
            let compiled = kind == "encoder-compiled";
            (
                4,
                Box::new(move || {
                    let _guard = no_grad();
                    let y = match compiled {
                        true => model.forward(x.clone()),
                        false => model.eager().forward(x.clone()),
                    };
                    std::hint::black_box(y);
                }),
            )
        }
        other => panic!("no process named {other}"),
    };
    let mut faults = 0;
    for i in 0..steps {
        if i == steps / 2 {
            faults = minor_faults().unwrap_or(0);
        }
        step();
    }
    let per_step =
        minor_faults().unwrap_or(0).saturating_sub(faults) as f64 / (steps - steps / 2) as f64;
    println!("{} {per_step}", peak_rss_mb().unwrap_or(f64::NAN));
}

/// The peak resident memory of the training process `kind` (see
/// [`rss_child`]), in MB.
fn rss_train(kind: &str) -> Sample {
    let exe = std::env::current_exe().expect("own path");
    let out = Command::new(exe)
        .args(["--rss", kind])
        .env("RAYON_NUM_THREADS", threads().to_string())
        .output()
        .expect("run the training child process");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text
        .split_whitespace()
        .map(|v| v.parse::<f64>().unwrap_or(f64::NAN));
    let (mb, faults) = (
        fields.next().unwrap_or(f64::NAN),
        fields.next().unwrap_or(f64::NAN),
    );
    eprintln!(
        "forma {kind}, steady state: {faults:.0} minor page faults per step ({:.2} MB of fresh pages)",
        faults * 4096.0 / 1e6
    );
    Sample::value(mb)
}

fn workloads() -> Vec<Workload> {
    let mut w = Vec::new();
    for n in [128, 256, 512, 1024, 2048] {
        w.push(Workload::new(
            &format!("matmul {n}"),
            &format!("matmul f32 {n}x{n}"),
            Unit::Gflops,
            1.0,
            Box::new(move |rng| matmul(n, n, n, rng)),
        ));
    }
    w.push(Workload::new(
        "matmul 64x784x512",
        "matmul 64x784 @ 784x512",
        Unit::Gflops,
        1.0,
        Box::new(|rng| matmul(64, 784, 512, rng)),
    ));
    w.push(Workload::new(
        "mlp step",
        "MLP 784-512-512-10 b128 Adam step",
        Unit::Millis,
        0.8,
        Box::new(|rng| mlp_step(rng, None)),
    ));
    w.push(Workload::new(
        "lenet step",
        "LeNet-5 b64 SGD-momentum step",
        Unit::Millis,
        0.8,
        Box::new(|rng| lenet_step(rng, None)),
    ));
    w.push(Workload::new(
        "lstm step",
        "LSTM 2x128->256 b32 s64 Adam step",
        Unit::Millis,
        0.8,
        Box::new(lstm_step),
    ));
    w.push(Workload::new(
        "gru step",
        "GRU 2x128->256 b32 s64 Adam step",
        Unit::Millis,
        0.8,
        Box::new(gru_step),
    ));
    w.push(Workload::new(
        "encoder b8 s128",
        "encoder 6x384/12h/1536 b8 s128",
        Unit::Millis,
        0.9,
        Box::new(|rng| encoder(8, 128, rng, None)),
    ));
    w.push(Workload::new(
        "encoder b32 s128",
        "encoder 6x384/12h/1536 b32 s128",
        Unit::Millis,
        1.0,
        Box::new(|rng| encoder(32, 128, rng, None)),
    ));
    w.push(Workload::new(
        "encoder b1 s16",
        "encoder 6x384/12h/1536 b1 s16",
        Unit::Millis,
        0.5,
        Box::new(|rng| encoder(1, 16, rng, None)),
    ));
    w.push(Workload::new(
        "compiled mlp step",
        "MLP step, forma::compile vs torch.compile",
        Unit::Millis,
        1.0,
        Box::new(mlp_step_compiled),
    ));
    w.push(Workload::new(
        "compiled lenet step",
        "LeNet step, forma::compile vs torch.compile",
        Unit::Millis,
        1.0,
        Box::new(lenet_step_compiled),
    ));
    w.push(Workload::new(
        "compiled encoder b1 s16",
        "encoder b1 s16, forma::compile vs torch.compile",
        Unit::Millis,
        1.0,
        Box::new(|rng| encoder_compiled(1, 16, rng)),
    ));
    w.push(Workload::new(
        "compiled encoder b8 s128",
        "encoder b8 s128, forma::compile vs torch.compile",
        Unit::Millis,
        1.0,
        Box::new(|rng| encoder_compiled(8, 128, rng)),
    ));
    w.push(Workload::new(
        "compiled resnet18 b16",
        "ResNet-18 b16 inference, forma::compile vs torch.compile",
        Unit::Millis,
        1.0,
        Box::new(|rng| resnet_infer_compiled(16, rng)),
    ));
    w.push(Workload::new(
        "compiled bert b32 s128",
        "MiniLM-shaped BERT b32 s128, forma::compile vs torch.compile",
        Unit::Millis,
        1.0,
        Box::new(bert_infer_compiled),
    ));
    w.push(Workload::new(
        "rss encoder b8",
        "peak RSS, encoder b8 s128 inference process",
        Unit::Megabytes,
        1.0,
        Box::new(|_| rss_train("encoder")),
    ));
    w.push(Workload::new(
        "rss compiled encoder b8",
        "peak RSS, encoder b8 s128, forma::compile vs torch.compile",
        Unit::Megabytes,
        1.0,
        Box::new(|_| rss_train("encoder-compiled")),
    ));
    w.push(Workload::new(
        "gelu chain",
        "gelu(x * w + b) 4M f32",
        Unit::GBps,
        2.0,
        Box::new(gelu_chain),
    ));
    w.push(Workload::new(
        "export encoder",
        "ONNX export, encoder 6x384/12h/1536",
        Unit::Millis,
        1.0,
        Box::new(export_encoder),
    ));
    w.push(Workload::new(
        "rss export",
        "peak RSS, encoder export process",
        Unit::Megabytes,
        1.0,
        Box::new(|_| rss_export()),
    ));
    w.push(Workload::new(
        "rss mlp",
        "peak RSS, MLP training process",
        Unit::Megabytes,
        0.1,
        Box::new(|_| rss_train("mlp")),
    ));
    // Issue 36's held-out workloads: conv nets with BatchNorm, recurrent
    // nets' memory, generation and a large-batch BERT.
    w.push(Workload::new(
        "resnet18 step",
        "ResNet-18 b16 3x64x64 SGD step",
        Unit::Millis,
        0.8,
        Box::new(resnet_step),
    ));
    for batch in [1, 16] {
        w.push(Workload::new(
            &format!("resnet18 b{batch}"),
            &format!("ResNet-18 b{batch} 3x224x224 inference"),
            Unit::Millis,
            0.9,
            Box::new(move |rng| resnet_infer(batch, rng)),
        ));
    }
    w.push(Workload::new(
        "gpt2 generate",
        "GPT-2 small 16+32 greedy, KV cache",
        Unit::TokensPerSec,
        1.2,
        Box::new(gpt2_generate),
    ));
    w.push(Workload::new(
        "bert b32 s128",
        "BERT (MiniLM shape) b32 s128",
        Unit::Millis,
        0.9,
        Box::new(bert_infer),
    ));
    w.push(Workload::new(
        "rss resnet18",
        "peak RSS, ResNet-18 train process",
        Unit::Megabytes,
        0.5,
        Box::new(|_| rss_train("resnet")),
    ));
    w.push(Workload::new(
        "rss lstm",
        "peak RSS, LSTM training process",
        Unit::Megabytes,
        0.5,
        Box::new(|_| rss_train("lstm")),
    ));
    // Mixed precision (issue 31): the same workloads under bf16 autocast
    // beside `torch.autocast("cpu", dtype=torch.bfloat16)`, and bf16 GEMM.
    let bf16 = Some(DType::BF16);
    for n in [512, 1024, 2048] {
        w.push(Workload::new(
            &format!("matmul bf16 {n}"),
            &format!("matmul bf16 {n}x{n}"),
            Unit::Gflops,
            1.0,
            Box::new(move |rng| matmul_bf16(n, rng)),
        ));
    }
    w.push(Workload::new(
        "mlp step bf16",
        "MLP step, bf16 autocast",
        Unit::Millis,
        1.0,
        Box::new(move |rng| mlp_step(rng, bf16)),
    ));
    w.push(Workload::new(
        "lenet step bf16",
        "LeNet-5 step, bf16 autocast",
        Unit::Millis,
        1.0,
        Box::new(move |rng| lenet_step(rng, bf16)),
    ));
    w.push(Workload::new(
        "encoder b8 s128 bf16",
        "encoder b8 s128, bf16 autocast",
        Unit::Millis,
        1.0,
        Box::new(move |rng| encoder(8, 128, rng, bf16)),
    ));
    w.push(Workload::new(
        "rss mlp bf16",
        "peak RSS, MLP training, bf16 autocast",
        Unit::Megabytes,
        1.0,
        Box::new(|_| rss_train("mlp-bf16")),
    ));
    w
}

// ---- driver ----------------------------------------------------------------

fn torch_available() -> Option<String> {
    let out = Command::new("python3")
        .args(["-c", "import torch; print(torch.__version__)"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--rss") {
        rss_child(args.get(i + 1).map_or("mlp", String::as_str));
        return;
    }
    if args.iter().any(|a| a == "--rss-export") {
        rss_export_child();
        return;
    }
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let rounds: usize = flag("--rounds").and_then(|s| s.parse().ok()).unwrap_or(3);
    let only = flag("--only");
    let threads = threads();
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .expect("the global thread pool is configured once, first");

    let mut table = Table::new(workloads(), only.as_deref());
    let torch = torch_available();
    let (per_thread, machine) = nominal_gflops_per_thread();
    let nominal = per_thread * threads as f64;
    let measured = measured_gflops(threads);
    let peak = measured.unwrap_or(nominal);
    println!(
        "Forma {} vs PyTorch {}, {threads} threads each, {rounds} rounds\n\
         f32 peak: {} GFLOP/s measured (an FMA loop on every thread); \
         nominal {nominal:.1} ({per_thread:.1} per thread: 2 FMA ports, {machine})",
        env!("CARGO_PKG_VERSION"),
        torch
            .as_deref()
            .unwrap_or("(absent: python3 cannot import torch)"),
        measured.map_or("(no FMA loop for this CPU)".to_string(), |g| format!(
            "{g:.1}"
        )),
    );
    let (started, stolen) = (Instant::now(), stolen_secs());
    let mut rng = Rng::seed_from(0);
    let mut server = torch.as_ref().and_then(|_| Torch::start(threads));
    for round in 1..=rounds {
        eprintln!("round {round}/{rounds}");
        table.run_round(&mut rng, server.as_mut(), round % 2 == 0);
    }
    drop(server);
    table.print(peak);
    if let (Some(s0), Some(s1)) = (stolen, stolen_secs()) {
        let wall = started.elapsed().as_secs_f64();
        println!(
            "\nCPU time the hypervisor took from this machine during the run: \
             {:.0}% of {wall:.0} s x {} CPUs (steal in /proc/stat)",
            100.0 * (s1 - s0) / (wall * cpus() as f64),
            cpus()
        );
    }
}
