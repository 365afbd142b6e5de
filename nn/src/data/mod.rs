//! Datasets, the DataLoader, and readers for MNIST-format IDX files, in the
//! shape of `torch.utils.data`:
//!
//! - [`Dataset`]: `len()` items fetched by index; implemented by `Vec<T>`,
//!   [`TensorDataset`] (features and labels in memory), [`Subset`] (see
//!   [`random_split`]) and [`Mnist`].
//! - [`DataLoader`]: batches in a seeded shuffled order, `drop_last`, worker
//!   threads that keep the order, a [`Collate`] step, and a position
//!   ([`LoaderState`]) that checkpoints save and restore.
//! - [`DistributedSampler`]: one process's share of each epoch in a
//!   data-parallel job.
//! - [`read_idx`], [`read_idx_images`], [`read_idx_labels`]: the IDX format,
//!   plain or gzip-compressed, read as untrusted input.
//!
//! Every fallible call returns a [`DataError`]; file errors name the file.

mod collate;
mod dataset;
mod error;
mod idx;
mod loader;
mod mnist;
mod sampler;

pub use collate::{Batchable, Collate, DefaultCollate};
pub use dataset::{
    random_split, split_lengths, Dataset, Subset, Target, TargetRows, TensorDataset,
};
pub use error::DataError;
pub use idx::{
    read_idx, read_idx_images, read_idx_labels, read_idx_limited, IdxArray, IdxData, IdxImages,
    IdxType, MAX_IDX_RANK,
};
pub use loader::{Batches, DataLoader, LoaderState};
pub use mnist::{Mnist, MnistSplit};
pub use sampler::DistributedSampler;
