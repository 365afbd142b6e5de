//! Why the service could not start, stopped with an error, or could not
//! write a sample request.

use forma::nn::data::DataError;
use forma::nn::state::CheckpointError;
use std::path::PathBuf;

/// Why [`serve`](crate::serve) or `--dump-sample` ([`crate::sample`])
/// failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The checkpoint is missing, unreadable, or does not fit the model. The
    /// service never starts on a half-loaded model.
    #[error("cannot load the model: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// A setting is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Accepting connections failed.
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
    /// A background task (loading the weights, the batcher) panicked. A
    /// panic in the model's forward pass is caught per batch and is not this.
    #[error("a background task failed: {0}")]
    Task(String),
    /// `--dump-sample` found no MNIST test files in the data directory.
    #[error(
        "no MNIST test set in {}: {source}\n\
         fetch it with: {fetch}\n\
         (it downloads MNIST, checks its published MD5s, then trains on it; or give \
         --data DIR holding t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, plain or .gz)",
        dir.display()
    )]
    NoMnist {
        /// Where the files were looked for.
        dir: PathBuf,
        /// The file that is missing (boxed: `DataError` is large, and
        /// every `Result` of the crate would carry its size).
        source: Box<DataError>,
        /// The command that fetches them there.
        fetch: String,
    },
    /// The MNIST test files are there but cannot be read.
    #[error("cannot read the MNIST test set in {}: {source}", dir.display())]
    Mnist {
        /// The data directory.
        dir: PathBuf,
        /// What is wrong with the files.
        source: Box<DataError>,
    },
    /// `--index` is past the test set's last image.
    #[error("--index {index}: the MNIST test set has {len} images (0..{len})")]
    SampleIndex {
        /// The index asked for.
        index: usize,
        /// How many images there are.
        len: usize,
    },
    /// The sample could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}
