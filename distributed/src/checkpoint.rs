//! One checkpoint per data-parallel job.

use crate::error::Result;
use crate::group::ProcessGroup;
use forma_nn::state::TrainingState;
use std::path::Path;

/// The metadata key [`save_on_rank0`] records the world size under.
pub const WORLD_SIZE_KEY: &str = "distributed.world_size";

/// Saves `state` from rank 0 only (atomically: a crash mid-write leaves the
/// previous file), then waits until it is written, so that no rank moves on
/// (or exits) before the checkpoint exists. Every rank calls it. The world
/// size is recorded in `state.extra` under `distributed.world_size`.
///
/// Every replica holds the same weights and optimizer state, so rank 0's
/// are the job's. To resume, every rank loads the file: with the same world
/// size the loader position ([`TrainingState::loader`]) resumes each rank's
/// share exactly (a [`forma_nn::data::DistributedSampler`] depends only on
/// the seed, the epoch and the rank); with another world size the shares
/// differ, so resume the model, optimizer and scheduler and restart the
/// epoch (batch 0).
///
/// # Errors
/// The write failed on rank 0 (reported on rank 0; the other ranks see the
/// barrier complete), or a communication failure.
pub fn save_on_rank0(
    group: &ProcessGroup,
    path: impl AsRef<Path>,
    state: &TrainingState,
) -> Result<()> {
    let mut result = Ok(());
    if group.rank() == 0 {
        let mut state = state.clone();
        state
            .extra
            .insert(WORLD_SIZE_KEY.to_string(), group.world_size().to_string());
        result = state
            .save(path)
            .map_err(|e| crate::DistError::invalid("save_on_rank0", e.to_string()));
    }
    group.barrier()?;
    result
}
