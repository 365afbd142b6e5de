//! Data-parallel training for Forma, like `torch.distributed` and
//! `DistributedDataParallel`.
//!
//! - [`ProcessGroup`]: the processes of a job; `all_reduce` (sum, mean,
//!   max, min), `broadcast`, `all_gather`, `reduce_scatter`, `barrier` on
//!   CPU tensors of any float dtype, in place; sub-groups
//!   ([`ProcessGroup::new_group`]); a timeout on every collective.
//! - [`DistributedDataParallel`]: wraps any [`forma_nn::Module`]; replicas
//!   start from rank 0's weights and get averaged gradients, reduced in
//!   buckets while backward runs.
//! - [`EvenBatches`]: keeps the ranks' loops in step, or names the ranks that
//!   ran out of data. Give each rank its share of the data with
//!   [`forma_nn::data::DistributedSampler`].
//! - [`save_on_rank0`]: one checkpoint per job, written atomically by rank 0.
//!
//! CPU tensors travel over MPI (feature `mpi`: OpenMPI or MPICH through the
//! `mpi` crate; launch with `mpirun -np N program`). [`init`] picks MPI when
//! the program runs under a launcher and otherwise returns the
//! single-process group, so the same program runs alone, unchanged. CUDA
//! tensors have NCCL's collectives in `NcclGroup` (feature `nccl`, joined
//! from torchrun's environment with `NcclGroup::init_from_env`), and CUDA
//! models `NcclDistributedDataParallel`.
//!
//! ```no_run
//! use forma::prelude::*;
//! use forma_distributed::DistributedDataParallel;
//! use forma::nn::layers::Linear;
//!
//! let world = forma_distributed::init()?;
//! let net = DistributedDataParallel::new(Linear::<4, 2>::new(&Cpu, &mut Rng::seed_from(0)), &world)?;
//! println!("rank {} of {}", world.rank(), world.world_size());
//! # Ok::<(), forma_distributed::DistError>(())
//! ```

mod checkpoint;
mod comm;
mod ddp;
mod error;
mod group;
mod join;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
#[cfg(feature = "nccl")]
mod nccl_ddp;
mod wire;

pub use checkpoint::save_on_rank0;
pub use comm::ReduceOp;
pub use ddp::{strip_module_prefix, DdpOptions, DistributedDataParallel, NoSync};
pub use error::{DistError, Result};
pub use group::{ProcessGroup, DEFAULT_TIMEOUT};
pub use join::EvenBatches;
#[cfg(feature = "nccl")]
pub use nccl::NcclGroup;
#[cfg(feature = "nccl")]
pub use nccl_ddp::{NcclDistributedDataParallel, NcclNoSync};

/// Whether this process was started by an MPI launcher (`mpirun`,
/// `mpiexec`, `srun` with PMI/PMIx): the variables they set.
pub fn launched_by_mpi() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// The job's group of every process: MPI's world when the program runs
/// under an MPI launcher, else this process alone
/// ([`ProcessGroup::single`]). Calling it again while a group lives returns
/// the same world. Keep the group (or a clone) while the program
/// communicates: MPI is finalised when the last clone of the world group
/// and of every group made from it is dropped, and cannot start again.
///
/// # Errors
/// Under a launcher, in a build without the `mpi` feature; MPI failing to
/// start.
pub fn init() -> Result<ProcessGroup> {
    if launched_by_mpi() {
        init_mpi()
    } else {
        Ok(ProcessGroup::single())
    }
}

/// MPI's world group, whether or not a launcher started the program (alone,
/// MPI makes a world of one).
///
/// # Errors
/// A build without the `mpi` feature; MPI failing to start, or finalised
/// earlier in this process.
pub fn init_mpi() -> Result<ProcessGroup> {
    #[cfg(feature = "mpi")]
    {
        let m = mpi::Mpi::init()?;
        Ok(ProcessGroup::from_comm(m.world()))
    }
    #[cfg(not(feature = "mpi"))]
    {
        Err(DistError::invalid(
            "init_mpi",
            "this build has no MPI backend: enable forma-distributed's `mpi` feature",
        ))
    }
}
