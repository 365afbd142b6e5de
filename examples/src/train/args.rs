//! The training example's command line, parsed by hand (a dozen flags do
//! not need a parser crate).

use super::ModelKind;
use std::path::PathBuf;

/// The usage text `--help` prints.
pub const USAGE: &str = "\
Trains a digit classifier end to end: data, model, optimizer, evaluation,
checkpoints, metrics and a plot.

usage: cargo run --release -p forma-examples --example train -- [OPTIONS]

  --data DIR         MNIST-format IDX files (MNIST, Fashion-MNIST) in DIR, plain
                     or .gz; without it, digits drawn by the built-in renderer
  --download         fetch MNIST into --cache (checked against its published
                     MD5s; skipped when already cached) and train on it
  --mirror URL       where --download fetches from
                     [default: https://ossci-datasets.s3.amazonaws.com/mnist/]
  --cache DIR        where --download keeps the files
                     [default: $XDG_CACHE_HOME or ~/.cache, then forma/mnist]
  --device DEV       cpu, or cuda / cuda:N [default: cpu]
  --out DIR          where checkpoints, metrics.csv and metrics.png go
                     [default: runs/train]
  --resume           continue the run saved in --out from its last finished
                     epoch, exactly as if it had not stopped
  --epochs N         train until epoch N [default: 5]
  --batch-size N     samples per optimizer step [default: 64]
  --lr X             Adam's learning rate [default: 0.002], times 0.7 per epoch
  --seed N           model initialisation and shuffling [default: 0]
  --model KIND       cnn (a LeNet) or linear (logistic regression on the
                     pixels, the baseline) [default: cnn]
  --train-size N     training samples [default: 16000 built-in, all of --data]
  --test-size N      held-out samples [default: 4000 built-in, all of --data]
  --workers N        data-loading threads [default: 0: the training thread]
  --no-progress      no progress bar, only a line per epoch
  --export-onnx      also write the best model as --out/model.onnx (opset 17,
                     any batch size), for ONNX Runtime and other runtimes
  -h, --help         this text
";

/// What the command line asks for. `None` means the flag was not given: a
/// new run takes the default, a resumed run the saved value.
#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    /// `--data DIR`.
    pub data: Option<PathBuf>,
    /// `--download`.
    pub download: bool,
    /// `--mirror URL`.
    pub mirror: String,
    /// `--cache DIR`.
    pub cache: PathBuf,
    /// `--device DEV`.
    pub device: DeviceArg,
    /// `--out DIR`.
    pub out: PathBuf,
    /// `--resume`.
    pub resume: bool,
    /// `--epochs N`.
    pub epochs: Option<usize>,
    /// `--batch-size N`.
    pub batch_size: Option<usize>,
    /// `--lr X`.
    pub lr: Option<f64>,
    /// `--seed N`.
    pub seed: Option<u64>,
    /// `--model KIND`.
    pub model: Option<ModelKind>,
    /// `--train-size N`.
    pub train_size: Option<usize>,
    /// `--test-size N`.
    pub test_size: Option<usize>,
    /// `--workers N`.
    pub workers: usize,
    /// Whether to draw a progress bar (off with `--no-progress`; it is also
    /// hidden when stderr is not a terminal).
    pub progress: bool,
    /// `--export-onnx`.
    pub export_onnx: bool,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            data: None,
            download: false,
            mirror: crate::download::DEFAULT_MIRROR.to_string(),
            cache: crate::download::default_cache_dir(),
            device: DeviceArg::Cpu,
            out: PathBuf::from("runs/train"),
            resume: false,
            epochs: None,
            batch_size: None,
            lr: None,
            seed: None,
            model: None,
            train_size: None,
            test_size: None,
            workers: 0,
            progress: true,
            export_onnx: false,
        }
    }
}

/// What to do.
// Built once per run: boxing `Args` would save nothing that matters and
// cost every caller's `Command::Train(args)` pattern.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Train.
    Train(Args),
    /// Print [`USAGE`].
    Help,
}

/// Parses the arguments after the program name. Flags take their value as
/// the next argument or after `=` (`--epochs 3`, `--epochs=3`).
///
/// # Errors
/// A message naming the flag: unknown flag, missing or unparsable value.
///
/// ```
/// use forma_examples::train::{parse_args, Command, ModelKind};
///
/// let Command::Train(args) = parse_args(["--epochs=2", "--model", "linear"]).unwrap() else {
///     unreachable!()
/// };
/// assert_eq!(args.epochs, Some(2));
/// assert_eq!(args.model, Some(ModelKind::Linear));
/// assert!(parse_args(["--epochs", "two"]).is_err());
/// ```
pub fn parse_args<I, S>(args: I) -> Result<Command, String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut out = Args::default();
    let mut it = args.into_iter().map(Into::into);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value (see --help)"))
        };
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.parse()
                .map_err(|_| format!("{flag}: `{v}` is not a valid number"))
        }
        fn positive(flag: &str, v: String) -> Result<usize, String> {
            match num::<usize>(flag, v)? {
                0 => Err(format!("{flag} must be at least 1")),
                n => Ok(n),
            }
        }
        let takes_value = !matches!(
            flag.as_str(),
            "--resume" | "--download" | "--no-progress" | "--export-onnx" | "-h" | "--help"
        );
        if !takes_value && inline.is_some() {
            return Err(format!("{flag} takes no value"));
        }
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--resume" => out.resume = true,
            "--download" => out.download = true,
            "--mirror" => out.mirror = value(&flag)?,
            "--cache" => out.cache = PathBuf::from(value(&flag)?),
            "--device" => {
                let v = value(&flag)?;
                out.device = DeviceArg::parse(&v).ok_or_else(|| {
                    format!("--device: `{v}` is not a device (cpu, cuda or cuda:N)")
                })?;
            }
            "--no-progress" => out.progress = false,
            "--export-onnx" => out.export_onnx = true,
            "--data" => out.data = Some(PathBuf::from(value(&flag)?)),
            "--out" => out.out = PathBuf::from(value(&flag)?),
            "--epochs" => out.epochs = Some(positive(&flag, value(&flag)?)?),
            "--batch-size" => out.batch_size = Some(positive(&flag, value(&flag)?)?),
            "--train-size" => out.train_size = Some(positive(&flag, value(&flag)?)?),
            "--test-size" => out.test_size = Some(positive(&flag, value(&flag)?)?),
            "--workers" => out.workers = num(&flag, value(&flag)?)?,
            "--seed" => out.seed = Some(num(&flag, value(&flag)?)?),
            "--lr" => {
                let lr: f64 = num(&flag, value(&flag)?)?;
                if !(lr > 0.0 && lr.is_finite()) {
                    return Err(format!("--lr must be positive, not {lr}"));
                }
                out.lr = Some(lr);
            }
            "--model" => {
                let v = value(&flag)?;
                out.model = Some(
                    ModelKind::parse(&v)
                        .ok_or_else(|| format!("--model: `{v}` is not a model (cnn or linear)"))?,
                );
            }
            _ => return Err(format!("unknown argument `{arg}` (see --help)")),
        }
    }
    if out.download && out.data.is_some() {
        return Err(
            "--download and --data both choose the data: give one (--cache DIR sets \
                    where --download puts the files)"
                .into(),
        );
    }
    Ok(Command::Train(out))
}

/// The device `--device` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceArg {
    /// `cpu`.
    Cpu,
    /// `cuda` (ordinal 0) or `cuda:N`.
    Cuda(usize),
}

impl DeviceArg {
    /// Parses `cpu`, `cuda` or `cuda:N`, as `torch.device` spells them.
    ///
    /// ```
    /// use forma_examples::train::DeviceArg;
    ///
    /// assert_eq!(DeviceArg::parse("cuda:1"), Some(DeviceArg::Cuda(1)));
    /// assert_eq!(DeviceArg::parse("cuda"), Some(DeviceArg::Cuda(0)));
    /// assert_eq!(DeviceArg::parse("tpu"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "cpu" => Some(DeviceArg::Cpu),
            "cuda" => Some(DeviceArg::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceArg::Cuda),
        }
    }
}

impl std::fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceArg::Cpu => f.write_str("cpu"),
            DeviceArg::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}
