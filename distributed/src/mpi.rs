//! The MPI backend, on the `mpi` crate (rsmpi) and the MPI library it binds
//! (OpenMPI, MPICH, Intel MPI). Collectives are MPI's non-blocking ones,
//! polled until they complete or the group's timeout passes: MPI itself
//! waits forever for a rank that never joins, and Forma reports that as a
//! [`DistError::Timeout`] instead.

use crate::comm::{Comm, Pending, ReduceOp};
use crate::error::{DistError, Result};
use crate::wire::{BufMut, Wire};
use mpi::ffi;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// MPI is initialised for serialised use from any thread: every call into
/// the library holds this lock.
static MPI_LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    MPI_LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The initialised MPI library. Dropping the last handle (the [`Mpi`] value
/// and every group made from it) finalises it; after a timeout, when a
/// collective is still in flight and MPI cannot finalise, it aborts the job
/// instead (`MPI_Abort`), which ends every rank.
struct Runtime {
    universe: Mutex<Option<mpi::environment::Universe>>,
    /// The first timeout's message: MPI cannot cancel a collective, so the
    /// library is unusable after one.
    poisoned: Mutex<Option<String>>,
    /// The implementation's `MPI_IN_PLACE` marker, when known.
    in_place: Option<*mut c_void>,
}

// SAFETY: the raw marker is a constant address that is never dereferenced,
// and every MPI call is serialised by MPI_LOCK.
unsafe impl Send for Runtime {}
unsafe impl Sync for Runtime {}

impl Runtime {
    fn poisoned(&self) -> Option<String> {
        self.poisoned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let universe = self
            .universe
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // A panicking rank cannot finalise (MPI_Finalize waits for the other
        // ranks, which may be waiting for this one): it ends the job.
        let reason = self
            .poisoned()
            .or_else(|| std::thread::panicking().then(|| "this rank panicked".to_string()));
        if let Some(reason) = reason {
            eprintln!("forma-distributed: aborting the MPI job: {reason}");
            std::mem::forget(universe);
            let _guard = lock();
            // SAFETY: MPI is initialised; aborting never returns.
            unsafe {
                ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1);
            }
            std::process::exit(1);
        }
        let _guard = lock();
        drop(universe);
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("poisoned", &self.poisoned())
            .finish_non_exhaustive()
    }
}

/// MPI, initialised: [`crate::init_mpi`] returns it.
#[derive(Debug, Clone)]
pub struct Mpi {
    rt: Arc<Runtime>,
}

/// The live runtime, so that a second `init` shares it.
static RUNTIME: Mutex<Option<std::sync::Weak<Runtime>>> = Mutex::new(None);

impl Mpi {
    /// Starts MPI, or returns the running instance (every handle shares it).
    pub(crate) fn init() -> Result<Self> {
        let mut live = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(rt) = live.as_ref().and_then(std::sync::Weak::upgrade) {
            return Ok(Mpi { rt });
        }
        let _guard = lock();
        let (universe, _level) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| {
                DistError::invalid(
                    "init_mpi",
                    "MPI was started and finalised earlier in this process, and cannot start again: keep the world group alive for the whole program",
                )
            })?;
        let version = mpi::environment::library_version().unwrap_or_default();
        // `MPI_IN_PLACE` is a macro of mpi.h that the bindings cannot see; its
        // value is part of each implementation's ABI.
        let in_place = if version.contains("Open MPI") {
            Some(std::ptr::without_provenance_mut::<c_void>(1))
        } else if version.contains("MPICH") || version.contains("Intel") {
            Some(std::ptr::without_provenance_mut::<c_void>(usize::MAX))
        } else {
            None
        };
        // SAFETY: MPI is initialised; errors on the world communicator then
        // come back as codes instead of aborting.
        unsafe {
            ffi::MPI_Comm_set_errhandler(ffi::RSMPI_COMM_WORLD, ffi::RSMPI_ERRORS_RETURN);
        }
        let rt = Arc::new(Runtime {
            universe: Mutex::new(Some(universe)),
            poisoned: Mutex::new(None),
            in_place,
        });
        *live = Some(Arc::downgrade(&rt));
        Ok(Mpi { rt })
    }

    /// Every process of the job.
    pub(crate) fn world(&self) -> Arc<dyn Comm> {
        let (mut rank, mut size) = (0, 0);
        let _guard = lock();
        // SAFETY: MPI is initialised.
        unsafe {
            ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut rank);
            ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut size);
        }
        Arc::new(MpiComm {
            comm: RawComm(unsafe { ffi::RSMPI_COMM_WORLD }),
            owned: false,
            rank: rank as usize,
            size: size as usize,
            rt: Arc::clone(&self.rt),
        })
    }
}

#[derive(Clone, Copy, Debug)]
struct RawComm(ffi::MPI_Comm);
// SAFETY: a communicator handle may be used from any thread under MPI_LOCK.
unsafe impl Send for RawComm {}
unsafe impl Sync for RawComm {}

#[derive(Debug)]
struct MpiComm {
    comm: RawComm,
    owned: bool,
    rank: usize,
    size: usize,
    rt: Arc<Runtime>,
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        if self.owned && self.rt.poisoned().is_none() {
            let _guard = lock();
            // SAFETY: the communicator was created by MPI_Comm_split and is
            // freed once.
            unsafe {
                ffi::MPI_Comm_free(&mut self.comm.0);
            }
        }
    }
}

fn datatype(wire: Wire) -> ffi::MPI_Datatype {
    // SAFETY: reading the library's constant handles.
    unsafe {
        match wire {
            Wire::F32 => ffi::RSMPI_FLOAT,
            Wire::F64 => ffi::RSMPI_DOUBLE,
            Wire::I64 => ffi::RSMPI_INT64_T,
            Wire::U8 => ffi::RSMPI_UINT8_T,
        }
    }
}

fn op(op: ReduceOp) -> ffi::MPI_Op {
    // SAFETY: reading the library's constant handles.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Mean => ffi::RSMPI_SUM,
            ReduceOp::Max => ffi::RSMPI_MAX,
            ReduceOp::Min => ffi::RSMPI_MIN,
        }
    }
}

fn error_string(code: c_int) -> String {
    let mut buf = vec![0u8; 1024];
    let mut len: c_int = 0;
    // SAFETY: the buffer is MPI_MAX_ERROR_STRING (at most 1024 here) long.
    unsafe {
        ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len);
    }
    buf.truncate(len.max(0) as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

struct Request(ffi::MPI_Request);
// SAFETY: a request handle may be tested from any thread under MPI_LOCK.
unsafe impl Send for Request {}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MPI_Request")
    }
}

/// A started MPI collective.
#[derive(Debug)]
struct MpiPending {
    req: Request,
    what: &'static str,
    rank: usize,
    size: usize,
    rt: Arc<Runtime>,
    /// A copy of the input, when the implementation has no in-place marker.
    _scratch: Option<Vec<u8>>,
    /// MPI_Test has reported it complete (the request is freed).
    done: bool,
}

impl MpiPending {
    /// One MPI_Test: whether the collective has completed.
    fn test(&mut self) -> Result<bool> {
        if self.done {
            return Ok(true);
        }
        let mut flag: c_int = 0;
        let rc = {
            let _guard = lock();
            // SAFETY: the request is live until MPI_Test reports it done.
            unsafe { ffi::MPI_Test(&mut self.req.0, &mut flag, ffi::RSMPI_STATUS_IGNORE) }
        };
        if rc != 0 {
            return Err(DistError::Backend {
                collective: self.what,
                rank: self.rank,
                world: self.size,
                backend: "mpi",
                code: rc,
                message: error_string(rc),
            });
        }
        self.done = flag != 0;
        Ok(self.done)
    }
}

impl Pending for MpiPending {
    fn progress(&mut self) -> Result<()> {
        self.test().map(|_| ())
    }

    fn wait(mut self: Box<Self>, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            if self.test()? {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                let err = DistError::Timeout {
                    collective: self.what,
                    rank: self.rank,
                    world: self.size,
                    waited,
                };
                *self
                    .rt
                    .poisoned
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(err.to_string());
                // The library may still write into the buffers: they must
                // outlive this process's use of MPI.
                std::mem::forget(self);
                return Err(err);
            }
            polls += 1;
            if polls < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

impl MpiComm {
    fn check_usable(&self, what: &'static str) -> Result<()> {
        match self.rt.poisoned() {
            Some(earlier) => Err(DistError::Poisoned {
                collective: what,
                earlier,
            }),
            None => Ok(()),
        }
    }

    fn count(&self, what: &'static str, len: usize) -> Result<c_int> {
        c_int::try_from(len).map_err(|_| {
            DistError::invalid(
                what,
                format!("{len} elements exceed MPI's count limit (2^31 - 1)"),
            )
        })
    }

    /// Starts `call` (which fills in the request) and returns the pending collective.
    fn start(
        &self,
        what: &'static str,
        scratch: Option<Vec<u8>>,
        call: impl FnOnce(*mut ffi::MPI_Request) -> c_int,
    ) -> Result<MpiPending> {
        self.check_usable(what)?;
        let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        let rc = {
            let _guard = lock();
            call(&mut req)
        };
        if rc != 0 {
            return Err(DistError::Backend {
                collective: what,
                rank: self.rank,
                world: self.size,
                backend: "mpi",
                code: rc,
                message: error_string(rc),
            });
        }
        Ok(MpiPending {
            req: Request(req),
            what,
            rank: self.rank,
            size: self.size,
            rt: Arc::clone(&self.rt),
            _scratch: scratch,
            done: false,
        })
    }

    unsafe fn start_all_reduce(
        &self,
        what: &'static str,
        ptr: *mut u8,
        len: usize,
        wire: Wire,
        reduce: ReduceOp,
    ) -> Result<MpiPending> {
        let count = self.count(what, len)?;
        let comm = self.comm.0;
        match self.rt.in_place {
            // SAFETY: the caller keeps `ptr` valid until the request completes.
            Some(in_place) => self.start(what, None, |req| unsafe {
                ffi::MPI_Iallreduce(
                    in_place,
                    ptr.cast(),
                    count,
                    datatype(wire),
                    op(reduce),
                    comm,
                    req,
                )
            }),
            None => {
                // SAFETY: as above; the copy lives in the pending request.
                let scratch =
                    unsafe { std::slice::from_raw_parts(ptr, len * wire.size()) }.to_vec();
                let send = scratch.as_ptr();
                self.start(what, Some(scratch), |req| unsafe {
                    ffi::MPI_Iallreduce(
                        send.cast(),
                        ptr.cast(),
                        count,
                        datatype(wire),
                        op(reduce),
                        comm,
                        req,
                    )
                })
            }
        }
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn all_reduce(&self, mut buf: BufMut<'_>, reduce: ReduceOp, timeout: Duration) -> Result<()> {
        let (len, wire) = (buf.len(), buf.wire());
        // SAFETY: `buf` is borrowed until the wait below returns (a timeout
        // leaks the request, and MPI is unusable from then on).
        let p =
            unsafe { self.start_all_reduce("all_reduce", buf.as_mut_ptr(), len, wire, reduce)? };
        Box::new(p).wait(timeout)
    }

    fn broadcast(&self, mut buf: BufMut<'_>, root: usize, timeout: Duration) -> Result<()> {
        let count = self.count("broadcast", buf.len())?;
        let (ptr, dt, comm) = (buf.as_mut_ptr(), datatype(buf.wire()), self.comm.0);
        // SAFETY: `buf` outlives the wait.
        let p = self.start("broadcast", None, |req| unsafe {
            ffi::MPI_Ibcast(ptr.cast(), count, dt, root as c_int, comm, req)
        })?;
        Box::new(p).wait(timeout)
    }

    fn all_gather(
        &self,
        mut send: BufMut<'_>,
        mut recv: BufMut<'_>,
        timeout: Duration,
    ) -> Result<()> {
        let count = self.count("all_gather", send.len())?;
        let dt = datatype(send.wire());
        let (s, r, comm) = (send.as_mut_ptr(), recv.as_mut_ptr(), self.comm.0);
        // SAFETY: both buffers outlive the wait.
        let p = self.start("all_gather", None, |req| unsafe {
            ffi::MPI_Iallgather(s.cast(), count, dt, r.cast(), count, dt, comm, req)
        })?;
        Box::new(p).wait(timeout)
    }

    fn reduce_scatter(
        &self,
        mut send: BufMut<'_>,
        mut recv: BufMut<'_>,
        reduce: ReduceOp,
        timeout: Duration,
    ) -> Result<()> {
        let count = self.count("reduce_scatter", recv.len())?;
        let dt = datatype(send.wire());
        let (s, r, comm) = (send.as_mut_ptr(), recv.as_mut_ptr(), self.comm.0);
        // SAFETY: both buffers outlive the wait.
        let p = self.start("reduce_scatter", None, |req| unsafe {
            ffi::MPI_Ireduce_scatter_block(s.cast(), r.cast(), count, dt, op(reduce), comm, req)
        })?;
        Box::new(p).wait(timeout)
    }

    fn barrier(&self, timeout: Duration) -> Result<()> {
        let comm = self.comm.0;
        // SAFETY: no buffers.
        let p = self.start("barrier", None, |req| unsafe {
            ffi::MPI_Ibarrier(comm, req)
        })?;
        Box::new(p).wait(timeout)
    }

    fn split(&self, ranks: &[usize]) -> Result<Option<Arc<dyn Comm>>> {
        self.check_usable("new_group")?;
        let position = ranks.iter().position(|&r| r == self.rank);
        let color = match position {
            Some(_) => 0,
            None => unsafe { ffi::RSMPI_UNDEFINED },
        };
        let key = position.unwrap_or(0) as c_int;
        let mut new: ffi::MPI_Comm = unsafe { ffi::RSMPI_COMM_NULL };
        let rc = {
            let _guard = lock();
            // SAFETY: a collective over this communicator; `new` is written.
            unsafe { ffi::MPI_Comm_split(self.comm.0, color, key, &mut new) }
        };
        if rc != 0 {
            return Err(DistError::Backend {
                collective: "new_group",
                rank: self.rank,
                world: self.size,
                backend: "mpi",
                code: rc,
                message: error_string(rc),
            });
        }
        let Some(position) = position else {
            return Ok(None);
        };
        let _guard = lock();
        // SAFETY: `new` is a valid communicator on the ranks inside.
        unsafe {
            ffi::MPI_Comm_set_errhandler(new, ffi::RSMPI_ERRORS_RETURN);
        }
        Ok(Some(Arc::new(MpiComm {
            comm: RawComm(new),
            owned: true,
            rank: position,
            size: ranks.len(),
            rt: Arc::clone(&self.rt),
        })))
    }

    unsafe fn start_sum(&self, ptr: *mut u8, len: usize, wire: Wire) -> Result<Box<dyn Pending>> {
        // SAFETY: the caller's contract.
        Ok(Box::new(unsafe {
            self.start_all_reduce(
                "all_reduce (gradient bucket)",
                ptr,
                len,
                wire,
                ReduceOp::Sum,
            )?
        }))
    }
}
