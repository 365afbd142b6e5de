//! [`Raw`]: a tensor with its shape type erased, as gradients travel between
//! tape nodes of different shapes.

use crate::device::Backend;
use crate::dtype::Dtype;
use crate::layout::Layout;
use crate::tensor::StorageCell;
use std::sync::Arc;

/// A tensor without its shape type: storage, layout and device.
pub struct Raw<E: Dtype, D: Backend> {
    /// The shared storage.
    pub storage: Arc<StorageCell<D::Storage<E>>>,
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
            storage: Arc::new(StorageCell::new(storage)),
            layout: Layout::contiguous(dims),
            device,
        }
    }

    /// Read access to the storage.
    pub fn storage(&self) -> std::sync::RwLockReadGuard<'_, D::Storage<E>> {
        self.storage.read()
    }

    /// This tensor as a backward saves it (see [`crate::Tensor::saved`]).
    pub fn saved(&self) -> super::Saved {
        super::Saved::new(&self.storage, &self.layout.dims, E::DTYPE)
    }
}
