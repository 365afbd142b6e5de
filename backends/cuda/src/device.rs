//! The state behind a [`Cuda`](crate::Cuda) handle: the context, the one
//! stream every op is ordered on, the cuBLAS handle, the caching allocator,
//! the pinned staging buffer for uploads, and the NVRTC module cache.
//!
//! Every kernel, copy and gemm of a device is issued on one stream, so a
//! buffer freed by one op and handed to the next is never touched out of
//! order, and the host waits only where it needs a value (`to_vec`, an index
//! check).

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream, DeviceRepr, LaunchConfig,
    PinnedHostSlice,
};
use forma_core::{Error, Layout, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Threads per block of the elementwise and reduction kernels.
pub(crate) const THREADS: u32 = 256;

/// A backend error on device `ordinal`.
pub(crate) fn err(ordinal: usize, msg: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: format!("cuda:{ordinal}"),
        msg: msg.to_string(),
    }
}

/// Locks a mutex, ignoring poisoning (the guarded maps stay consistent: every
/// update is a single insert or pop).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The caching allocator. Freed blocks go to a free list keyed by their size
/// class and are handed out again without a driver call, so a training loop
/// that allocates the same sizes each step reaches a steady state where it
/// never calls `cuMemAlloc`. Blocks are only used on the device's one stream,
/// so reuse is ordered after every earlier use.
#[derive(Debug)]
pub(crate) struct Pool {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    free: Mutex<HashMap<usize, Vec<u64>>>,
    driver_allocs: AtomicUsize,
    cached_bytes: AtomicUsize,
}

impl Pool {
    /// The size class of a request: 512-byte granules up to 4 KiB, then
    /// eighths of the next power of two (at most 12.5% unused).
    pub(crate) fn class(bytes: usize) -> usize {
        if bytes <= 4096 {
            return bytes.next_multiple_of(512);
        }
        let step = bytes.next_power_of_two() / 8;
        bytes.next_multiple_of(step)
    }

    /// A block of at least `bytes`; `(pointer, class)`. Zero bytes is the null block.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<(u64, usize)> {
        if bytes == 0 {
            return Ok((0, 0));
        }
        let class = Self::class(bytes);
        if let Some(p) = lock(&self.free).get_mut(&class).and_then(Vec::pop) {
            self.cached_bytes.fetch_sub(class, Ordering::Relaxed);
            return Ok((p, class));
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| err(self.ordinal, e))?;
        // SAFETY: the context is bound; the block is owned by the pool until freed.
        let p = match unsafe { result::malloc_sync(class) } {
            Ok(p) => p,
            Err(_) => {
                // Out of memory: give the cached blocks back and try once more.
                self.release_cached()?;
                unsafe { result::malloc_sync(class) }
                    .map_err(|e| err(self.ordinal, format!("cannot allocate {class} bytes: {e}")))?
            }
        };
        self.driver_allocs.fetch_add(1, Ordering::Relaxed);
        Ok((p, class))
    }

    /// Returns a block to its free list.
    pub(crate) fn free(&self, ptr: u64, class: usize) {
        if ptr != 0 {
            lock(&self.free).entry(class).or_default().push(ptr);
            self.cached_bytes.fetch_add(class, Ordering::Relaxed);
        }
    }

    /// Frees every cached block back to the driver.
    pub(crate) fn release_cached(&self) -> Result<()> {
        let blocks: Vec<u64> = lock(&self.free).drain().flat_map(|(_, v)| v).collect();
        self.ctx
            .bind_to_thread()
            .map_err(|e| err(self.ordinal, e))?;
        // `cuMemFree` waits for work using the block, so no sync is needed first.
        for p in blocks {
            // SAFETY: the block came from `malloc_sync` and no storage owns it.
            unsafe { result::free_sync(p) }.map_err(|e| err(self.ordinal, e))?;
        }
        self.cached_bytes.store(0, Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = self.release_cached();
    }
}

/// The pinned buffer uploads are staged through, and the event marking the
/// end of the last copy out of it.
#[derive(Debug)]
struct Staging {
    buf: PinnedHostSlice<u8>,
    done: CudaEvent,
}

/// Uploads larger than this go straight from the caller's memory (one
/// synchronous copy) rather than growing the pinned buffer without bound.
const MAX_STAGING: usize = 64 << 20;

/// A device's state, shared by every handle to it.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) ordinal: usize,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) blas: Mutex<CudaBlas>,
    pub(crate) pool: Arc<Pool>,
    /// `compute_XY` of the device, for NVRTC.
    pub(crate) arch: String,
    functions: Mutex<HashMap<String, CudaFunction>>,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
    staging: Mutex<Option<Staging>>,
}

/// Sizes and strides of a view as kernels read them (`struct Lay` in
/// `common.cuh`, field for field).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lay {
    offset: i64,
    dims: [i64; 8],
    strides: [i64; 8],
    rank: i32,
    contig: i32,
}

// SAFETY: `Lay` is `repr(C)` plain data matching the CUDA struct.
unsafe impl DeviceRepr for Lay {}

impl Lay {
    /// The kernel view of a layout.
    pub(crate) fn new(l: &Layout) -> Self {
        let mut dims = [1i64; 8];
        let mut strides = [0i64; 8];
        for d in 0..l.rank() {
            dims[d] = l.dims[d] as i64;
            strides[d] = l.strides[d] as i64;
        }
        Lay {
            offset: l.offset as i64,
            dims,
            strides,
            rank: l.rank() as i32,
            contig: i32::from(l.is_contiguous()),
        }
    }
}

/// A 1-d launch of `n` work items, [`THREADS`] per block, the grid capped
/// (kernels loop with a grid stride).
pub(crate) fn cfg_1d(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 1 << 20);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of [`THREADS`] per lane (reductions, softmax), the grid capped.
pub(crate) fn cfg_lanes(lanes: usize, shared_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (lanes.clamp(1, 1 << 20) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: shared_bytes,
    }
}

/// The shared source prepended to every module.
pub(crate) const COMMON: &str = include_str!("ops/common.cuh");

impl Inner {
    /// Opens the device: context, stream, cuBLAS, pool.
    pub(crate) fn open(ordinal: usize) -> std::result::Result<Self, String> {
        let ctx = CudaContext::new(ordinal).map_err(|e| e.to_string())?;
        let stream = ctx.new_stream().map_err(|e| e.to_string())?;
        // SAFETY: only dlopens the library.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err("libcublas could not be loaded".into());
        }
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err("libnvrtc could not be loaded (kernels are compiled at run time)".into());
        }
        let blas = CudaBlas::new(stream.clone()).map_err(|e| e.to_string())?;
        let (major, minor) = ctx.compute_capability().map_err(|e| e.to_string())?;
        let pool = Arc::new(Pool {
            ordinal,
            ctx: ctx.clone(),
            free: Mutex::new(HashMap::new()),
            driver_allocs: AtomicUsize::new(0),
            cached_bytes: AtomicUsize::new(0),
        });
        Ok(Inner {
            ordinal,
            ctx,
            stream,
            blas: Mutex::new(blas),
            pool,
            arch: format!("compute_{major}{minor}"),
            functions: Mutex::new(HashMap::new()),
            modules: Mutex::new(HashMap::new()),
            staging: Mutex::new(None),
        })
    }

    /// A backend error on this device.
    pub(crate) fn err(&self, msg: impl std::fmt::Display) -> Error {
        err(self.ordinal, msg)
    }

    /// The kernel `name` of the module `key`, compiling the module's source
    /// (`src()`, without the common prelude) with NVRTC the first time.
    pub(crate) fn function(
        &self,
        key: &str,
        src: impl FnOnce() -> String,
        name: &str,
    ) -> Result<CudaFunction> {
        let fkey = format!("{key}::{name}");
        if let Some(f) = lock(&self.functions).get(&fkey) {
            return Ok(f.clone());
        }
        let module = {
            let mut mods = lock(&self.modules);
            match mods.get(key) {
                Some(m) => m.clone(),
                None => {
                    let full = format!("{COMMON}\n{}", src());
                    let ptx =
                        crate::kernels::compile(&full, &self.arch, key).map_err(|e| self.err(e))?;
                    let m = self.ctx.load_module(ptx).map_err(|e| self.err(e))?;
                    mods.insert(key.to_string(), m.clone());
                    m
                }
            }
        };
        let f = module
            .load_function(name)
            .map_err(|e| self.err(format!("kernel {name} of {key}: {e}")))?;
        lock(&self.functions).insert(fkey, f.clone());
        Ok(f)
    }

    /// Allocates `bytes` from the pool.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<(u64, usize)> {
        self.pool.alloc(bytes)
    }

    /// Copies host bytes to `dst` on the stream, through the pinned staging
    /// buffer (so the copy is asynchronous and the caller's memory is free at
    /// once); the host waits only if the previous upload has not left the
    /// staging buffer yet.
    pub(crate) fn upload_bytes(&self, dst: u64, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(|e| self.err(e))?;
        let n = bytes.len();
        if n > MAX_STAGING {
            // SAFETY: `dst` holds at least `n` bytes; the sync keeps `bytes` alive
            // until the copy is done.
            unsafe { result::memcpy_htod_async(dst, bytes, self.stream.cu_stream()) }
                .map_err(|e| self.err(e))?;
            return self.sync();
        }
        let mut st = lock(&self.staging);
        if st.as_ref().is_none_or(|s| s.buf.len() < n) {
            if let Some(old) = st.take() {
                // The old buffer may still be read by a copy: wait before freeing it.
                old.done.synchronize().map_err(|e| self.err(e))?;
            }
            let cap = n.next_power_of_two().max(1 << 16);
            // SAFETY: the buffer is written before it is read.
            let buf = unsafe { self.ctx.alloc_pinned::<u8>(cap) }.map_err(|e| self.err(e))?;
            let done = self.ctx.new_event(None).map_err(|e| self.err(e))?;
            *st = Some(Staging { buf, done });
        }
        let s = st.as_mut().expect("staging buffer was just set");
        s.done.synchronize().map_err(|e| self.err(e))?;
        let host = s.buf.as_mut_slice().map_err(|e| self.err(e))?;
        host[..n].copy_from_slice(bytes);
        // SAFETY: pinned source of `n` bytes, kept until `done` fires; `dst` holds `n` bytes.
        unsafe { result::memcpy_htod_async(dst, &host[..n], self.stream.cu_stream()) }
            .map_err(|e| self.err(e))?;
        s.done.record(&self.stream).map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Copies `dst.len()` elements from device address `src` to the host,
    /// waiting for the stream.
    pub(crate) fn download<T>(&self, src: u64, dst: &mut [T]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(|e| self.err(e))?;
        // SAFETY: `src` holds `dst.len()` elements of `T`; the sync below ends the copy
        // before `dst` is used.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| self.err(e))?;
        self.sync()
    }

    /// Copies `bytes` between device addresses on the stream.
    pub(crate) fn copy_d2d(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(|e| self.err(e))?;
        // SAFETY: both blocks hold `bytes`.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(|e| self.err(e))
    }

    /// Sets `bytes` at `dst` to zero, on the stream.
    pub(crate) fn zero(&self, dst: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(|e| self.err(e))?;
        // SAFETY: `dst` holds `bytes`.
        unsafe { result::memset_d8_async(dst, 0, bytes, self.stream.cu_stream()) }
            .map_err(|e| self.err(e))
    }

    /// Waits for every op issued so far.
    pub(crate) fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| self.err(e))
    }

    /// `(driver allocations so far, bytes cached in free lists)`.
    pub(crate) fn memory_stats(&self) -> (usize, usize) {
        (
            self.pool.driver_allocs.load(Ordering::Relaxed),
            self.pool.cached_bytes.load(Ordering::Relaxed),
        )
    }
}
