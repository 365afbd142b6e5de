//! Why the service could not start or stopped with an error.

use forma::nn::state::CheckpointError;

/// Why [`serve`](crate::serve) failed.
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
}
