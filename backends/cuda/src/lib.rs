//! Forma's CUDA backend, on `cudarc`.
//!
//! Everything that touches CUDA sits behind the `cuda` feature, and CUDA is
//! loaded at run time (cudarc's dynamic loading), so the workspace builds and
//! tests on machines without CUDA. [`Cuda::new`] probes for the driver first:
//! cudarc panics at the first driver call when `libcuda` is missing, and Forma
//! turns that absence into an error value instead.
//!
//! With the feature, [`Cuda`] implements `forma_core::Backend` and every
//! kernel trait of `forma_core::ops`, so it is a `Device<E>` for f32, f64,
//! f16 and bf16 and model code runs on it unchanged:
//! `Tensor::zeros_on(shape, &cuda)`, `Tensor::from_vec_on(v, shape, &cuda)`,
//! `tensor.to_device(&cuda)`.
//!
//! - Memory: a caching allocator (`device.rs`) hands freed blocks out again
//!   without calling the driver; uploads are staged through pinned memory.
//! - Ordering: every op of a device is issued on one stream; the host waits
//!   only where it needs a value (`to_vec`, index bounds checks).
//! - Kernels: CUDA C sources in `ops/<op>/<op>.cu`, compiled at run time by
//!   NVRTC for the device's architecture and cached per device and module
//!   (so building needs neither nvcc nor a GPU). Elementwise kernels are
//!   generated from a table beside the op (one row per op, one source for
//!   every dtype); half types compute in f32.
//! - Matmul, batched matmul and convolution (im2col) run on cuBLAS, f16 and
//!   bf16 with f32 compute.

/// Why a CUDA device could not be opened.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CudaError {
    /// The crate was built without the `cuda` feature.
    #[error("forma was built without the `cuda` feature; rebuild with `--features cuda`")]
    NotCompiled,
    /// `libcuda` could not be loaded.
    #[error("no CUDA driver found (libcuda could not be loaded)")]
    NoDriver,
    /// The driver refused (no device with that ordinal, or another driver error).
    #[error("cuda:{ordinal}: {msg}")]
    Driver {
        /// The device ordinal asked for.
        ordinal: usize,
        /// The driver's message.
        msg: String,
    },
}

/// Launches kernel `$f` on the device's stream with `$cfg` and the given
/// arguments (locals: device addresses as `u64`, sizes as `i64`, `Lay`s).
/// Defined before the modules so it is in scope in all of them.
#[cfg(feature = "cuda")]
macro_rules! launch {
    ($dev:expr, $f:expr, $cfg:expr $(, $arg:expr)* $(,)?) => {{
        use cudarc::driver::PushKernelArg as _;
        let inner = $dev.inner();
        let mut b = inner.stream.launch_builder(&$f);
        $( b.arg(&$arg); )*
        // SAFETY: the kernel's parameters match the arguments pushed (the
        // sources and these calls are written together), and every address
        // points into a live storage of the sizes the kernel reads.
        unsafe { b.launch($cfg) }
            .map(|_| ())
            .map_err(|e| inner.err(e))
    }};
}

#[cfg(feature = "cuda")]
mod backend;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
pub mod kernels;
#[cfg(feature = "cuda")]
mod ops;
#[cfg(feature = "cuda")]
mod storage;

#[cfg(feature = "cuda")]
pub use storage::CudaStorage;

/// A CUDA device handle. Handles to the same ordinal share one context,
/// stream, allocator and kernel cache.
///
/// ```
/// use forma_cuda::Cuda;
/// match Cuda::new(0) {
///     Ok(dev) => println!("running on {}", dev.name()),
///     Err(e) => println!("no GPU here: {e}"),
/// }
/// ```
#[derive(Clone, Debug)]
pub struct Cuda {
    ordinal: usize,
    #[cfg(feature = "cuda")]
    inner: std::sync::Arc<device::Inner>,
}

impl PartialEq for Cuda {
    fn eq(&self, other: &Self) -> bool {
        self.ordinal == other.ordinal
    }
}

impl Cuda {
    /// Opens device `ordinal`, or says why it cannot.
    ///
    /// # Errors
    /// [`CudaError::NotCompiled`] without the `cuda` feature, [`CudaError::NoDriver`]
    /// when `libcuda` is absent, [`CudaError::Driver`] when the driver refuses.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        #[cfg(feature = "cuda")]
        {
            // SAFETY: `is_culib_present` only tries to dlopen the driver library.
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
                return Err(CudaError::NoDriver);
            }
            // One state per ordinal for the whole process, like PyTorch's
            // `cuda:N`: every handle shares the stream, so their ops are ordered.
            static DEVICES: std::sync::OnceLock<
                std::sync::Mutex<std::collections::HashMap<usize, std::sync::Arc<device::Inner>>>,
            > = std::sync::OnceLock::new();
            let mut devs = device::lock(DEVICES.get_or_init(Default::default));
            if let Some(inner) = devs.get(&ordinal) {
                return Ok(Cuda {
                    ordinal,
                    inner: inner.clone(),
                });
            }
            let inner = std::sync::Arc::new(
                device::Inner::open(ordinal).map_err(|msg| CudaError::Driver { ordinal, msg })?,
            );
            devs.insert(ordinal, inner.clone());
            Ok(Cuda { ordinal, inner })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(CudaError::NotCompiled)
        }
    }

    /// Whether a CUDA device can be opened here.
    pub fn is_available() -> bool {
        Self::new(0).is_ok()
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// PyTorch's name for the device: `cuda:0`.
    pub fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    /// The device's marketing name, as the driver reports it.
    ///
    /// # Errors
    /// When the driver call fails.
    #[cfg(feature = "cuda")]
    pub fn device_name(&self) -> Result<String, CudaError> {
        self.inner.ctx.name().map_err(|e| CudaError::Driver {
            ordinal: self.ordinal,
            msg: e.to_string(),
        })
    }

    /// Waits until every op issued on the device has finished (for timing;
    /// reading a value back already waits).
    ///
    /// # Errors
    /// When a kernel failed or the driver call fails.
    #[cfg(feature = "cuda")]
    pub fn synchronize(&self) -> forma_core::Result<()> {
        self.inner.sync()
    }

    /// Memory-allocator counters: `(driver allocations so far, bytes held
    /// in the cache)`. A steady-state training loop stops adding to the first.
    #[cfg(feature = "cuda")]
    pub fn memory_stats(&self) -> (usize, usize) {
        self.inner.memory_stats()
    }

    /// Returns the cached free blocks to the driver.
    ///
    /// # Errors
    /// When the driver call fails.
    #[cfg(feature = "cuda")]
    pub fn empty_cache(&self) -> forma_core::Result<()> {
        self.inner.pool.release_cached()
    }

    /// The stream every op of this device is issued on: a library that
    /// issues its own work there (NCCL collectives) is ordered with Forma's
    /// ops without a synchronisation.
    #[cfg(feature = "cuda")]
    pub fn stream(&self) -> &std::sync::Arc<cudarc::driver::CudaStream> {
        &self.inner.stream
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn inner(&self) -> &device::Inner {
        &self.inner
    }

    /// A new uninitialised storage of `len` elements.
    #[cfg(feature = "cuda")]
    pub(crate) fn alloc<E>(&self, len: usize) -> forma_core::Result<CudaStorage<E>> {
        let (ptr, class) = self.inner.alloc(len * std::mem::size_of::<E>())?;
        Ok(CudaStorage::from_block(
            ptr,
            class,
            len,
            self.inner.pool.clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absence_is_an_error_value_not_a_panic() {
        match Cuda::new(0) {
            Ok(dev) => println!("found {}", dev.name()),
            Err(e) => {
                println!("skipped: {e}");
                assert!(!e.to_string().is_empty());
            }
        }
    }
}
