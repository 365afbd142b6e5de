//! Forma's CUDA backend, on `cudarc`.
//!
//! Everything that touches CUDA sits behind the `cuda` feature, and CUDA is
//! loaded at run time (cudarc's dynamic loading), so the workspace builds and
//! tests on machines without CUDA. [`Cuda::new`] probes for the driver first:
//! cudarc panics at the first driver call when `libcuda` is missing, and Forma
//! turns that absence into an error value instead.
//!
//! What is here now: device selection with a clear error. The storage and the
//! kernels (a `Backend` impl and the kernel traits of `forma_core::ops`) come
//! with the CUDA issue; user code then moves a model with
//! `tensor.to_device(&cuda)` and nothing else changes.

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

/// A CUDA device handle.
#[derive(Clone, Debug)]
pub struct Cuda {
    ordinal: usize,
    #[cfg(feature = "cuda")]
    ctx: std::sync::Arc<cudarc::driver::CudaContext>,
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
            let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(|e| CudaError::Driver {
                ordinal,
                msg: e.to_string(),
            })?;
            Ok(Cuda { ordinal, ctx })
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
        self.ctx.name().map_err(|e| CudaError::Driver {
            ordinal: self.ordinal,
            msg: e.to_string(),
        })
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
