//! [`DistError`]: what a collective, a process group or data-parallel
//! training reports instead of hanging or aborting.

use std::time::Duration;

/// A failed collective or data-parallel step. Every variant names the
/// collective (or step) and the ranks involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// The communication library returned an error code.
    #[error("{collective} on rank {rank} of {world}: {backend} error {code}: {message}")]
    Backend {
        /// The collective.
        collective: &'static str,
        /// This process's rank.
        rank: usize,
        /// The group's size.
        world: usize,
        /// `mpi` or `nccl`.
        backend: &'static str,
        /// The library's error code.
        code: i32,
        /// The library's message for it.
        message: String,
    },
    /// A collective did not complete in time: another rank never joined it
    /// (it exited, crashed, hangs, or called another collective).
    #[error(
        "{collective} on rank {rank} of {world} did not complete within {:.1} s: another rank never joined it (it exited early, crashed, or is in another collective); this group can no longer be used",
        waited.as_secs_f64()
    )]
    Timeout {
        /// The collective.
        collective: &'static str,
        /// This process's rank.
        rank: usize,
        /// The group's size.
        world: usize,
        /// How long it waited.
        waited: Duration,
    },
    /// The ranks called a collective with different sizes (or dtypes, or a
    /// different collective altogether).
    #[error("{collective}: the ranks disagree: {}", fmt_per_rank(per_rank))]
    Mismatch {
        /// The collective.
        collective: &'static str,
        /// What each rank passed, indexed by rank.
        per_rank: Vec<String>,
    },
    /// Some ranks ran out of input while others still had batches.
    #[error("uneven inputs at step {step}: rank(s) {ran_out:?} ran out of batches while rank(s) {still:?} had more; give every rank the same number of batches (DistributedSampler does)")]
    UnevenInputs {
        /// The step (counting from 0) at which they diverged.
        step: u64,
        /// The ranks with no batch left.
        ran_out: Vec<usize>,
        /// The ranks that still had one.
        still: Vec<usize>,
    },
    /// A parameter got no gradient in a backward while the model was
    /// wrapped without `find_unused_parameters`.
    #[error("rank {rank}: parameter(s) {} received no gradient in this backward, so their gradient reduction never started; build DistributedDataParallel with `find_unused_parameters(true)` when a forward may leave parameters out", .params.join(", "))]
    UnusedParameters {
        /// This process's rank.
        rank: usize,
        /// The parameters, by state_dict name.
        params: Vec<String>,
    },
    /// An earlier collective on this group timed out; MPI cannot recover.
    #[error("{collective}: this group is unusable after an earlier timeout ({earlier})")]
    Poisoned {
        /// The collective refused.
        collective: &'static str,
        /// The earlier error.
        earlier: String,
    },
    /// A request this backend or group cannot serve.
    #[error("{what}: {reason}")]
    Invalid {
        /// The call.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] forma_core::Error),
}

fn fmt_per_rank(per_rank: &[String]) -> String {
    per_rank
        .iter()
        .enumerate()
        .map(|(r, s)| format!("rank {r}: {s}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl DistError {
    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        DistError::Invalid {
            what,
            reason: reason.into(),
        }
    }
}

/// The result of a distributed call.
pub type Result<T, E = DistError> = std::result::Result<T, E>;
