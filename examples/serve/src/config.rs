//! The service's settings and its command line (clap, derived).

use crate::error::ServeError;
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How raw pixels in `0..=1` become model inputs: `(pixel - mean) / std`,
/// the normalisation the training example applied (it prints the values it
/// used: `normalised with mean M std S`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Normalization {
    /// Subtracted from every pixel.
    pub mean: f32,
    /// Then divided into it.
    pub std: f32,
}

impl Normalization {
    /// No change: pixels go to the model as they are.
    pub const IDENTITY: Normalization = Normalization {
        mean: 0.0,
        std: 1.0,
    };

    /// What the training example normalises its default data with: the
    /// statistics of the built-in training set (rendered here, about a
    /// second in a release build).
    pub fn builtin_training_data() -> Self {
        use forma_examples::digits::DigitSet;
        use forma_examples::train::{DATA_SEED, DEFAULT_TRAIN_SIZE};
        let (mean, std) = DigitSet::generate(DEFAULT_TRAIN_SIZE, DATA_SEED).pixel_stats();
        Normalization { mean, std }
    }
}

/// Everything [`serve`](crate::serve) needs besides the listener.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The safetensors checkpoint of a [`Cnn`](forma_examples::train::Cnn).
    pub checkpoint: PathBuf,
    /// The most images one forward pass takes; also the most one request may
    /// send in its `batch`.
    pub max_batch: usize,
    /// How long the batcher waits, after the first request of a batch, for
    /// more to join it.
    pub max_wait: Duration,
    /// Requests that may wait for the batcher; past this the service answers
    /// 503 rather than queueing without bound.
    pub queue_capacity: usize,
    /// The largest request body accepted, in bytes (413 past it).
    pub body_limit: usize,
    /// Applied to every pixel before the model sees it.
    pub normalization: Normalization,
    /// How long a connection may take to send a request's headers, counted
    /// from when the server is ready to read them: from the connection's
    /// start, and after each answer on a kept-alive connection (so this is
    /// also the idle timeout). The connection is closed past it.
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive once its headers have
    /// (408 `body_timeout` past it).
    pub body_timeout: Duration,
    /// Connections served at once; further clients wait in the listener's
    /// backlog until one closes.
    pub max_connections: usize,
    /// On shutdown, how long open connections get to finish their request
    /// before they are closed.
    pub shutdown_grace: Duration,
}

/// The default [`Config::max_batch`].
pub const DEFAULT_MAX_BATCH: usize = 32;
/// The default [`Config::max_wait`], in milliseconds.
pub const DEFAULT_MAX_WAIT_MS: u64 = 2;
/// The default [`Config::queue_capacity`].
pub const DEFAULT_QUEUE_CAPACITY: usize = 1024;
/// The default [`Config::body_limit`]: room for a full batch of 784 pixels
/// written with many digits each.
pub const DEFAULT_BODY_LIMIT: usize = 2 * 1024 * 1024;
/// The default [`Config::header_timeout`], in milliseconds.
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;
/// The default [`Config::body_timeout`], in milliseconds.
pub const DEFAULT_BODY_TIMEOUT_MS: u64 = 30_000;
/// The default [`Config::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// The default [`Config::shutdown_grace`], in milliseconds.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;

impl Config {
    /// The defaults, serving `checkpoint` with no normalisation.
    pub fn new(checkpoint: impl Into<PathBuf>) -> Self {
        Config {
            checkpoint: checkpoint.into(),
            max_batch: DEFAULT_MAX_BATCH,
            max_wait: Duration::from_millis(DEFAULT_MAX_WAIT_MS),
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            body_limit: DEFAULT_BODY_LIMIT,
            normalization: Normalization::IDENTITY,
            header_timeout: Duration::from_millis(DEFAULT_HEADER_TIMEOUT_MS),
            body_timeout: Duration::from_millis(DEFAULT_BODY_TIMEOUT_MS),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_grace: Duration::from_millis(DEFAULT_SHUTDOWN_GRACE_MS),
        }
    }

    /// Checks every setting.
    ///
    /// # Errors
    /// [`ServeError::Config`] naming the first bad one.
    pub fn validate(&self) -> Result<(), ServeError> {
        let bad = |m: String| Err(ServeError::Config(m));
        if self.max_batch == 0 {
            return bad("max batch must be at least 1".into());
        }
        if self.queue_capacity == 0 {
            return bad("queue capacity must be at least 1".into());
        }
        if self.body_limit == 0 {
            return bad("body limit must be at least 1 byte".into());
        }
        if self.header_timeout.is_zero() || self.body_timeout.is_zero() {
            return bad("the header and body timeouts must be at least 1 ms".into());
        }
        if self.max_connections == 0 {
            return bad("max connections must be at least 1".into());
        }
        let n = self.normalization;
        if !n.mean.is_finite() || !n.std.is_finite() || n.std <= 0.0 {
            return bad(format!(
                "normalisation needs a finite mean and a positive std, got mean {} std {}",
                n.mean, n.std
            ));
        }
        Ok(())
    }
}

/// The command line, as clap reads it; [`parse_args`] turns it into a
/// [`Command`].
#[derive(Debug, Parser)]
#[command(
    name = "forma-serve",
    version,
    about = "Serves the training example's LeNet over HTTP: POST /predict, GET /health, \
             GET /metrics (Prometheus text), GET /metrics.json",
    after_help = "Request logs go to stderr, one line per request; RUST_LOG sets the level \
                  (default info; RUST_LOG=warn for 5xx answers only, RUST_LOG=debug for more)."
)]
pub struct Args {
    /// Safetensors weights of the training example's Cnn (runs/train/best.safetensors)
    #[arg(long, value_name = "PATH", required_unless_present = "dump_sample")]
    pub checkpoint: Option<PathBuf>,
    /// Where to listen
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Most images per forward pass, and per request
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_BATCH)]
    pub max_batch: usize,
    /// How long a batch waits for more requests
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_WAIT_MS)]
    pub max_wait_ms: u64,
    /// Requests that may wait before 503
    #[arg(long = "queue", value_name = "N", default_value_t = DEFAULT_QUEUE_CAPACITY)]
    pub queue_capacity: usize,
    /// Largest request body; 413 past it
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_BODY_LIMIT)]
    pub body_limit: usize,
    /// Time to send a request's headers, also the idle timeout of a kept-alive connection
    #[arg(long, value_name = "N", default_value_t = DEFAULT_HEADER_TIMEOUT_MS)]
    pub header_timeout_ms: u64,
    /// Time for a request's body once its headers are in; 408 past it
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BODY_TIMEOUT_MS)]
    pub body_timeout_ms: u64,
    /// Connections served at once
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// On ctrl-c/SIGTERM, time open requests get to finish before their connections close
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SHUTDOWN_GRACE_MS)]
    pub shutdown_grace_ms: u64,
    /// Input normalisation mean, with --std [default: the built-in training data's, as `train`
    /// used it; give the values `train` printed when it trained on other data]
    #[arg(
        long,
        value_name = "M",
        requires = "std",
        allow_negative_numbers = true
    )]
    pub mean: Option<f32>,
    /// Input normalisation std, with --mean
    #[arg(
        long,
        value_name = "S",
        requires = "mean",
        allow_negative_numbers = true
    )]
    pub std: Option<f32>,
    /// Write a ready-to-send `POST /predict` body holding a real MNIST test digit to PATH, print
    /// its label to stderr, and exit (nothing is served)
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with = "checkpoint",
        help_heading = "Sending a real image"
    )]
    pub dump_sample: Option<PathBuf>,
    /// With --dump-sample: the MNIST files (where `train -- --download` puts them by default)
    #[arg(
        long,
        value_name = "DIR",
        requires = "dump_sample",
        conflicts_with = "checkpoint",
        default_value_os_t = forma_examples::download::default_cache_dir(),
        help_heading = "Sending a real image"
    )]
    pub data: PathBuf,
    /// With --dump-sample: which test image (0..10000)
    #[arg(
        long,
        value_name = "N",
        requires = "dump_sample",
        conflicts_with = "checkpoint",
        default_value_t = 0,
        help_heading = "Sending a real image"
    )]
    pub index: usize,
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Serve with these settings. `normalization` is `None` when neither
    /// `--mean` nor `--std` was given: use the built-in training data's.
    Serve {
        /// The settings ([`Config::normalization`] is set later when absent).
        config: Config,
        /// Where to listen.
        addr: SocketAddr,
        /// `--mean` and `--std`, if given.
        normalization: Option<Normalization>,
    },
    /// Write a request body holding MNIST test image `index` from `data`
    /// to `path` ([`crate::sample`]).
    DumpSample {
        /// Where the body goes.
        path: PathBuf,
        /// The directory holding MNIST's test files.
        data: PathBuf,
        /// Which test image.
        index: usize,
    },
}

impl Args {
    /// The [`Command`] these arguments ask for, its settings validated.
    ///
    /// # Errors
    /// [`ServeError::Config`] naming the first bad setting.
    pub fn into_command(self) -> Result<Command, ServeError> {
        if let Some(path) = self.dump_sample {
            return Ok(Command::DumpSample {
                path,
                data: self.data,
                index: self.index,
            });
        }
        let mut config = Config::new(self.checkpoint.unwrap_or_default());
        config.max_batch = self.max_batch;
        config.max_wait = Duration::from_millis(self.max_wait_ms);
        config.queue_capacity = self.queue_capacity;
        config.body_limit = self.body_limit;
        config.header_timeout = Duration::from_millis(self.header_timeout_ms);
        config.body_timeout = Duration::from_millis(self.body_timeout_ms);
        config.max_connections = self.max_connections;
        config.shutdown_grace = Duration::from_millis(self.shutdown_grace_ms);
        // clap's `requires` makes these come together.
        let normalization = self
            .mean
            .zip(self.std)
            .map(|(mean, std)| Normalization { mean, std });
        if let Some(n) = normalization {
            config.normalization = n;
        }
        config.validate()?;
        Ok(Command::Serve {
            config,
            addr: self.addr,
            normalization,
        })
    }
}

/// Reads a command line, program name first (as `std::env::args_os()`
/// gives it).
///
/// # Errors
/// clap's error for the user: an unknown flag (with a "did you mean" tip
/// when one is close), a missing or malformed value, or a setting that
/// [`Config::validate`] refuses. `--help` and `--version` also come back as
/// errors, of kind [`DisplayHelp`](clap::error::ErrorKind::DisplayHelp) and
/// [`DisplayVersion`](clap::error::ErrorKind::DisplayVersion);
/// [`clap::Error::exit`] prints each where it belongs and exits with its
/// status.
pub fn parse_args<I, T>(args: I) -> Result<Command, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    Args::try_parse_from(args)?
        .into_command()
        .map_err(|e| Args::command().error(ErrorKind::ValueValidation, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        parse_args(std::iter::once("forma-serve").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_is_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn reads_every_flag() {
        let cmd = parse(&[
            "--checkpoint",
            "m.safetensors",
            "--addr",
            "0.0.0.0:9000",
            "--max-batch",
            "8",
            "--max-wait-ms",
            "5",
            "--queue",
            "10",
            "--body-limit",
            "4096",
            "--header-timeout-ms",
            "700",
            "--body-timeout-ms=800",
            "--max-connections",
            "3",
            "--shutdown-grace-ms",
            "900",
            "--mean",
            "-0.1",
            "--std",
            "0.3",
        ])
        .unwrap();
        let Command::Serve {
            config,
            addr,
            normalization,
        } = cmd
        else {
            panic!("not a serve command: {cmd:?}");
        };
        assert_eq!(addr, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(config.checkpoint, PathBuf::from("m.safetensors"));
        assert_eq!(config.max_batch, 8);
        assert_eq!(config.max_wait, Duration::from_millis(5));
        assert_eq!(config.queue_capacity, 10);
        assert_eq!(config.body_limit, 4096);
        assert_eq!(config.header_timeout, Duration::from_millis(700));
        assert_eq!(config.body_timeout, Duration::from_millis(800));
        assert_eq!(config.max_connections, 3);
        assert_eq!(config.shutdown_grace, Duration::from_millis(900));
        let n = Normalization {
            mean: -0.1,
            std: 0.3,
        };
        assert_eq!((config.normalization, normalization), (n, Some(n)));
    }

    #[test]
    fn defaults() {
        let Ok(Command::Serve {
            config,
            addr,
            normalization,
        }) = parse(&["--checkpoint", "m"])
        else {
            panic!("defaults refused");
        };
        assert_eq!(addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(normalization, None);
        let mut expected = Config::new("m");
        expected.normalization = config.normalization;
        assert_eq!(config, expected);
        assert_eq!(config.normalization, Normalization::IDENTITY);
    }

    #[test]
    fn errors() {
        use clap::error::ErrorKind as K;
        for (args, kind, msg) in [
            (
                &["--max-batch", "2"][..],
                K::MissingRequiredArgument,
                "--checkpoint <PATH>",
            ),
            (
                &["--checkpoint"][..],
                K::InvalidValue,
                "a value is required for '--checkpoint <PATH>'",
            ),
            (
                &["--checkpoint", "m", "--max-batch", "x"][..],
                K::ValueValidation,
                "invalid value 'x' for '--max-batch <N>'",
            ),
            (
                &["--checkpoint", "m", "--max-batch", "0"][..],
                K::ValueValidation,
                "max batch must be at least 1",
            ),
            (
                &["--checkpoint", "m", "--queue", "0"][..],
                K::ValueValidation,
                "queue capacity must be at least 1",
            ),
            (
                &["--checkpoint", "m", "--body-limit", "0"][..],
                K::ValueValidation,
                "body limit must be at least 1 byte",
            ),
            (
                &["--checkpoint", "m", "--body-timeout-ms", "0"][..],
                K::ValueValidation,
                "timeouts must be at least 1 ms",
            ),
            (
                &["--checkpoint", "m", "--max-connections", "0"][..],
                K::ValueValidation,
                "max connections must be at least 1",
            ),
            (
                &["--checkpoint", "m", "--mean", "0.1"][..],
                K::MissingRequiredArgument,
                "--std <S>",
            ),
            (
                &["--checkpoint", "m", "--std", "0.1"][..],
                K::MissingRequiredArgument,
                "--mean <M>",
            ),
            (
                &["--checkpoint", "m", "--mean", "0", "--std", "0"][..],
                K::ValueValidation,
                "positive std",
            ),
            (
                &["--checkpoint", "m", "--addr", "here"][..],
                K::ValueValidation,
                "invalid value 'here' for '--addr <HOST:PORT>'",
            ),
            (
                &["--checkpoint", "m", "--port", "1"][..],
                K::UnknownArgument,
                "unexpected argument '--port'",
            ),
            (
                &["--index", "3"][..],
                K::MissingRequiredArgument,
                "--dump-sample <PATH>",
            ),
            (
                &["--checkpoint", "m", "--index", "3"][..],
                K::ArgumentConflict,
                "'--index <N>'",
            ),
            (
                &["--checkpoint", "m", "--dump-sample", "s.json"][..],
                K::ArgumentConflict,
                "cannot be used with",
            ),
        ] {
            let err = parse(args).unwrap_err();
            let text = err.to_string();
            assert_eq!(err.kind(), kind, "{args:?}: {text}");
            assert!(text.contains(msg), "{args:?}: {text}");
        }
    }

    #[test]
    fn a_misspelled_flag_gets_a_suggestion() {
        for (typo, meant) in [
            ("--max-bacth", "--max-batch"),
            ("--chekpoint", "--checkpoint"),
            ("--dump-smaple", "--dump-sample"),
        ] {
            let err =
                Args::try_parse_from(["forma-serve", "--checkpoint", "m", typo, "1"]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument);
            let text = err.to_string();
            assert!(
                text.contains(&format!("a similar argument exists: '{meant}'")),
                "{typo}: {text}"
            );
        }
    }

    #[test]
    fn help_and_version_are_clap_s() {
        use clap::error::ErrorKind as K;
        assert_eq!(parse(&["--help"]).unwrap_err().kind(), K::DisplayHelp);
        assert_eq!(parse(&["-h"]).unwrap_err().kind(), K::DisplayHelp);
        assert_eq!(parse(&["--version"]).unwrap_err().kind(), K::DisplayVersion);
        let help = Args::command().render_help().to_string();
        for flag in [
            "--checkpoint",
            "--addr",
            "--max-batch",
            "--max-wait-ms",
            "--queue",
            "--body-limit",
            "--header-timeout-ms",
            "--body-timeout-ms",
            "--max-connections",
            "--shutdown-grace-ms",
            "--mean",
            "--std",
            "--dump-sample",
            "--data",
            "--index",
            "[default: 32]",
            "RUST_LOG",
        ] {
            assert!(help.contains(flag), "help lacks {flag}:\n{help}");
        }
    }

    #[test]
    fn dump_sample_needs_no_checkpoint() {
        assert_eq!(
            parse(&["--dump-sample", "s.json", "--data", "d", "--index", "7"]).unwrap(),
            Command::DumpSample {
                path: "s.json".into(),
                data: "d".into(),
                index: 7,
            }
        );
        let Command::DumpSample { data, index, .. } = parse(&["--dump-sample", "s.json"]).unwrap()
        else {
            panic!("not a dump");
        };
        assert_eq!(data, forma_examples::download::default_cache_dir());
        assert_eq!(index, 0);
    }
}
