//! Weights packed once for eager inference: a linear layer's under
//! autocast, a convolution's where the backend packs it.
//!
//! Under autocast a linear layer's product packs its weight into the
//! backend's low-precision layout on every call (on the CPU, bf16 tiles
//! for AMX: 11% of a 6-layer encoder's b8 s128 inference), and a
//! convolution with few output positions per image packs its whole weight
//! for each image (12% of ResNet-18's b1 inference). Where no
//! gradient is wanted the weight is read, not written, from one call to the
//! next, so its packed copy is kept here and reused while the weight's
//! storage is the same and its version counter has not moved: an optimizer
//! step or `assign` writes the storage in place and bumps the version, a
//! load that replaces a tensor gives it another storage, and either way
//! the next call packs it again. The products read the packed copy as they
//! would have read their own: the same values, bit for bit.
//!
//! An entry holds a weak reference to the storage, so a dropped model's
//! entry cannot match another storage that reuses the address; such
//! entries are dropped on the next insert. At most [`MAX_BYTES`] of packed
//! copies are kept (the least recently used go first);
//! [`clear_packed_weights`] releases them all.

use crate::device::Backend;
use crate::dtype::{DType, Float};
use crate::layout::Layout;
use crate::ops::matmul::PackedRhs;
use crate::shape::Shape;
use crate::tensor::{StorageCell, Tensor};
use std::any::Any;
use std::sync::{Arc, Mutex, Weak};

/// The most bytes of packed copies kept.
pub const MAX_BYTES: usize = 512 << 20;

/// One packed weight.
struct Entry {
    /// The weight's storage (weak: the cache does not keep a model alive).
    storage: Weak<dyn Any + Send + Sync>,
    /// Its version when packed.
    version: u64,
    /// The weight's layout as the product reads it, and the precision.
    layout: Layout,
    low: DType,
    packed: PackedRhs,
    /// Bytes of the packed copy (tiles padded; an estimate).
    bytes: usize,
    /// When it was last used, for eviction.
    used: u64,
}

struct Cache {
    entries: Vec<Entry>,
    tick: u64,
}

static CACHE: Mutex<Cache> = Mutex::new(Cache {
    entries: Vec::new(),
    tick: 0,
});

fn cache() -> std::sync::MutexGuard<'static, Cache> {
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// How many weights are held packed.
pub fn packed_weights() -> usize {
    cache().entries.len()
}

/// Releases every packed copy (the next products pack their weights again).
pub fn clear_packed_weights() {
    cache().entries.clear();
}

/// Whether a packed copy of `weight`'s storage at its current version is
/// held (in any layout or precision).
pub fn holds_packed<S: Shape, E: Float, D: Backend>(weight: &Tensor<S, E, D>) -> bool {
    let version = weight.storage.version();
    let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(&weight.storage) as Weak<StorageCell<_>>;
    cache()
        .entries
        .iter()
        .any(|e| e.storage.ptr_eq(&weak) && e.version == version)
}

/// The packed copy of the weight in `storage` read through `layout` in
/// `low` (the element type itself where the product is not a low-precision
/// one), packed by `pack` when there is none for the storage's current
/// version. `Ok(None)` when `pack` gives none (the backend has no packed
/// form).
pub(crate) fn packed<T: Send + Sync + 'static>(
    storage: &Arc<StorageCell<T>>,
    layout: &Layout,
    low: DType,
    pack: impl FnOnce() -> crate::Result<Option<PackedRhs>>,
) -> crate::Result<Option<PackedRhs>> {
    let version = storage.version();
    let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(storage) as Weak<StorageCell<T>>;
    let same = |e: &Entry| e.storage.ptr_eq(&weak) && e.layout == *layout && e.low == low;
    {
        let mut c = cache();
        c.tick += 1;
        let tick = c.tick;
        if let Some(e) = c.entries.iter_mut().find(|e| same(e)) {
            if e.version == version {
                e.used = tick;
                return Ok(Some(e.packed.clone()));
            }
        }
    }
    // Packed outside the lock: other threads' products go on meanwhile.
    let Some(packed) = pack()? else {
        return Ok(None);
    };
    let width = match low {
        DType::BF16 | DType::F16 => 2,
        DType::F64 => 8,
        _ => 4,
    };
    let bytes = width * packed.k.next_multiple_of(32) * packed.n.next_multiple_of(16);
    let mut c = cache();
    let tick = c.tick;
    c.entries
        .retain(|e| e.storage.strong_count() > 0 && !same(e));
    if bytes <= MAX_BYTES {
        let mut total: usize = c.entries.iter().map(|e| e.bytes).sum::<usize>() + bytes;
        while total > MAX_BYTES {
            let oldest = (0..c.entries.len())
                .min_by_key(|&i| c.entries[i].used)
                .expect("entries hold the excess");
            total -= c.entries.swap_remove(oldest).bytes;
        }
        c.entries.push(Entry {
            storage: weak,
            version,
            layout: *layout,
            low,
            packed: packed.clone(),
            bytes,
            used: tick,
        });
    }
    Ok(Some(packed))
}
