//! The training example's pipeline (`cargo run --release -p forma-examples
//! --example train`): a CNN classifier trained end to end on 28x28 digits.
//!
//! 1. **Data**: the built-in renderer's digits ([`crate::digits`]), or
//!    MNIST-format IDX files with `--data DIR` (MNIST, Fashion-MNIST) or
//!    fetched by `--download` ([`crate::download`]), split
//!    into a training set and a held-out set, normalised with the training
//!    set's pixel mean and standard deviation.
//! 2. **Model**: [`Cnn`], a LeNet written as an annotated struct, or the
//!    [`Linear`](LinearModel) baseline (`--model linear`).
//! 3. **Loop**: a shuffling [`DataLoader`], [`cross_entropy`], [`Adam`]
//!    with an [`ExponentialLR`] decay per epoch, a progress bar with loss,
//!    accuracy and throughput.
//! 4. **Each epoch**: evaluation on the held-out set in eval mode under
//!    [`no_grad`], with its own progress bar; the best model so far saved
//!    atomically as safetensors (`best.safetensors`, loadable by PyTorch);
//!    the whole training state
//!    (model, optimizer, scheduler, loader position, metrics) saved as a
//!    [`TrainingState`] (`state.safetensors`) that `--resume` continues from
//!    exactly; `metrics.csv` and `metrics.png` rewritten.
//!
//! [`run`] is the whole job; the `train` example only parses the command
//! line and calls it, and the tests call it on a tiny configuration.
//!
//! The models and the loop are generic over the device (`D: Device<f32>`);
//! `--device` picks it. Batches come from the loader on the CPU and move to
//! the device (no copy when it is the CPU); checkpoints are device-neutral.
//! Only the CPU is wired so far: `--device cuda` is a [`TrainError::Device`].

mod args;
pub mod report;

/// What every line this run prints starts with: `[rank r/N] ` in a
/// data-parallel job, so the ranks' interleaved lines can be told apart.
static LINE_PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// What this process's lines start with: `[rank r/N] ` in a data-parallel
/// job, else nothing.
pub fn line_prefix() -> &'static str {
    LINE_PREFIX.get().map_or("", String::as_str)
}

/// `println!` with this process's [`LINE_PREFIX`].
macro_rules! say {
    ($($arg:tt)*) => {
        println!(
            "{}{}",
            $crate::train::line_prefix(),
            format_args!($($arg)*)
        )
    };
}

pub use args::{parse_args, Args, Command, DeviceArg, USAGE};
pub use report::EpochMetrics;

use crate::digits::{DigitSet, CLASSES};
use forma::core::autocast::autocast;
use forma::core::device::Backend;
use forma::core::tape::no_grad;
use forma::nn::data::{DataError, DataLoader, Dataset, DistributedSampler, Mnist, MnistSplit};
use forma::nn::layers::{Conv2d, Flatten, Linear, MaxPool2d, Relu};
use forma::nn::loss::{cross_entropy, Mean, Sum};
use forma::nn::optim::{Adam, AdamOptions, GradScaler, OptimError};
use forma::nn::sched::ExponentialLR;
use forma::nn::state::{CheckpointError, LoadError, TrainingState};
use forma::prelude::*;
use forma_distributed::{save_on_rank0, DistributedDataParallel, ProcessGroup};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// A batch of images, as the loader yields them and the models take them.
pub type Images = Tensor<(Dyn, C<1>, C<28>, C<28>)>;
/// A batch of class indices.
pub type Labels = Tensor<(Dyn,), i64>;
/// A batch of class scores (logits), on device `D`.
pub type Logits<D = Cpu> = Tensor<(Dyn, C<10>), f32, D>;
/// A batch of images on device `D`: what the models take.
pub type DeviceImages<D> = Tensor<(Dyn, C<1>, C<28>, C<28>), f32, D>;

/// A LeNet: two 5x5 convolutions with max pooling, then two fully connected
/// layers. `#[derive(Sequential)]` writes `forward` by chaining the fields
/// and checks every step's sizes when the program is built (change `fc1` to
/// `Linear<401, 64>` and `cargo build` says the flattened features are 400).
#[derive(Module, Sequential, Debug)]
#[sequential(input = [B, 1, 28, 28], output = [B, 10])]
pub struct Cnn<D: Device<f32> = Cpu> {
    /// 1 -> 8 channels, 5x5, padding 2: 28x28 -> 28x28.
    pub conv1: Conv2d<1, 8, 5, 1, 2, 1, f32, D>,
    /// ReLU.
    pub act1: Relu,
    /// 28x28 -> 14x14.
    pub pool1: MaxPool2d<2>,
    /// 8 -> 16 channels, 5x5: 14x14 -> 10x10.
    pub conv2: Conv2d<8, 16, 5, 1, 0, 1, f32, D>,
    /// ReLU.
    pub act2: Relu,
    /// 10x10 -> 5x5.
    pub pool2: MaxPool2d<2>,
    /// 16 x 5 x 5 = 400 features.
    pub flatten: Flatten,
    /// 400 -> 64.
    pub fc1: Linear<400, 64, f32, D>,
    /// ReLU.
    pub act3: Relu,
    /// 64 -> 10 class scores.
    pub fc2: Linear<64, 10, f32, D>,
}

impl Cnn {
    /// A model on the CPU with PyTorch's default initialisation, drawn from
    /// `rng`.
    pub fn new(rng: &mut Rng) -> Self {
        Cnn::new_on(&Cpu, rng)
    }
}

impl<D: Device<f32>> Cnn<D> {
    /// A model on `device`, drawn from `rng` as [`Cnn::new`] draws it.
    pub fn new_on(device: &D, rng: &mut Rng) -> Self {
        Cnn {
            conv1: Conv2d::new(device, rng),
            act1: Relu,
            pool1: MaxPool2d,
            conv2: Conv2d::new(device, rng),
            act2: Relu,
            pool2: MaxPool2d,
            flatten: Flatten,
            fc1: Linear::new(device, rng),
            act3: Relu,
            fc2: Linear::new(device, rng),
        }
    }
}

/// The baseline: multinomial logistic regression on the 784 pixels.
#[derive(Module, Sequential, Debug)]
#[sequential(input = [B, 1, 28, 28], output = [B, 10])]
pub struct LinearModel<D: Device<f32> = Cpu> {
    /// 1 x 28 x 28 = 784 features.
    pub flatten: Flatten,
    /// 784 -> 10 class scores.
    pub fc: Linear<784, 10, f32, D>,
}

impl LinearModel {
    /// A model on the CPU with PyTorch's default initialisation, drawn from
    /// `rng`.
    pub fn new(rng: &mut Rng) -> Self {
        LinearModel::new_on(&Cpu, rng)
    }
}

impl<D: Device<f32>> LinearModel<D> {
    /// A model on `device`, drawn from `rng` as [`LinearModel::new`] draws it.
    pub fn new_on(device: &D, rng: &mut Rng) -> Self {
        LinearModel {
            flatten: Flatten,
            fc: Linear::new(device, rng),
        }
    }
}

/// Which model to train (`--model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// [`Cnn`].
    Cnn,
    /// [`LinearModel`].
    Linear,
}

impl ModelKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Cnn => "cnn",
            ModelKind::Linear => "linear",
        }
    }

    /// The kind named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "cnn" => Some(ModelKind::Cnn),
            "linear" => Some(ModelKind::Linear),
            _ => None,
        }
    }
}

/// Mixed precision (`--amp`): the low type autocast computes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amp {
    /// bfloat16 autocast (f32's range: no loss scaling).
    Bf16,
    /// float16 autocast with a [`GradScaler`].
    F16,
}

impl Amp {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Amp::Bf16 => "bf16",
            Amp::F16 => "f16",
        }
    }

    /// The kind named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "bf16" => Some(Amp::Bf16),
            "f16" => Some(Amp::F16),
            _ => None,
        }
    }

    /// The dtype autocast computes in.
    pub fn dtype(self) -> DType {
        match self {
            Amp::Bf16 => DType::BF16,
            Amp::F16 => DType::F16,
        }
    }

    /// How the run is called in file names and the plot (`amp-bf16`).
    pub fn tag(self) -> String {
        format!("amp-{}", self.name())
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Reading the data failed.
    #[error("data: {0}")]
    Data(#[from] DataError),
    /// Writing or reading a checkpoint failed.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// A checkpoint does not fit the model.
    #[error("checkpoint: {0}")]
    Load(#[from] LoadError),
    /// The optimizer or scheduler refused a setting or a saved state.
    #[error("optimizer: {0}")]
    Optim(#[from] OptimError),
    /// `--resume` cannot continue what is saved.
    #[error("cannot resume: {0}")]
    Resume(String),
    /// A file could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Drawing or encoding an image failed.
    #[error("plot: {0}")]
    Plot(String),
    /// `--export-onnx` failed.
    #[error("onnx export: {0}")]
    Export(forma::Error),
    /// `--distributed`: the job could not start or a collective failed.
    #[error("distributed: {0}")]
    Distributed(#[from] forma_distributed::DistError),
    /// `--download` failed.
    #[error("download: {0}")]
    Download(#[from] crate::download::DownloadError),
    /// The device `--device` names cannot be used.
    #[error("device {device}: {reason}")]
    Device {
        /// The device asked for.
        device: DeviceArg,
        /// Why it cannot be used.
        reason: String,
    },
}

/// The default number of epochs.
pub const DEFAULT_EPOCHS: usize = 5;
/// The default batch size.
pub const DEFAULT_BATCH_SIZE: usize = 64;
/// The default learning rate.
pub const DEFAULT_LR: f64 = 2e-3;
/// Learning-rate decay per epoch ([`ExponentialLR`]'s `gamma`).
pub const LR_DECAY: f64 = 0.7;
/// The built-in training set's default size.
pub const DEFAULT_TRAIN_SIZE: usize = 16_000;
/// The built-in held-out set's default size.
pub const DEFAULT_TEST_SIZE: usize = 4_000;
/// The seed of the built-in data (fixed, so that every run, whatever its
/// `--seed`, sees the same images).
pub const DATA_SEED: u64 = 0x5EED_D161;

/// The settings that define a run: what `--resume` must find unchanged.
#[derive(Clone, Debug, PartialEq)]
struct Settings {
    model: ModelKind,
    data: Option<PathBuf>,
    train_size: Option<usize>,
    test_size: Option<usize>,
    batch_size: usize,
    lr: f64,
    seed: u64,
    amp: Option<Amp>,
}

impl Settings {
    fn to_extra(&self, extra: &mut BTreeMap<String, String>) {
        let opt = |v: Option<usize>| v.map_or_else(|| "all".to_string(), |n| n.to_string());
        extra.insert("model".into(), self.model.name().into());
        extra.insert(
            "data".into(),
            self.data
                .as_ref()
                .map_or_else(|| "built-in".to_string(), |p| p.display().to_string()),
        );
        extra.insert("train_size".into(), opt(self.train_size));
        extra.insert("test_size".into(), opt(self.test_size));
        extra.insert("batch_size".into(), self.batch_size.to_string());
        // `{:?}` prints the shortest text that reads back to the same f64.
        extra.insert("lr".into(), format!("{:?}", self.lr));
        extra.insert("seed".into(), self.seed.to_string());
        extra.insert("amp".into(), self.amp.map_or("off", Amp::name).into());
    }

    fn from_extra(extra: &BTreeMap<String, String>) -> Result<Self, TrainError> {
        let get = |k: &str| {
            extra
                .get(k)
                .map(String::as_str)
                .ok_or_else(|| TrainError::Resume(format!("the saved state has no `{k}`")))
        };
        let bad =
            |k: &str, v: &str| TrainError::Resume(format!("the saved `{k}` `{v}` is invalid"));
        let size = |k: &str| -> Result<Option<usize>, TrainError> {
            match get(k)? {
                "all" => Ok(None),
                v => v.parse().map(Some).map_err(|_| bad(k, v)),
            }
        };
        let model = get("model")?;
        let data = get("data")?;
        let (batch, lr, seed) = (get("batch_size")?, get("lr")?, get("seed")?);
        Ok(Settings {
            model: ModelKind::parse(model).ok_or_else(|| bad("model", model))?,
            data: (data != "built-in").then(|| PathBuf::from(data)),
            train_size: size("train_size")?,
            test_size: size("test_size")?,
            batch_size: batch.parse().map_err(|_| bad("batch_size", batch))?,
            lr: lr.parse().map_err(|_| bad("lr", lr))?,
            seed: seed.parse().map_err(|_| bad("seed", seed))?,
            // A state from before `--amp` trained in f32.
            amp: match extra.get("amp").map_or("off", String::as_str) {
                "off" => None,
                v => Some(Amp::parse(v).ok_or_else(|| bad("amp", v))?),
            },
        })
    }

    /// The saved settings, checked against the flags given with `--resume`.
    fn resumed(saved: Settings, args: &Args) -> Result<Self, TrainError> {
        let differ = |flag: &str, given: String, saved: String| {
            TrainError::Resume(format!(
                "{flag} {given} differs from the saved run's {saved}; drop the flag to continue \
                 the run, or start a new one without --resume"
            ))
        };
        if let Some(m) = args.model.filter(|&m| m != saved.model) {
            return Err(differ(
                "--model",
                m.name().into(),
                saved.model.name().into(),
            ));
        }
        if let Some(dir) = args
            .data
            .as_ref()
            .filter(|&d| Some(d) != saved.data.as_ref())
        {
            let was = saved
                .data
                .as_ref()
                .map_or_else(|| "built-in data".to_string(), |p| p.display().to_string());
            return Err(differ("--data", dir.display().to_string(), was));
        }
        let sizes = [
            ("--train-size", args.train_size, saved.train_size),
            ("--test-size", args.test_size, saved.test_size),
        ];
        for (flag, given, saved) in sizes {
            if let Some(n) = given.filter(|&n| Some(n) != saved) {
                let was = saved.map_or_else(|| "all".to_string(), |s| s.to_string());
                return Err(differ(flag, n.to_string(), was));
            }
        }
        if let Some(b) = args.batch_size.filter(|&b| b != saved.batch_size) {
            return Err(differ(
                "--batch-size",
                b.to_string(),
                saved.batch_size.to_string(),
            ));
        }
        if let Some(lr) = args.lr.filter(|&lr| lr != saved.lr) {
            return Err(differ("--lr", lr.to_string(), saved.lr.to_string()));
        }
        if let Some(s) = args.seed.filter(|&s| s != saved.seed) {
            return Err(differ("--seed", s.to_string(), saved.seed.to_string()));
        }
        // Each precision has its own files, so the flag selects the run and
        // always matches; the check guards a state copied by hand.
        if args.amp != saved.amp {
            let name = |a: Option<Amp>| a.map_or("off", Amp::name).to_string();
            return Err(differ("--amp", name(args.amp), name(saved.amp)));
        }
        Ok(saved)
    }
}

/// What a finished run reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Every epoch's metrics, the resumed ones included.
    pub metrics: Vec<EpochMetrics>,
    /// The best held-out accuracy (the one `best.safetensors` scores).
    pub best_test_acc: f64,
    /// The directory holding the files.
    pub out: PathBuf,
}

impl Summary {
    /// The last epoch's held-out accuracy.
    pub fn final_test_acc(&self) -> Option<f64> {
        self.metrics.last().map(|m| m.test_acc)
    }
}

/// The files a run writes in its output directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutFiles {
    /// The best model's weights, PyTorch's keys (`best.safetensors`).
    pub best: PathBuf,
    /// Everything `--resume` needs (`state.safetensors`).
    pub state: PathBuf,
    /// One row per epoch (`metrics.csv`).
    pub csv: PathBuf,
    /// Loss and accuracy curves (`metrics.png`).
    pub plot: PathBuf,
    /// A grid of training images (`samples.png`).
    pub samples: PathBuf,
    /// The best model as ONNX (`model.onnx`, with `--export-onnx`).
    pub onnx: PathBuf,
}

impl OutFiles {
    /// The files of an f32 run in `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        Self::for_run(dir, None)
    }

    /// The files of a run in `dir` at precision `amp`: an `--amp` run's
    /// are suffixed (`best-amp-bf16.safetensors`, ...), so it sits beside
    /// the f32 run; both share `metrics.png` and `samples.png`.
    pub fn for_run(dir: &Path, amp: Option<Amp>) -> Self {
        let suffix = amp.map_or_else(String::new, |a| format!("-{}", a.tag()));
        OutFiles {
            best: dir.join(format!("best{suffix}.safetensors")),
            state: dir.join(format!("state{suffix}.safetensors")),
            csv: dir.join(format!("metrics{suffix}.csv")),
            plot: dir.join("metrics.png"),
            samples: dir.join("samples.png"),
            onnx: dir.join(format!("model{suffix}.onnx")),
        }
    }
}

/// Every run's metrics found in `dir` (f32 first, then each `--amp` run),
/// labelled for the plot; `current` (this run's, not yet on disk) replaces
/// what its file holds.
fn runs_in(
    dir: &Path,
    current: (Option<Amp>, &[EpochMetrics]),
) -> Vec<(String, Vec<EpochMetrics>)> {
    let mut runs = Vec::new();
    for amp in [None, Some(Amp::Bf16), Some(Amp::F16)] {
        let label = amp.map_or_else(|| "f32".to_string(), |a| format!("{} autocast", a.name()));
        let rows = if amp == current.0 {
            current.1.to_vec()
        } else {
            // Another run's file: plotted when it is there and readable.
            let path = OutFiles::for_run(dir, amp).csv;
            match std::fs::read_to_string(path).map(|t| report::from_csv(&t)) {
                Ok(Ok(rows)) if !rows.is_empty() => rows,
                _ => continue,
            }
        };
        runs.push((label, rows));
    }
    runs
}

/// Where a training state keeps the gradient scaler's values (`--amp f16`).
const SCALER_KEY: &str = "grad_scaler.";

/// The entries of `extra` under `prefix`, without it.
fn unprefixed(extra: &BTreeMap<String, String>, prefix: &str) -> BTreeMap<String, String> {
    extra
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_string(), v.clone())))
        .collect()
}

/// The compiler that built this program, as the build script found it.
pub const RUSTC_VERSION: &str = env!("FORMA_EXAMPLES_RUSTC");

/// Runs the whole job as `args` asks, printing as it goes (a progress bar
/// on a terminal, a line per epoch), and returns the metrics.
///
/// # Errors
/// A [`TrainError`]: unreadable data, an unwritable output directory, a
/// state that `--resume` cannot continue.
pub fn run(args: &Args) -> Result<Summary, TrainError> {
    let world = if args.distributed {
        forma_distributed::init()?
    } else {
        ProcessGroup::single()
    };
    if world.world_size() > 1 {
        let _ = LINE_PREFIX.set(format!("[rank {}/{}] ", world.rank(), world.world_size()));
    } else if args.distributed {
        say!("distributed: not started by an MPI launcher (or built without --features distributed): training as one process");
    }
    match args.device {
        DeviceArg::Cpu => run_on(args, &Cpu, &world),
        #[cfg(feature = "cuda")]
        device @ DeviceArg::Cuda(ordinal) => {
            let cuda = forma::cuda::Cuda::new(ordinal).map_err(|e| TrainError::Device {
                device,
                reason: e.to_string(),
            })?;
            run_on(args, &cuda, &world)
        }
        #[cfg(not(feature = "cuda"))]
        device @ DeviceArg::Cuda(_) => Err(TrainError::Device {
            device,
            reason: "built without the `cuda` feature (add `--features cuda`)".into(),
        }),
    }
}

/// [`run`] on a given device, as one rank of `world`.
fn run_on<D: Device<f32>>(
    args: &Args,
    device: &D,
    world: &ProcessGroup,
) -> Result<Summary, TrainError> {
    // `--download` fills the cache, then the run reads it as `--data` would.
    let downloaded;
    let args = if args.download {
        say!(
            "data: MNIST from {} into {}",
            args.mirror,
            args.cache.display()
        );
        let report = crate::download::Download::mnist(&args.mirror, &args.cache)
            .progress(args.progress)
            .run()?;
        downloaded = Args {
            data: Some(report.dir),
            download: false,
            ..args.clone()
        };
        &downloaded
    } else {
        args
    };
    let files = OutFiles::for_run(&args.out, args.amp);
    let saved = if args.resume {
        if !files.state.exists() {
            return Err(TrainError::Resume(format!(
                "no saved run at {} (train without --resume first)",
                files.state.display()
            )));
        }
        Some(TrainingState::load(&files.state)?)
    } else {
        None
    };
    let settings = match &saved {
        Some(st) => Settings::resumed(Settings::from_extra(&st.extra)?, args)?,
        None => Settings {
            model: args.model.unwrap_or(ModelKind::Cnn),
            data: args.data.clone(),
            train_size: args.train_size,
            test_size: args.test_size,
            batch_size: args.batch_size.unwrap_or(DEFAULT_BATCH_SIZE),
            lr: args.lr.unwrap_or(DEFAULT_LR),
            seed: args.seed.unwrap_or(0),
            amp: args.amp,
        },
    };
    let epochs = args.epochs.unwrap_or(DEFAULT_EPOCHS);

    say!(
        "forma {} ({}, {} build)",
        env!("CARGO_PKG_VERSION"),
        RUSTC_VERSION,
        if cfg!(debug_assertions) {
            "debug: expect it to be slow; add --release"
        } else {
            "release"
        }
    );
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if device.name() == "cpu" {
        say!("device: cpu ({threads} threads)");
    } else {
        say!("device: {}", device.name());
    }
    say!("seed: {} (initialisation, shuffling)", settings.seed);

    let started = Instant::now();
    let (train_set, test_set, source) = load_data(&settings)?;
    let (mean, std) = train_set.pixel_stats();
    let train_set = train_set.normalize(mean, std);
    let test_set = test_set.normalize(mean, std);
    say!(
        "data: {source}: {} training / {} held-out images, normalised with mean {mean:.4} std {std:.4} ({:.1}s)",
        train_set.len(),
        test_set.len(),
        started.elapsed().as_secs_f64()
    );
    // Only rank 0 writes files.
    if world.rank() == 0 {
        std::fs::create_dir_all(&args.out).map_err(|source| TrainError::Io {
            path: args.out.clone(),
            source,
        })?;
        let shown: Vec<&[u8]> = (0..train_set.len().min(100))
            .filter_map(|i| train_set.pixels(i))
            .collect();
        report::save_image_grid(&files.samples, &shown, 10, 2)?;
    }

    let mut rng = Rng::seed_from(settings.seed);
    let run = Run {
        device,
        world,
        args,
        settings: &settings,
        epochs,
        files: &files,
    };
    match (settings.model, world.world_size() > 1) {
        (ModelKind::Cnn, false) => fit(
            Cnn::new_on(device, &mut rng),
            &run,
            saved,
            train_set,
            test_set,
        ),
        (ModelKind::Linear, false) => fit(
            LinearModel::new_on(device, &mut rng),
            &run,
            saved,
            train_set,
            test_set,
        ),
        // Every rank starts from rank 0's weights and averages its
        // gradients with the others' during backward.
        (ModelKind::Cnn, true) => {
            let model = DistributedDataParallel::new(Cnn::new_on(device, &mut rng), world)?;
            fit(model, &run, saved, train_set, test_set)
        }
        (ModelKind::Linear, true) => {
            let model = DistributedDataParallel::new(LinearModel::new_on(device, &mut rng), world)?;
            fit(model, &run, saved, train_set, test_set)
        }
    }
}

/// What [`fit`] runs with besides the model and the data.
struct Run<'a, D> {
    device: &'a D,
    world: &'a ProcessGroup,
    args: &'a Args,
    settings: &'a Settings,
    epochs: usize,
    files: &'a OutFiles,
}

/// The training and held-out sets and a description of where they come from.
fn load_data(s: &Settings) -> Result<(DigitSet, DigitSet, String), TrainError> {
    let (mut train, mut test, source) = match &s.data {
        None => {
            let train = DigitSet::generate(s.train_size.unwrap_or(DEFAULT_TRAIN_SIZE), DATA_SEED);
            // Another seed: no held-out image shares a random stream with a
            // training image.
            let test = DigitSet::generate(s.test_size.unwrap_or(DEFAULT_TEST_SIZE), DATA_SEED + 1);
            (
                train,
                test,
                format!("built-in digits (seed {DATA_SEED:#x})"),
            )
        }
        Some(dir) => {
            let train = Mnist::<(C<1>, C<28>, C<28>)>::from_dir(dir, MnistSplit::Train)?;
            let test = Mnist::<(C<1>, C<28>, C<28>)>::from_dir(dir, MnistSplit::Test)?;
            (
                DigitSet::from_mnist(&train),
                DigitSet::from_mnist(&test),
                format!("IDX files in {}", dir.display()),
            )
        }
    };
    if let Some(n) = s.train_size {
        train = train.truncated(n);
    }
    if let Some(n) = s.test_size {
        test = test.truncated(n);
    }
    if let Some(&bad) = train
        .labels()
        .iter()
        .chain(test.labels())
        .find(|&&l| l as usize >= CLASSES)
    {
        return Err(TrainError::Data(DataError::Invalid {
            what: "labels",
            reason: format!("label {bad} is not a class of 0..{CLASSES}"),
        }));
    }
    Ok((train, test, source))
}

/// A batch from the loader on `device`: the same tensor, without a copy,
/// when `device` is the CPU.
fn to_device<S: Shape, E: Dtype, D: Backend>(t: Tensor<S, E>, device: &D) -> Tensor<S, E, D> {
    let any: Box<dyn std::any::Any> = Box::new(t);
    match any.downcast::<Tensor<S, E, D>>() {
        Ok(same) => *same,
        Err(any) => match any.downcast::<Tensor<S, E>>() {
            Ok(t) => Tensor::to_device(&*t, device),
            Err(_) => unreachable!("the box holds a CPU tensor"),
        },
    }
}

/// Number of right answers among `logits` for `labels`.
fn correct<D: Device<f32>>(logits: &Logits<D>, labels: &Tensor<(Dyn,), i64, D>) -> usize {
    let pred = logits.argmax::<1>().to_vec();
    pred.iter()
        .zip(labels.to_vec())
        .filter(|(p, t)| **p == *t)
        .count()
}

/// A progress bar of `len` steps on stderr, drawn only when `shown` (indicatif
/// also hides it when stderr is not a terminal), laid out by `template`.
fn progress_bar(len: u64, shown: bool, template: &str, prefix: String) -> ProgressBar {
    let bar = if shown {
        ProgressBar::new(len)
    } else {
        ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden())
    };
    bar.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(prefix);
    bar
}

/// Mean loss and accuracy of `model` on `data`, in eval mode, without
/// recording a graph; a progress bar prefixed `prefix` counts the batches
/// when `progress` (about a second on the default data: long enough to
/// wonder what is happening).
fn evaluate<M, D>(
    model: &mut M,
    device: &D,
    data: &Arc<DigitSet>,
    amp: Option<Amp>,
    progress: bool,
    prefix: String,
) -> Result<(f64, f64), TrainError>
where
    M: Module + Forward<DeviceImages<D>, Logits<D>>,
    D: Device<f32>,
{
    model.eval();
    let _no_grad = no_grad();
    // Held-out figures in the precision the model trains in.
    let _amp = amp.map(|a| autocast(a.dtype()));
    let mut loader = DataLoader::new(Arc::clone(data), 500)?;
    let bar = progress_bar(
        loader.len() as u64,
        progress,
        "{prefix} [{bar:30.green/blue}] {pos:>4}/{len} held-out batches [{elapsed_precise}]",
        prefix,
    );
    let (mut loss, mut hits, mut seen) = (0.0f64, 0usize, 0usize);
    for batch in loader.iter() {
        let (x, y): (Images, Labels) = batch?;
        let (x, y) = (to_device(x, device), to_device(y, device));
        let logits = model.forward(x);
        loss += cross_entropy(&logits, &y, Sum).item() as f64;
        hits += correct(&logits, &y);
        seen += y.dims()[0];
        bar.inc(1);
    }
    bar.finish_and_clear();
    model.train();
    let n = seen.max(1) as f64;
    Ok((loss / n, hits as f64 / n))
}

/// The training loop proper, for either model, alone or wrapped in
/// [`DistributedDataParallel`].
fn fit<M, D>(
    mut model: M,
    run: &Run<'_, D>,
    saved: Option<TrainingState>,
    train_set: DigitSet,
    test_set: DigitSet,
) -> Result<Summary, TrainError>
where
    M: Module + Forward<DeviceImages<D>, Logits<D>>,
    D: Device<f32>,
{
    let Run {
        device,
        world,
        args,
        settings,
        epochs,
        files,
    } = *run;
    let (rank, ranks) = (world.rank(), world.world_size());
    // Progress bars from rank 0 only; every rank prints its epoch lines.
    let progress = args.progress && rank == 0;
    let mut opt = Adam::<f32, D>::try_new(AdamOptions::default().lr(settings.lr))?;
    let mut sched = ExponentialLR::try_new(&mut opt, LR_DECAY)?;
    let mut scaler = GradScaler::new().enabled(settings.amp == Some(Amp::F16));
    let loader = DataLoader::new(train_set, settings.batch_size)?.num_workers(args.workers);
    let mut loader = if ranks > 1 {
        // Each rank its own share of every epoch, drawn from the seed.
        let share = DistributedSampler::new(ranks, rank)?.seed(settings.seed);
        say!(
            "distributed: rank {rank} of {ranks} ({}); batch size {} per rank, {} in all",
            world.backend(),
            settings.batch_size,
            settings.batch_size * ranks
        );
        loader.sampler(share)
    } else {
        loader.shuffle(settings.seed)
    };
    let mut metrics: Vec<EpochMetrics> = Vec::new();
    let mut best = f64::NEG_INFINITY;
    let test_set = Arc::new(test_set);

    say!(
        "model: {} ({} parameters)",
        settings.model.name(),
        model.num_parameters()
    );
    if rank == 0 {
        println!("{}", model.repr());
    }
    say!(
        "optimizer: Adam, lr {} decaying x{LR_DECAY} per epoch; batch size {}; {} batches per epoch",
        settings.lr,
        settings.batch_size,
        loader.len()
    );

    if let Some(st) = saved {
        // Optimizer first, then the scheduler, as PyTorch orders it.
        model.load_state_dict(&st.model)?;
        let missing = |what: &str| TrainError::Resume(format!("the saved state has no {what}"));
        opt.load_state_dict(
            &model,
            st.optimizer.as_ref().ok_or_else(|| missing("optimizer"))?,
        )?;
        sched.load_state_dict(st.scheduler.as_ref().ok_or_else(|| missing("scheduler"))?)?;
        if scaler.is_enabled() {
            scaler.load_state_dict(&unprefixed(&st.extra, SCALER_KEY))?;
        }
        loader.set_state(st.loader.ok_or_else(|| missing("loader position"))?)?;
        metrics = report::from_csv(st.extra.get("metrics").map_or("", String::as_str))?;
        best = metrics
            .iter()
            .map(|m| m.test_acc)
            .fold(f64::NEG_INFINITY, f64::max);
        say!(
            "resuming {} at epoch {} (best held-out accuracy so far {:.2}%)",
            args.out.display(),
            loader.state().epoch + 1,
            100.0 * best
        );
    } else {
        say!("output: {}", args.out.display());
    }

    model.train();
    let batches = loader.len() as u64;
    let mut trained = false;
    while (loader.state().epoch as usize) < epochs {
        let epoch = loader.state().epoch as usize + 1;
        let t0 = Instant::now();
        let bar = progress_bar(
            batches,
            progress,
            "{prefix} [{bar:30.cyan/blue}] {pos:>4}/{len} {msg} [{elapsed_precise} < {eta}]",
            format!("epoch {epoch}/{epochs}"),
        );
        bar.set_position(loader.state().batch as u64);

        let (mut loss_sum, mut hits, mut seen) = (0.0f64, 0usize, 0usize);
        for batch in loader.iter() {
            let (x, y): (Images, Labels) = batch?;
            let (x, y) = (to_device(x, device), to_device(y, device));
            opt.zero_grad(&model);
            let (logits, loss) = {
                // Forward and loss under autocast; backward outside, as
                // PyTorch's recipe has it.
                let _amp = settings.amp.map(|a| autocast(a.dtype()));
                let logits = model.forward(x);
                let loss = cross_entropy(&logits, &y, Mean);
                (logits, loss)
            };
            // The scaler is off (a plain backward and step) but for f16.
            scaler.scale(&loss).backward();
            scaler.step(&mut opt, &model)?;
            scaler.update()?;

            let n = y.dims()[0];
            loss_sum += loss.item() as f64 * n as f64;
            hits += correct(&logits.detach(), &y);
            seen += n;
            bar.inc(1);
            bar.set_message(format!(
                "loss {:.4} acc {:5.1}% {:>5.0} samples/s",
                loss_sum / seen as f64,
                100.0 * hits as f64 / seen as f64,
                seen as f64 / t0.elapsed().as_secs_f64()
            ));
        }
        let train_secs = t0.elapsed().as_secs_f64();
        trained = true;
        bar.finish_and_clear();
        sched.try_step(&mut opt)?;

        let (test_loss, test_acc) = evaluate(
            &mut model,
            device,
            &test_set,
            settings.amp,
            progress,
            format!("epoch {epoch}/{epochs} evaluating"),
        )?;
        if ranks > 1 {
            // The epoch's figures over every rank's share.
            let totals =
                Tensor::<(C<3>,), f64>::from_vec(vec![loss_sum, hits as f64, seen as f64], (C,))
                    .map_err(|e| TrainError::Distributed(e.into()))?;
            world.all_reduce(&totals, forma_distributed::ReduceOp::Sum)?;
            let t = totals.to_vec();
            (loss_sum, hits, seen) = (t[0], t[1] as usize, t[2] as usize);
        }
        let seen_f = seen.max(1) as f64;
        let row = EpochMetrics {
            epoch,
            train_loss: loss_sum / seen_f,
            train_acc: hits as f64 / seen_f,
            test_loss,
            test_acc,
            seconds: t0.elapsed().as_secs_f64(),
        };
        metrics.push(row);
        let improved = test_acc > best;
        if improved {
            best = test_acc;
        }
        if improved && rank == 0 {
            model.save_safetensors(&files.best)?;
            if args.export_onnx {
                // The same weights as `best.safetensors`, as an inference
                // graph ONNX Runtime runs at any batch size.
                model.eval();
                let example = DeviceImages::<D>::zeros_on((Dyn(1), C, C, C), device);
                let exported =
                    forma_onnx::export_onnx(&model, example, &files.onnx, &Default::default());
                model.train();
                exported.map_err(TrainError::Export)?;
            }
        }
        let mut extra = BTreeMap::new();
        settings.to_extra(&mut extra);
        extra.insert("metrics".into(), report::to_csv_exact(&metrics));
        for (k, v) in scaler.state_dict() {
            extra.insert(format!("{SCALER_KEY}{k}"), v);
        }
        let state = TrainingState {
            model: model.state_dict(),
            optimizer: Some(opt.try_state_dict()?),
            scheduler: Some(sched.state_dict()),
            loader: Some(loader.state()),
            extra,
        };
        if ranks > 1 {
            // Rank 0 writes; the others wait until the file is there.
            save_on_rank0(world, &files.state, &state)?;
        } else {
            state.save(&files.state)?;
        }
        if rank == 0 {
            report::write_atomic(&files.csv, report::to_csv(&metrics).as_bytes())?;
            report::save_plot(&files.plot, &runs_in(&args.out, (settings.amp, &metrics)))?;
        }

        say!(
            "epoch {epoch}/{epochs}  train loss {:.4} acc {:.2}%  held-out loss {:.4} acc {:.2}%  {:.0} samples/s  {:.1}s{}",
            row.train_loss,
            100.0 * row.train_acc,
            row.test_loss,
            100.0 * row.test_acc,
            seen as f64 / train_secs,
            row.seconds,
            match (improved, rank) {
                (true, 0) => "  (best: saved)",
                (true, _) => "  (best)",
                _ => "",
            }
        );
    }
    if !trained {
        say!(
            "nothing to train: the run has done {} epochs (ask for more with --epochs N)",
            loader.state().epoch
        );
    }
    Ok(Summary {
        metrics,
        best_test_acc: best,
        out: args.out.clone(),
    })
}
