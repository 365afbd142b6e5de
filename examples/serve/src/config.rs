//! The service's settings and its command line.

use crate::error::ServeError;
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

/// The command line's usage text.
pub const USAGE: &str = "\
usage: forma-serve --checkpoint PATH [options]

  --checkpoint PATH   safetensors weights of the training example's Cnn
                      (runs/train/best.safetensors)
  --addr HOST:PORT    where to listen (default 127.0.0.1:8080)
  --max-batch N       most images per forward pass (default 32)
  --max-wait-ms N     how long a batch waits for more requests (default 2)
  --queue N           requests that may wait before 503 (default 1024)
  --body-limit BYTES  largest request body (default 2097152)
  --header-timeout-ms N  time to send a request's headers, and the idle
                      timeout of a kept-alive connection (default 10000)
  --body-timeout-ms N time for a request's body once its headers are in;
                      408 past it (default 30000)
  --max-connections N connections served at once (default 512)
  --shutdown-grace-ms N  on ctrl-c/SIGTERM, time open requests get to
                      finish before their connections close (default 10000)
  --mean M --std S    input normalisation (default: the built-in training
                      data's, as `train` used it; give the values `train`
                      printed when it trained on other data)
  --help              this text
";

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
    /// Print [`USAGE`].
    Help,
}

/// Reads the command line (without the program name).
///
/// # Errors
/// A message for the user: an unknown flag, a missing or malformed value.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut args = args.into_iter();
    let mut checkpoint = None;
    let mut addr: SocketAddr = ([127, 0, 0, 1], 8080).into();
    let mut cfg = Config::new("");
    let (mut mean, mut std) = (None, None);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Ok(Command::Help);
        }
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.parse()
                .map_err(|_| format!("{flag}: `{v}` is not a valid number"))
        }
        match flag.as_str() {
            "--checkpoint" => checkpoint = Some(PathBuf::from(value()?)),
            "--addr" => {
                let v = value()?;
                addr = v
                    .parse()
                    .map_err(|_| format!("--addr: `{v}` is not HOST:PORT"))?;
            }
            "--max-batch" => cfg.max_batch = num(&flag, value()?)?,
            "--max-wait-ms" => cfg.max_wait = Duration::from_millis(num(&flag, value()?)?),
            "--queue" => cfg.queue_capacity = num(&flag, value()?)?,
            "--body-limit" => cfg.body_limit = num(&flag, value()?)?,
            "--header-timeout-ms" => {
                cfg.header_timeout = Duration::from_millis(num(&flag, value()?)?)
            }
            "--body-timeout-ms" => cfg.body_timeout = Duration::from_millis(num(&flag, value()?)?),
            "--max-connections" => cfg.max_connections = num(&flag, value()?)?,
            "--shutdown-grace-ms" => {
                cfg.shutdown_grace = Duration::from_millis(num(&flag, value()?)?)
            }
            "--mean" => mean = Some(num::<f32>(&flag, value()?)?),
            "--std" => std = Some(num::<f32>(&flag, value()?)?),
            other => return Err(format!("unknown argument `{other}` (see --help)")),
        }
    }
    cfg.checkpoint = checkpoint.ok_or("--checkpoint PATH is required (see --help)")?;
    let normalization = match (mean, std) {
        (None, None) => None,
        (Some(mean), Some(std)) => Some(Normalization { mean, std }),
        _ => return Err("give both --mean and --std, or neither".into()),
    };
    if let Some(n) = normalization {
        cfg.normalization = n;
    }
    cfg.validate().map_err(|e| e.to_string())?;
    Ok(Command::Serve {
        config: cfg,
        addr,
        normalization,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, String> {
        parse_args(args.iter().map(|s| s.to_string()))
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
            "--mean",
            "0.1",
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
        let n = Normalization {
            mean: 0.1,
            std: 0.3,
        };
        assert_eq!((config.normalization, normalization), (n, Some(n)));
    }

    #[test]
    fn defaults_and_errors() {
        let Ok(Command::Serve {
            config,
            addr,
            normalization,
        }) = parse(&["--checkpoint", "m"])
        else {
            panic!("defaults refused");
        };
        assert_eq!(addr.port(), 8080);
        assert_eq!(config.max_batch, DEFAULT_MAX_BATCH);
        assert_eq!(normalization, None);
        assert_eq!(parse(&["--help"]), Ok(Command::Help));
        for (args, msg) in [
            (&["--max-batch", "2"][..], "--checkpoint PATH is required"),
            (&["--checkpoint"][..], "--checkpoint needs a value"),
            (
                &["--checkpoint", "m", "--max-batch", "x"][..],
                "not a valid number",
            ),
            (&["--checkpoint", "m", "--max-batch", "0"][..], "at least 1"),
            (
                &["--checkpoint", "m", "--mean", "0.1"][..],
                "both --mean and --std",
            ),
            (
                &["--checkpoint", "m", "--mean", "0", "--std", "0"][..],
                "positive std",
            ),
            (
                &["--checkpoint", "m", "--addr", "here"][..],
                "not HOST:PORT",
            ),
            (
                &["--checkpoint", "m", "--port", "1"][..],
                "unknown argument `--port`",
            ),
        ] {
            let err = parse(args).unwrap_err();
            assert!(err.contains(msg), "{args:?}: {err}");
        }
    }
}
