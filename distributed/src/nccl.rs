//! The NCCL backend for CUDA tensors (feature `nccl`), on cudarc's NCCL
//! bindings: [`NcclGroup`].
//!
//! Collectives are issued on the tensor's device stream, the one every
//! Forma op of that device runs on, so they are ordered with the ops before
//! and after them without a host synchronisation (as PyTorch's NCCL
//! process group does with its streams). NCCL is loaded at run time: a
//! machine without `libnccl` gets an error value, not a crash.

use crate::comm::ReduceOp;
use crate::error::{DistError, Result};
use cudarc::nccl::{result, sys};
use forma_core::{DType, Dtype, Shape, Tensor};
use forma_cuda::Cuda;
use std::ffi::c_void;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An NCCL communicator.
struct Comm {
    comm: sys::ncclComm_t,
    /// NCCL forbids concurrent calls on one communicator: every call holds it.
    lock: std::sync::Mutex<()>,
}

// SAFETY: an NCCL communicator may be used from any thread as long as the
// calls on it do not overlap, which `lock` ensures.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

impl Comm {
    /// Runs one NCCL call on the communicator, alone.
    fn call<R>(&self, f: impl FnOnce(sys::ncclComm_t) -> R) -> R {
        let _guard = self
            .lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(self.comm)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: the communicator was created by comm_init_rank and is
        // destroyed once.
        unsafe {
            let _ = result::comm_destroy(self.comm);
        }
    }
}

/// A group of processes, one CUDA device each, running NCCL collectives on
/// CUDA tensors: the CUDA counterpart of [`crate::ProcessGroup`], like
/// `torch.distributed` with `backend="nccl"`.
#[derive(Clone)]
pub struct NcclGroup {
    comm: Arc<Comm>,
    device: Cuda,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for NcclGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclGroup")
            .field("rank", &self.rank)
            .field("world_size", &self.size)
            .field("device", &self.device.name())
            .finish()
    }
}

fn nccl_err(
    collective: &'static str,
    rank: usize,
    world: usize,
    e: result::NcclError,
) -> DistError {
    DistError::Backend {
        collective,
        rank,
        world,
        backend: "nccl",
        code: e.0 as i32,
        message: format!("{:?}", e.0),
    }
}

fn datatype(collective: &'static str, dtype: DType) -> Result<sys::ncclDataType_t> {
    Ok(match dtype {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
        DType::U32 => sys::ncclDataType_t::ncclUint32,
        DType::Bool => sys::ncclDataType_t::ncclUint8,
    })
    .and_then(|t| {
        if dtype == DType::Bool && collective != "broadcast" && collective != "all_gather" {
            Err(DistError::invalid(
                collective,
                "bool tensors can only be broadcast or gathered",
            ))
        } else {
            Ok(t)
        }
    })
}

fn op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Mean => sys::ncclRedOp_t::ncclAvg,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
    }
}

/// NCCL's 128-byte unique id, as bytes.
fn id_bytes(id: &sys::ncclUniqueId) -> [u8; 128] {
    id.internal.map(|c| c as u8)
}

fn id_from(bytes: [u8; 128]) -> sys::ncclUniqueId {
    sys::ncclUniqueId {
        internal: bytes.map(|b| b as std::ffi::c_char),
    }
}

impl NcclGroup {
    /// Whether NCCL can be loaded here.
    pub fn is_available() -> bool {
        // SAFETY: only tries to dlopen the library.
        unsafe { sys::is_culib_present() }
    }

    /// A new NCCL id, made on one rank and given to the others (through MPI,
    /// a file, or [`NcclGroup::init_from_env`]'s TCP exchange).
    ///
    /// # Errors
    /// NCCL missing or failing.
    pub fn unique_id() -> Result<[u8; 128]> {
        if !Self::is_available() {
            return Err(DistError::invalid("nccl", "libnccl could not be loaded"));
        }
        result::get_uniqueid()
            .map(|id| id_bytes(&id))
            .map_err(|e| nccl_err("get_uniqueid", 0, 0, e))
    }

    /// Joins the group `id` names as `rank` of `world_size`, on `device`.
    /// Every rank calls it with the same id.
    ///
    /// # Errors
    /// NCCL missing, a rank out of range, NCCL failing to connect.
    pub fn new(device: &Cuda, rank: usize, world_size: usize, id: [u8; 128]) -> Result<Self> {
        if !Self::is_available() {
            return Err(DistError::invalid("nccl", "libnccl could not be loaded"));
        }
        if rank >= world_size {
            return Err(DistError::invalid(
                "nccl",
                format!("rank {rank} is not a rank of a group of {world_size}"),
            ));
        }
        device
            .stream()
            .context()
            .bind_to_thread()
            .map_err(|e| DistError::invalid("nccl", format!("{}: {e}", device.name())))?;
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: `comm` is written by NCCL on success.
        let comm = unsafe {
            result::comm_init_rank(
                comm.as_mut_ptr(),
                world_size as i32,
                id_from(id),
                rank as i32,
            )
            .map_err(|e| nccl_err("init", rank, world_size, e))?;
            comm.assume_init()
        };
        Ok(NcclGroup {
            comm: Arc::new(Comm {
                comm,
                lock: std::sync::Mutex::new(()),
            }),
            device: device.clone(),
            rank,
            size: world_size,
        })
    }

    /// Joins the group torchrun describes: `RANK`, `WORLD_SIZE`,
    /// `MASTER_ADDR`, `MASTER_PORT`. Rank 0 makes the NCCL id and serves it
    /// on `MASTER_ADDR:MASTER_PORT` to the other ranks, which connect (for
    /// up to `timeout`) and read it; the device is `cuda:LOCAL_RANK` (or
    /// `cuda:0`).
    ///
    /// # Errors
    /// A variable missing or malformed, the exchange failing or timing out,
    /// NCCL failing.
    pub fn init_from_env(timeout: Duration) -> Result<Self> {
        let var = |name: &'static str| {
            std::env::var(name)
                .map_err(|_| DistError::invalid("init_from_env", format!("{name} is not set (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")))
        };
        let num = |name: &'static str| -> Result<usize> {
            var(name)?
                .parse()
                .map_err(|_| DistError::invalid("init_from_env", format!("{name} is not a number")))
        };
        let (rank, world) = (num("RANK")?, num("WORLD_SIZE")?);
        let local = std::env::var("LOCAL_RANK")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let addr = format!("{}:{}", var("MASTER_ADDR")?, var("MASTER_PORT")?);
        let device =
            Cuda::new(local).map_err(|e| DistError::invalid("init_from_env", e.to_string()))?;
        let id = exchange_id(rank, world, &addr, timeout)?;
        Self::new(&device, rank, world, id)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes.
    pub fn world_size(&self) -> usize {
        self.size
    }

    /// The device this rank's collectives run on.
    pub fn device(&self) -> &Cuda {
        &self.device
    }

    /// The device pointer of a contiguous tensor's first element.
    fn ptr<S: Shape, E: Dtype>(
        &self,
        what: &'static str,
        t: &Tensor<S, E, Cuda>,
    ) -> Result<*mut c_void> {
        if !t.is_contiguous() {
            return Err(DistError::invalid(
                what,
                "the tensor must be contiguous (call .contiguous() first)",
            ));
        }
        if t.device() != &self.device {
            return Err(DistError::invalid(
                what,
                format!(
                    "the tensor is on {}, this rank's group on {}",
                    t.device().name(),
                    self.device.name()
                ),
            ));
        }
        let off = t.layout().offset;
        Ok(t.with_storage_mut(|s, _| s.ptr_at(off)) as *mut c_void)
    }

    fn stream(&self) -> sys::cudaStream_t {
        self.device.stream().cu_stream() as sys::cudaStream_t
    }

    /// Reduces `t` in place across the group (issued on the device stream),
    /// like `dist.all_reduce(t, op)` on NCCL.
    ///
    /// # Errors
    /// A non-contiguous tensor or one on another device, a bool tensor,
    /// NCCL failing.
    pub fn all_reduce<S: Shape, E: Dtype>(
        &self,
        t: &Tensor<S, E, Cuda>,
        reduce: ReduceOp,
    ) -> Result<()> {
        let dt = datatype("all_reduce", E::DTYPE)?;
        let p = self.ptr("all_reduce", t)?;
        // SAFETY: `p` addresses `numel` elements of a live storage that the
        // caller holds; the collective runs on the stream that orders every
        // later use of it.
        self.comm
            .call(|c| unsafe {
                result::all_reduce(p, p, t.numel(), dt, op(reduce), c, self.stream())
            })
            .map_err(|e| nccl_err("all_reduce", self.rank, self.size, e))?;
        Ok(())
    }

    /// Overwrites `t` with rank `root`'s, like `dist.broadcast(t, root)`.
    ///
    /// # Errors
    /// As [`NcclGroup::all_reduce`], or a root out of range.
    pub fn broadcast<S: Shape, E: Dtype>(&self, t: &Tensor<S, E, Cuda>, root: usize) -> Result<()> {
        if root >= self.size {
            return Err(DistError::invalid(
                "broadcast",
                format!("root {root} is not a rank of a group of {}", self.size),
            ));
        }
        let dt = datatype("broadcast", E::DTYPE)?;
        let p = self.ptr("broadcast", t)?;
        // SAFETY: as in all_reduce.
        self.comm
            .call(|c| unsafe {
                result::broadcast(p, p, t.numel(), dt, root as i32, c, self.stream())
            })
            .map_err(|e| nccl_err("broadcast", self.rank, self.size, e))?;
        Ok(())
    }

    /// Every rank's `t`, stacked along a new first axis in rank order, like
    /// `dist.all_gather_into_tensor`.
    ///
    /// # Errors
    /// As [`NcclGroup::all_reduce`].
    pub fn all_gather<S: Shape, E: Dtype>(
        &self,
        t: &Tensor<S, E, Cuda>,
    ) -> Result<Vec<Tensor<S, E, Cuda>>> {
        let dt = datatype("all_gather", E::DTYPE)?;
        let n = t.numel();
        let out = Tensor::<(forma_core::Dyn,), E, Cuda>::full_on(
            (forma_core::Dyn(n * self.size),),
            E::from_f64(0.0),
            &self.device,
        );
        let src = self.ptr("all_gather", t)?;
        let dst = self.ptr("all_gather", &out)?;
        // SAFETY: `out` holds `size` blocks of `n` elements.
        self.comm
            .call(|c| unsafe { result::all_gather(src, dst, n, dt, c, self.stream()) })
            .map_err(|e| nccl_err("all_gather", self.rank, self.size, e))?;
        (0..self.size)
            .map(|r| {
                let part = out.narrow::<0>(r * n, n).contiguous();
                Ok(part.try_reshape_to(t.shape())?)
            })
            .collect()
    }

    /// `op` over every rank's `input` (`world_size` blocks of equal size,
    /// one per rank, concatenated), of which this rank keeps block `rank`,
    /// like `dist.reduce_scatter_tensor`.
    ///
    /// # Errors
    /// As [`NcclGroup::all_reduce`], or an input that does not split into
    /// `world_size` blocks.
    pub fn reduce_scatter<E: Dtype>(
        &self,
        input: &Tensor<(forma_core::Dyn,), E, Cuda>,
        reduce: ReduceOp,
    ) -> Result<Tensor<(forma_core::Dyn,), E, Cuda>> {
        let dt = datatype("reduce_scatter", E::DTYPE)?;
        let total = input.numel();
        if !total.is_multiple_of(self.size) {
            return Err(DistError::invalid(
                "reduce_scatter",
                format!(
                    "{total} elements do not split into {} equal blocks",
                    self.size
                ),
            ));
        }
        let n = total / self.size;
        let out = Tensor::<(forma_core::Dyn,), E, Cuda>::full_on(
            (forma_core::Dyn(n),),
            E::from_f64(0.0),
            &self.device,
        );
        let src = self.ptr("reduce_scatter", input)?;
        let dst = self.ptr("reduce_scatter", &out)?;
        // SAFETY: `input` holds `size * n` elements, `out` `n`.
        self.comm
            .call(|c| unsafe {
                result::reduce_scatter(src, dst, n, dt, op(reduce), c, self.stream())
            })
            .map_err(|e| nccl_err("reduce_scatter", self.rank, self.size, e))?;
        Ok(out)
    }

    /// Waits until every rank has reached it and the device has finished
    /// what was issued before, like `dist.barrier()`.
    ///
    /// # Errors
    /// NCCL or the device failing.
    pub fn barrier(&self) -> Result<()> {
        let one =
            Tensor::<(forma_core::C<1>,), f32, Cuda>::full_on((forma_core::C,), 1.0, &self.device);
        self.all_reduce(&one, ReduceOp::Sum)?;
        self.device.synchronize()?;
        Ok(())
    }
}

/// Rank 0 makes the NCCL id and sends it to every other rank over TCP on
/// `addr`; the others connect (retrying until `timeout`) and read it.
fn exchange_id(rank: usize, world: usize, addr: &str, timeout: Duration) -> Result<[u8; 128]> {
    let io = |e: std::io::Error| {
        DistError::invalid(
            "init_from_env",
            format!("exchanging the NCCL id on {addr}: {e}"),
        )
    };
    if rank == 0 {
        let id = NcclGroup::unique_id()?;
        if world > 1 {
            let listener = TcpListener::bind(addr).map_err(io)?;
            listener.set_nonblocking(true).map_err(io)?;
            let start = Instant::now();
            let mut served = 0;
            while served < world - 1 {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false).map_err(io)?;
                        s.write_all(&id).map_err(io)?;
                        served += 1;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if start.elapsed() > timeout {
                            return Err(DistError::Timeout {
                                collective: "init_from_env (NCCL id exchange)",
                                rank,
                                world,
                                waited: start.elapsed(),
                            });
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => return Err(io(e)),
                }
            }
        }
        return Ok(id);
    }
    let start = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(mut s) => {
                s.set_read_timeout(Some(timeout)).map_err(io)?;
                let mut id = [0u8; 128];
                s.read_exact(&mut id).map_err(io)?;
                return Ok(id);
            }
            Err(_) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(io(e)),
        }
    }
}
