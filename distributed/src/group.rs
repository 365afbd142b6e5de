//! [`ProcessGroup`]: the processes of a job and the collectives they run on
//! tensors, like `torch.distributed`'s process groups.

use crate::comm::{Comm, Local, ReduceOp};
use crate::error::{DistError, Result};
use crate::wire::{bytes_mut, native_mut, BufMut};
use forma_core::{DType, Dtype, Shape, Tensor};
use forma_cpu::Cpu;
use std::sync::Arc;
use std::time::Duration;

/// PyTorch's default collective timeout (`timeout=timedelta(minutes=30)`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// A set of processes that run collectives together: the whole job
/// ([`crate::init`]) or a sub-group ([`ProcessGroup::new_group`]).
///
/// Every collective is called by every rank of the group, in the same
/// order; on CPU tensors it works in place on the tensor's storage (no copy
/// for a contiguous `f32`, `f64` or `i64` tensor; `f16`/`bf16` are reduced in
/// `f32`). By default each collective first checks that every rank passed
/// the same sizes and dtype ([`ProcessGroup::check_sizes`]), so a mismatch
/// is an error naming each rank's sizes rather than garbage or a hang; a
/// rank that never joins is a [`DistError::Timeout`] after
/// [`ProcessGroup::timeout`].
#[derive(Clone, Debug)]
pub struct ProcessGroup {
    comm: Arc<dyn Comm>,
    timeout: Duration,
    check_sizes: bool,
}

/// What a rank passed to a collective, compared across ranks.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Call {
    collective: i64,
    numel: i64,
    dtype: i64,
    root: i64,
}

impl ProcessGroup {
    pub(crate) fn from_comm(comm: Arc<dyn Comm>) -> Self {
        ProcessGroup {
            comm,
            timeout: DEFAULT_TIMEOUT,
            check_sizes: true,
        }
    }

    /// The group of this process alone (rank 0 of 1): every collective is
    /// the identity, so a data-parallel program runs unchanged without a
    /// launcher.
    pub fn single() -> Self {
        Self::from_comm(Arc::new(Local))
    }

    /// This process's rank in the group, like `dist.get_rank(group)`.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of processes, like `dist.get_world_size(group)`.
    pub fn world_size(&self) -> usize {
        self.comm.size()
    }

    /// `mpi`, `nccl` or `local`.
    pub fn backend(&self) -> &'static str {
        self.comm.backend()
    }

    /// The longest a collective waits for the other ranks.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// This group with another timeout (every rank should use the same).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether collectives compare the ranks' sizes first (default `true`;
    /// it costs one small all-gather per call).
    pub fn check_sizes(mut self, check: bool) -> Self {
        self.check_sizes = check;
        self
    }

    pub(crate) fn comm(&self) -> &Arc<dyn Comm> {
        &self.comm
    }

    /// A group of `ranks` (ranks of this group; their order gives the new
    /// ranks), like `dist.new_group(ranks)`. Every rank of this group calls
    /// it; the ranks left out get `None`.
    ///
    /// # Errors
    /// A rank out of range or named twice, or a backend failure.
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<ProcessGroup>> {
        let n = self.world_size();
        for (i, &r) in ranks.iter().enumerate() {
            if r >= n || ranks[..i].contains(&r) {
                return Err(DistError::invalid(
                    "new_group",
                    format!("ranks {ranks:?} must be distinct ranks of a group of {n}"),
                ));
            }
        }
        Ok(self.comm.split(ranks)?.map(|comm| ProcessGroup {
            comm,
            timeout: self.timeout,
            check_sizes: self.check_sizes,
        }))
    }

    /// Waits until every rank has called it, like `dist.barrier()`.
    ///
    /// # Errors
    /// A timeout or a backend failure.
    pub fn barrier(&self) -> Result<()> {
        self.comm.barrier(self.timeout)
    }

    /// Compares what every rank passed to `collective`.
    fn check(
        &self,
        collective: &'static str,
        id: i64,
        numel: usize,
        dtype: DType,
        root: usize,
    ) -> Result<()> {
        if !self.check_sizes || self.world_size() == 1 {
            return Ok(());
        }
        let mine = Call {
            collective: id,
            numel: numel as i64,
            dtype: dtype as i64,
            root: root as i64,
        };
        let mut send = [mine.collective, mine.numel, mine.dtype, mine.root];
        let mut all = vec![0i64; 4 * self.world_size()];
        self.comm
            .all_gather(BufMut::I64(&mut send), BufMut::I64(&mut all), self.timeout)?;
        let calls: Vec<Call> = all
            .chunks(4)
            .map(|c| Call {
                collective: c[0],
                numel: c[1],
                dtype: c[2],
                root: c[3],
            })
            .collect();
        if calls.iter().all(|c| *c == mine) {
            return Ok(());
        }
        let name = |id: i64| match id {
            0 => "all_reduce",
            1 => "broadcast",
            2 => "all_gather",
            3 => "reduce_scatter",
            _ => "another collective",
        };
        let dtypes = [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I64,
            DType::U32,
            DType::Bool,
        ];
        let per_rank = calls
            .iter()
            .map(|c| {
                let dtype = dtypes
                    .iter()
                    .find(|d| **d as i64 == c.dtype)
                    .map_or("?", |d| d.torch_name());
                let mut s = format!("{} of {} {dtype} elements", name(c.collective), c.numel);
                if c.collective == 1 {
                    s += &format!(" from root {}", c.root);
                }
                s
            })
            .collect();
        Err(DistError::Mismatch {
            collective,
            per_rank,
        })
    }

    /// Reduces `t` across the group in place: afterwards every rank holds
    /// the sum (or mean, max, min) of every rank's `t`, like
    /// `dist.all_reduce(t, op)`.
    ///
    /// # Errors
    /// Sizes or dtypes that differ between ranks, `Mean` on an integer
    /// tensor, a dtype the backend cannot reduce (`u32`, `bool`), a timeout.
    pub fn all_reduce<S: Shape, E: Dtype>(
        &self,
        t: &Tensor<S, E, Cpu>,
        op: ReduceOp,
    ) -> Result<()> {
        if op == ReduceOp::Mean && !E::DTYPE.is_float() {
            return Err(DistError::invalid(
                "all_reduce",
                format!(
                    "ReduceOp::Mean needs a float tensor, not {}",
                    E::DTYPE.torch_name()
                ),
            ));
        }
        if !(E::DTYPE.is_float() || E::DTYPE == DType::I64) {
            return Err(DistError::invalid(
                "all_reduce",
                format!(
                    "{} tensors cannot be reduced (float or int64 only)",
                    E::DTYPE.torch_name()
                ),
            ));
        }
        self.check("all_reduce", 0, t.numel(), E::DTYPE, 0)?;
        let world = self.world_size() as f64;
        self.in_place(t, |values| {
            match native_mut(values) {
                Some(buf) => {
                    self.comm.all_reduce(buf, op, self.timeout)?;
                    if op == ReduceOp::Mean {
                        mean_in_place(values, world);
                    }
                }
                None => {
                    // f16/bf16: widened to f32, reduced, rounded once.
                    let mut wide: Vec<f32> = values.iter().map(|v| v.to_f64() as f32).collect();
                    self.comm
                        .all_reduce(BufMut::F32(&mut wide), op, self.timeout)?;
                    let scale = if op == ReduceOp::Mean { world } else { 1.0 };
                    for (v, w) in values.iter_mut().zip(wide) {
                        *v = E::from_f64(w as f64 / scale);
                    }
                }
            }
            Ok(())
        })
    }

    /// Overwrites `t` on every rank with rank `root`'s `t`, like
    /// `dist.broadcast(t, src=root)`. Any dtype.
    ///
    /// # Errors
    /// `root` out of range, sizes that differ between ranks, a timeout.
    pub fn broadcast<S: Shape, E: Dtype>(&self, t: &Tensor<S, E, Cpu>, root: usize) -> Result<()> {
        if root >= self.world_size() {
            return Err(DistError::invalid(
                "broadcast",
                format!(
                    "root {root} is not a rank of a group of {}",
                    self.world_size()
                ),
            ));
        }
        self.check("broadcast", 1, t.numel(), E::DTYPE, root)?;
        self.in_place(t, |values| {
            self.comm
                .broadcast(BufMut::U8(bytes_mut(values)), root, self.timeout)
        })
    }

    /// Every rank's `t`, in rank order, like `dist.all_gather(list, t)`.
    /// Any dtype.
    ///
    /// # Errors
    /// Sizes that differ between ranks, a timeout.
    pub fn all_gather<S: Shape, E: Dtype>(
        &self,
        t: &Tensor<S, E, Cpu>,
    ) -> Result<Vec<Tensor<S, E, Cpu>>> {
        self.check("all_gather", 2, t.numel(), E::DTYPE, 0)?;
        let mut send = t.try_to_vec()?;
        let n = send.len();
        let mut all: Vec<E> = send.repeat(self.world_size());
        self.comm.all_gather(
            BufMut::U8(bytes_mut(&mut send)),
            BufMut::U8(bytes_mut(&mut all)),
            self.timeout,
        )?;
        all.chunks(n.max(1))
            .take(self.world_size())
            .map(|c| Ok(Tensor::from_vec_on(c[..n].to_vec(), t.shape(), &Cpu)?))
            .collect()
    }

    /// Reduces `inputs[r]` over the ranks into rank `r`'s result, like
    /// `dist.reduce_scatter(out, inputs, op)`: each rank passes one tensor
    /// per rank (all of one size) and gets its block of the reduction.
    ///
    /// # Errors
    /// Not one input per rank, inputs of different sizes, a dtype that
    /// cannot be reduced, a timeout.
    pub fn reduce_scatter<S: Shape, E: Dtype>(
        &self,
        inputs: &[Tensor<S, E, Cpu>],
        op: ReduceOp,
    ) -> Result<Tensor<S, E, Cpu>> {
        let world = self.world_size();
        if inputs.len() != world {
            return Err(DistError::invalid(
                "reduce_scatter",
                format!(
                    "{} inputs for a group of {world}: pass one per rank",
                    inputs.len()
                ),
            ));
        }
        let dims = inputs[0].dims();
        if let Some(bad) = inputs.iter().find(|t| t.dims() != dims) {
            return Err(DistError::invalid(
                "reduce_scatter",
                format!(
                    "inputs of sizes {:?} and {:?}: they must all have one size",
                    &dims[..],
                    &bad.dims()[..]
                ),
            ));
        }
        if !(E::DTYPE.is_float() || (E::DTYPE == DType::I64 && op != ReduceOp::Mean)) {
            return Err(DistError::invalid(
                "reduce_scatter",
                format!(
                    "{} tensors cannot be reduced with {op:?}",
                    E::DTYPE.torch_name()
                ),
            ));
        }
        let n = inputs[0].numel();
        self.check("reduce_scatter", 3, n, E::DTYPE, 0)?;
        let mut send: Vec<E> = Vec::with_capacity(n * world);
        for t in inputs {
            send.extend(t.try_to_vec()?);
        }
        let mut out: Vec<E> = send[..n].to_vec();
        match (native_mut(&mut send), native_mut(&mut out)) {
            (Some(s), Some(r)) => self.comm.reduce_scatter(s, r, op, self.timeout)?,
            _ => {
                let mut wide: Vec<f32> = send.iter().map(|v| v.to_f64() as f32).collect();
                let mut w_out = vec![0f32; n];
                self.comm.reduce_scatter(
                    BufMut::F32(&mut wide),
                    BufMut::F32(&mut w_out),
                    op,
                    self.timeout,
                )?;
                for (o, w) in out.iter_mut().zip(w_out) {
                    *o = E::from_f64(w as f64);
                }
            }
        }
        if op == ReduceOp::Mean {
            mean_in_place(&mut out, world as f64);
        }
        Ok(Tensor::from_vec_on(out, inputs[0].shape(), &Cpu)?)
    }

    /// Runs `f` on the values of `t`, in place when `t` is contiguous, else
    /// on a contiguous copy written back afterwards.
    fn in_place<S: Shape, E: Dtype>(
        &self,
        t: &Tensor<S, E, Cpu>,
        f: impl FnOnce(&mut [E]) -> Result<()>,
    ) -> Result<()> {
        if t.is_contiguous() {
            let n = t.numel();
            t.with_storage_mut(|storage, layout| f(&mut storage[layout.offset..layout.offset + n]))
        } else {
            let c = t.contiguous();
            let c = Tensor::<S, E, Cpu>::from_vec_on(c.try_to_vec()?, t.shape(), &Cpu)?;
            let n = c.numel();
            c.with_storage_mut(|storage, _| f(&mut storage[..n]))?;
            t.try_assign(&c)?;
            Ok(())
        }
    }
}

/// Divides every value by `n`.
pub(crate) fn mean_in_place<E: Dtype>(values: &mut [E], n: f64) {
    match native_mut(values) {
        Some(BufMut::F32(v)) => v.iter_mut().for_each(|x| *x /= n as f32),
        Some(BufMut::F64(v)) => v.iter_mut().for_each(|x| *x /= n),
        _ => values
            .iter_mut()
            .for_each(|x| *x = E::from_f64(x.to_f64() / n)),
    }
}
