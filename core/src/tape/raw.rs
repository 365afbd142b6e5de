//! [`Raw`]: a tensor with its shape type erased, as gradients travel between
//! tape nodes of different shapes.

use crate::device::Backend;
use crate::dtype::Dtype;
use crate::layout::Layout;
use std::sync::{Arc, RwLock};

/// A tensor without its shape type: storage, layout and device.
pub struct Raw<E: Dtype, D: Backend> {
    /// The shared storage.
    pub storage: Arc<RwLock<D::Storage<E>>>,
    /// The view.
    pub layout: Layout,
    /// The device.
    pub device: D,
}

impl<E: Dtype, D: Backend> Clone for Raw<E, D> {
    fn clone(&self) -> Self {
        Raw {
            storage: Arc::clone(&self.storage),
            layout: self.layout,
            device: self.device.clone(),
        }
    }
}

impl<E: Dtype, D: Backend> std::fmt::Debug for Raw<E, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Raw({:?} {} on {})",
            self.layout.dims,
            E::DTYPE,
            self.device.name()
        )
    }
}

impl<E: Dtype, D: Backend> Raw<E, D> {
    /// A new row-major raw tensor over `storage`.
    pub fn new(storage: D::Storage<E>, dims: &[usize], device: D) -> Self {
        Raw {
            storage: Arc::new(RwLock::new(storage)),
            layout: Layout::contiguous(dims),
            device,
        }
    }

    /// Read access to the storage.
    pub fn storage(&self) -> std::sync::RwLockReadGuard<'_, D::Storage<E>> {
        self.storage.read().unwrap_or_else(|e| e.into_inner())
    }
}
