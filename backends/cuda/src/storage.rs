//! [`CudaStorage`]: a typed buffer in device memory from the caching allocator.

use crate::device::Pool;
use std::marker::PhantomData;
use std::sync::Arc;

/// `len` elements of `E` in device memory. Dropping it returns the block to
/// the device's caching allocator (no driver call).
pub struct CudaStorage<E> {
    ptr: u64,
    len: usize,
    class: usize,
    pool: Arc<Pool>,
    _e: PhantomData<E>,
}

impl<E> std::fmt::Debug for CudaStorage<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaStorage({} elements at {:#x})", self.len, self.ptr)
    }
}

impl<E> CudaStorage<E> {
    /// Wraps a block from `pool` (the storage now owns it).
    pub(crate) fn from_block(ptr: u64, class: usize, len: usize, pool: Arc<Pool>) -> Self {
        CudaStorage {
            ptr,
            len,
            class,
            pool,
            _e: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the storage is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of element `offset`.
    pub fn ptr_at(&self, offset: usize) -> u64 {
        self.ptr + (offset * std::mem::size_of::<E>()) as u64
    }

    /// The device address of the first element.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl<E> Drop for CudaStorage<E> {
    fn drop(&mut self) {
        self.pool.free(self.ptr, self.class);
    }
}
