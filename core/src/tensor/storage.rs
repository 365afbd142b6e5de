//! [`StorageCell`]: a tensor's storage behind its lock, with PyTorch's
//! version counter.
//!
//! Every in-place write takes the write lock through [`StorageCell::write`],
//! which bumps the version. The tape records the version of every tensor an
//! op saves for its backward ([`crate::tape::Saved`]) and checks it before the
//! backward runs, so a saved tensor modified in between is an error instead
//! of a silently wrong gradient. Views and clones share the cell, so they
//! share the counter, as in PyTorch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A storage with its version counter.
#[derive(Debug)]
pub struct StorageCell<T> {
    data: RwLock<T>,
    version: AtomicU64,
}

impl<T> StorageCell<T> {
    /// A new storage at version 0.
    pub fn new(data: T) -> Self {
        StorageCell {
            data: RwLock::new(data),
            version: AtomicU64::new(0),
        }
    }

    /// Read access (kernels read through this).
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Write access for an in-place update: bumps the version first, so a
    /// tensor saved for a backward before this write is known to be stale.
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.version.fetch_add(1, Ordering::SeqCst);
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }

    /// How many in-place writes this storage has seen, like `tensor._version`.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }
}

/// A storage's version counter with the storage's type erased, so a node can
/// hold the counters of saved tensors of any dtype.
pub trait Versioned: Send + Sync {
    /// The current version.
    fn version(&self) -> u64;
}

impl<T: Send + Sync> Versioned for StorageCell<T> {
    fn version(&self) -> u64 {
        StorageCell::version(self)
    }
}
