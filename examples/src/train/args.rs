//! The training example's command line: [`Args`] is the parser (clap's
//! derive), so each flag's name, default, check and `--help` line sit on
//! its field.

use super::{Amp, ModelKind};
use clap::error::ErrorKind;
use clap::{ArgAction, CommandFactory, Parser};
use std::path::PathBuf;

/// The text `--help` prints: clap's help for [`Args`], rendered when
/// printed (`print!("{USAGE}")`).
pub const USAGE: Usage = Usage;

/// [`USAGE`]'s type: its `Display` renders [`Args`]' help.
#[derive(Clone, Copy, Debug)]
pub struct Usage;

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", Args::command().render_help())
    }
}

/// What the command line asks for. `None` means the flag was not given: a
/// new run takes the default (the `[default: ...]` in a field's help), a
/// resumed run the saved value.
///
/// Each field's doc comment is its `--help` line.
#[derive(Clone, Debug, PartialEq, Parser)]
#[command(
    name = "train",
    about = "Trains a digit classifier end to end: data, model, optimizer, evaluation,\n\
             checkpoints, metrics and a plot.",
    // Not this struct's doc comment, which is for rustdoc.
    long_about = None,
    override_usage = "cargo run --release -p forma-examples --example train -- [OPTIONS]"
)]
pub struct Args {
    /// MNIST-format IDX files (MNIST, Fashion-MNIST) in DIR, plain or .gz;
    /// without it, digits drawn by the built-in renderer
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Fetch MNIST into --cache (checked against its published MD5s; skipped
    /// when already cached) and train on it
    #[arg(long, conflicts_with = "data")]
    pub download: bool,
    /// Where --download fetches from
    #[arg(long, value_name = "URL", default_value = crate::download::DEFAULT_MIRROR)]
    pub mirror: String,
    /// Where --download keeps the files (under $XDG_CACHE_HOME or ~/.cache)
    #[arg(long, value_name = "DIR", default_value_os_t = crate::download::default_cache_dir())]
    pub cache: PathBuf,
    /// cpu, or cuda / cuda:N
    #[arg(long, value_name = "DEV", default_value = "cpu", value_parser = device)]
    pub device: DeviceArg,
    /// Where checkpoints, metrics.csv and metrics.png go
    #[arg(long, value_name = "DIR", default_value = "runs/train")]
    pub out: PathBuf,
    /// Continue the run saved in --out from its last finished epoch, exactly
    /// as if it had not stopped
    #[arg(long)]
    pub resume: bool,
    /// Train until epoch N [default: 5]
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub epochs: Option<usize>,
    /// Samples per optimizer step [default: 64]
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub batch_size: Option<usize>,
    /// Adam's learning rate, times 0.7 per epoch [default: 0.002]
    #[arg(long, value_name = "X", value_parser = positive_lr, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// Model initialisation and shuffling [default: 0]
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// cnn (a LeNet) or linear (logistic regression on the pixels, the
    /// baseline) [default: cnn]
    #[arg(long, value_name = "KIND", value_enum)]
    pub model: Option<ModelKind>,
    /// Training samples [default: 16000 built-in, all of --data]
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub train_size: Option<usize>,
    /// Held-out samples [default: 4000 built-in, all of --data]
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub test_size: Option<usize>,
    /// Data-loading threads; 0 loads on the training thread
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub workers: usize,
    /// Whether to draw progress bars: false with `--no-progress`; they are
    /// also hidden when stderr is not a terminal.
    #[arg(
        long = "no-progress",
        action = ArgAction::SetFalse,
        help = "No progress bars, only a line per epoch"
    )]
    pub progress: bool,
    /// Train data-parallel across the processes of an MPI job: run as
    /// `mpirun -np N .../train --distributed` from a build with `--features
    /// distributed`; --batch-size is per process
    #[arg(long)]
    pub distributed: bool,
    /// Also write the best model as --out/model.onnx (opset 17, any batch
    /// size), for ONNX Runtime and other runtimes
    #[arg(long)]
    pub export_onnx: bool,
    /// Mixed precision: bf16 (autocast) or f16 (autocast and a gradient
    /// scaler). Its files sit beside an f32 run's in --out, suffixed
    /// `-amp-bf16` / `-amp-f16`, and metrics.png shows both runs' curves
    #[arg(long, value_name = "DTYPE", value_enum)]
    pub amp: Option<Amp>,
}

impl Default for Args {
    /// What an empty command line gives (a test checks they agree).
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
            distributed: false,
            amp: None,
        }
    }
}

// By hand rather than derived, so the names are `ModelKind::name`'s and the
// variants' doc comments do not become a second, longer `--help`.
impl clap::ValueEnum for ModelKind {
    fn value_variants<'a>() -> &'a [Self] {
        &[ModelKind::Cnn, ModelKind::Linear]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

impl clap::ValueEnum for Amp {
    fn value_variants<'a>() -> &'a [Self] {
        &[Amp::Bf16, Amp::F16]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

/// `--epochs` and the other counts: a whole number, at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a whole number ({e})")),
    }
}

/// `--lr`: a positive, finite number.
fn positive_lr(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(lr) if lr > 0.0 && lr.is_finite() => Ok(lr),
        Ok(lr) => Err(format!("must be positive, not {lr}")),
        Err(e) => Err(format!("not a number ({e})")),
    }
}

/// `--device`.
fn device(s: &str) -> Result<DeviceArg, String> {
    DeviceArg::parse(s).ok_or_else(|| "not a device (cpu, cuda or cuda:N)".into())
}

/// What to do.
// Built once per run: boxing `Args` would save nothing that matters and
// cost every caller's `Command::Train(args)` pattern.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Train.
    Train(Args),
    /// Print [`USAGE`] (`-h`, `--help`).
    Help,
}

/// Parses the arguments after the program name with [`Args`]' clap parser.
/// Flags take their value as the next argument or after `=` (`--epochs 3`,
/// `--epochs=3`).
///
/// # Errors
/// clap's message, without its leading `error: ` (the caller prints one):
/// an unknown flag (with a "tip: a similar argument exists" when one is
/// close), a missing or invalid value, `--download` with `--data`.
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
/// assert!(parse_args(["--epoch", "2"]).unwrap_err().contains("'--epochs'"));
/// ```
pub fn parse_args<I, S>(args: I) -> Result<Command, String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let argv = std::iter::once("train".to_string()).chain(args.into_iter().map(Into::into));
    match Args::try_parse_from(argv) {
        Ok(args) => Ok(Command::Train(args)),
        Err(e) if e.kind() == ErrorKind::DisplayHelp => Ok(Command::Help),
        Err(e) => {
            let message = e.to_string();
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            Err(message.trim_end().to_string())
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::{
        DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS, DEFAULT_LR, DEFAULT_TEST_SIZE, DEFAULT_TRAIN_SIZE,
        LR_DECAY,
    };

    #[test]
    fn the_command_is_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn a_misspelled_flag_gets_a_suggestion() {
        let err = Args::try_parse_from(["train", "--epoch", "3"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnknownArgument);
        let text = err.to_string();
        assert!(
            text.contains("a similar argument exists: '--epochs'"),
            "{text}"
        );
        // `parse_args` passes it on, minus the `error: ` the caller prints.
        let text = parse_args(["--batchsize", "8"]).unwrap_err();
        assert!(
            text.starts_with("unexpected argument '--batchsize'"),
            "{text}"
        );
        assert!(text.contains("'--batch-size'"), "{text}");
    }

    #[test]
    fn help_lists_every_flag_with_the_defaults_the_run_uses() {
        let help = USAGE.to_string();
        for arg in Args::command().get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            assert!(
                help.contains(&format!("--{long}")),
                "--{long} missing:\n{help}"
            );
            assert!(arg.get_help().is_some(), "--{long} has no help");
        }
        // One help: `-h` does not point to a longer `--help`.
        assert!(!help.contains("see more"), "{help}");
        // Unwrapped, so that no line break falls inside a searched text.
        let help = Args::command().term_width(0).render_help().to_string();
        for default in [
            format!("Train until epoch N [default: {DEFAULT_EPOCHS}]"),
            format!("[default: {DEFAULT_BATCH_SIZE}]"),
            format!("times {LR_DECAY} per epoch [default: {DEFAULT_LR}]"),
            format!("[default: {DEFAULT_TRAIN_SIZE} built-in"),
            format!("[default: {DEFAULT_TEST_SIZE} built-in"),
            "[default: cnn]".to_string(),
            "[default: runs/train]".to_string(),
            format!("[default: {}]", crate::download::DEFAULT_MIRROR),
        ] {
            assert!(help.contains(&default), "no `{default}` in\n{help}");
        }
        assert!(help.contains("[possible values: cnn, linear]"), "{help}");
    }
}
