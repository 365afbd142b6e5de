//! [`TrainingState`]: everything a run needs to resume (model, optimizer,
//! scheduler, data-loader position, and the caller's own values) in one
//! safetensors file. Tensors go under `model.` and `optimizer.`; plain values
//! go in the header metadata as text that round-trips exactly, so a resumed
//! run continues bit-identically on the CPU.

use super::file::{from_bytes, load_file, to_bytes, write_atomic, CheckpointError};
use super::StateDict;
use crate::data::LoaderState;
use crate::optim::OptimizerState;
use crate::sched::SchedulerState;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// A training run's state, as saved by [`TrainingState::save`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainingState {
    /// The model's state_dict.
    pub model: StateDict,
    /// The optimizer's buffers and options.
    pub optimizer: Option<OptimizerState>,
    /// The learning-rate scheduler's position and configuration.
    pub scheduler: Option<SchedulerState>,
    /// Where the data loader stands (epoch, next batch).
    pub loader: Option<LoaderState>,
    /// The caller's values (best accuracy, a run id, ...).
    pub extra: BTreeMap<String, String>,
}

const MODEL: &str = "model.";
const OPTIM: &str = "optimizer.";
const OPTIM_META: &str = "optimizer_meta.";
const SCHED_META: &str = "scheduler.";
const EXTRA: &str = "extra.";
const LOADER_EPOCH: &str = "loader.epoch";
const LOADER_BATCH: &str = "loader.batch";

impl TrainingState {
    /// The bytes of the checkpoint file.
    ///
    /// # Errors
    /// As [`to_bytes`].
    pub fn to_bytes(&self) -> Result<Vec<u8>, CheckpointError> {
        let mut tensors = StateDict::new();
        for (k, d) in self.model.iter() {
            tensors.insert(format!("{MODEL}{k}"), d.clone());
        }
        let mut meta = BTreeMap::new();
        if let Some(o) = &self.optimizer {
            for (k, d) in o.tensors.iter() {
                tensors.insert(format!("{OPTIM}{k}"), d.clone());
            }
            for (k, v) in &o.meta {
                meta.insert(format!("{OPTIM_META}{k}"), v.clone());
            }
            meta.insert(format!("{OPTIM_META}present"), "1".to_string());
        }
        if let Some(s) = &self.scheduler {
            for (k, v) in &s.meta {
                meta.insert(format!("{SCHED_META}{k}"), v.clone());
            }
            meta.insert(format!("{SCHED_META}present"), "1".to_string());
        }
        if let Some(l) = &self.loader {
            meta.insert(LOADER_EPOCH.to_string(), l.epoch.to_string());
            meta.insert(LOADER_BATCH.to_string(), l.batch.to_string());
        }
        for (k, v) in &self.extra {
            meta.insert(format!("{EXTRA}{k}"), v.clone());
        }
        to_bytes(&tensors, &meta)
    }

    /// Saves atomically (a failure leaves any previous file intact).
    ///
    /// # Errors
    /// A [`CheckpointError`] naming the file.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), CheckpointError> {
        let bytes = self.to_bytes()?;
        write_atomic(path.as_ref(), |f| f.write_all(&bytes))
    }

    /// Reads a checkpoint written by [`TrainingState::save`].
    ///
    /// # Errors
    /// A [`CheckpointError`] naming the file and what is wrong.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let path = path.as_ref();
        Self::from_checkpoint(load_file(path)?, &path.display().to_string())
    }

    /// [`TrainingState::load`] from bytes.
    ///
    /// # Errors
    /// As [`TrainingState::load`].
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Self, CheckpointError> {
        Self::from_checkpoint(from_bytes(bytes, name)?, name)
    }

    fn from_checkpoint(ck: super::Checkpoint, path: &str) -> Result<Self, CheckpointError> {
        let bad = |msg: String| CheckpointError::Format {
            path: path.to_string(),
            msg,
        };
        let mut st = TrainingState::default();
        let mut optim = OptimizerState::default();
        for (k, d) in ck.tensors.iter() {
            if let Some(rest) = k.strip_prefix(MODEL) {
                st.model.insert(rest, d.clone());
            } else if let Some(rest) = k.strip_prefix(OPTIM) {
                optim.tensors.insert(rest, d.clone());
            } else {
                return Err(bad(format!(
                    "the tensor `{k}` is neither `model.*` nor `optimizer.*`: not a training checkpoint"
                )));
            }
        }
        let mut sched = SchedulerState::default();
        let (mut has_optim, mut has_sched) = (false, false);
        let mut loader = (None, None);
        for (k, v) in &ck.metadata {
            if let Some(rest) = k.strip_prefix(OPTIM_META) {
                if rest == "present" {
                    has_optim = true;
                } else {
                    optim.meta.insert(rest.to_string(), v.clone());
                }
            } else if let Some(rest) = k.strip_prefix(SCHED_META) {
                if rest == "present" {
                    has_sched = true;
                } else {
                    sched.meta.insert(rest.to_string(), v.clone());
                }
            } else if let Some(rest) = k.strip_prefix(EXTRA) {
                st.extra.insert(rest.to_string(), v.clone());
            } else if k == LOADER_EPOCH {
                loader.0 = Some(v.parse::<u64>().map_err(|e| bad(format!("{k}: {e}")))?);
            } else if k == LOADER_BATCH {
                loader.1 = Some(v.parse::<usize>().map_err(|e| bad(format!("{k}: {e}")))?);
            }
        }
        if has_optim {
            st.optimizer = Some(optim);
        } else if !optim.tensors.is_empty() {
            return Err(bad(
                "optimizer tensors without optimizer metadata".to_string()
            ));
        }
        st.scheduler = has_sched.then_some(sched);
        st.loader = match loader {
            (Some(epoch), Some(batch)) => Some(LoaderState { epoch, batch }),
            (None, None) => None,
            _ => return Err(bad("the loader position is incomplete".to_string())),
        };
        Ok(st)
    }
}
