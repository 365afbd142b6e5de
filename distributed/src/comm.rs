//! The backend interface under [`crate::ProcessGroup`]: collectives on
//! contiguous buffers, implemented by the MPI backend and, for a single
//! process, by [`Local`].

use crate::error::Result;
use crate::wire::{BufMut, Wire};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

/// How `all_reduce` and `reduce_scatter` combine the ranks' values, like
/// `torch.distributed.ReduceOp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The mean: the sum divided by the group's size.
    Mean,
    /// The elementwise maximum.
    Max,
    /// The elementwise minimum.
    Min,
}

/// A collective started and not yet complete.
pub(crate) trait Pending: Send + Debug {
    /// Waits until it completes, at most `timeout`.
    fn wait(self: Box<Self>, timeout: Duration) -> Result<()>;

    /// Lets the library move it along without waiting (MPI progresses a
    /// non-blocking collective only inside its calls).
    fn progress(&mut self) -> Result<()> {
        Ok(())
    }
}

/// One communicator: a fixed set of processes that run collectives together.
/// Every method is a collective: every rank of the communicator calls it,
/// in the same order, with buffers of the same length.
pub(crate) trait Comm: Send + Sync + Debug {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    fn backend(&self) -> &'static str;
    /// `op` over every rank's `buf`, the result in every rank's `buf`
    /// (`Mean` is done by the caller as a sum).
    fn all_reduce(&self, buf: BufMut<'_>, op: ReduceOp, timeout: Duration) -> Result<()>;
    /// Rank `root`'s `buf` into every rank's `buf`.
    fn broadcast(&self, buf: BufMut<'_>, root: usize, timeout: Duration) -> Result<()>;
    /// Every rank's `send`, concatenated in rank order, into `recv`
    /// (`size()` times as long, same wire type).
    fn all_gather(&self, send: BufMut<'_>, recv: BufMut<'_>, timeout: Duration) -> Result<()>;
    /// `op` over every rank's `send`, of which this rank keeps block `rank`
    /// (`recv.len() * size() == send.len()`).
    fn reduce_scatter(
        &self,
        send: BufMut<'_>,
        recv: BufMut<'_>,
        op: ReduceOp,
        timeout: Duration,
    ) -> Result<()>;
    fn barrier(&self, timeout: Duration) -> Result<()>;
    /// A communicator of `ranks` (this group's ranks, in the new order);
    /// `None` on the ranks left out.
    fn split(&self, ranks: &[usize]) -> Result<Option<Arc<dyn Comm>>>;
    /// Starts an in-place sum of `len` elements of `wire` at `ptr`.
    ///
    /// # Safety
    /// `ptr` must stay valid for reads and writes of `len` elements, and
    /// untouched by anything else, until the returned request completes
    /// (or forever, if it never does).
    unsafe fn start_sum(&self, ptr: *mut u8, len: usize, wire: Wire) -> Result<Box<dyn Pending>>;
}

/// The group of one process: every collective is the identity. What
/// [`crate::ProcessGroup::single`] runs on, so a data-parallel script runs
/// unchanged (and its tests run) without a launcher.
#[derive(Debug)]
pub(crate) struct Local;

#[derive(Debug)]
struct Done;

impl Pending for Done {
    fn wait(self: Box<Self>, _: Duration) -> Result<()> {
        Ok(())
    }
}

fn copy(send: BufMut<'_>, recv: BufMut<'_>) {
    match (send, recv) {
        (BufMut::F32(s), BufMut::F32(r)) => r.copy_from_slice(s),
        (BufMut::F64(s), BufMut::F64(r)) => r.copy_from_slice(s),
        (BufMut::I64(s), BufMut::I64(r)) => r.copy_from_slice(s),
        (BufMut::U8(s), BufMut::U8(r)) => r.copy_from_slice(s),
        _ => unreachable!("the caller passes one wire type"),
    }
}

impl Comm for Local {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn backend(&self) -> &'static str {
        "local"
    }
    fn all_reduce(&self, _: BufMut<'_>, _: ReduceOp, _: Duration) -> Result<()> {
        Ok(())
    }
    fn broadcast(&self, _: BufMut<'_>, _: usize, _: Duration) -> Result<()> {
        Ok(())
    }
    fn all_gather(&self, send: BufMut<'_>, recv: BufMut<'_>, _: Duration) -> Result<()> {
        copy(send, recv);
        Ok(())
    }
    fn reduce_scatter(
        &self,
        send: BufMut<'_>,
        recv: BufMut<'_>,
        _: ReduceOp,
        _: Duration,
    ) -> Result<()> {
        copy(send, recv);
        Ok(())
    }
    fn barrier(&self, _: Duration) -> Result<()> {
        Ok(())
    }
    fn split(&self, ranks: &[usize]) -> Result<Option<Arc<dyn Comm>>> {
        Ok(ranks.contains(&0).then(|| Arc::new(Local) as Arc<dyn Comm>))
    }
    unsafe fn start_sum(&self, _: *mut u8, _: usize, _: Wire) -> Result<Box<dyn Pending>> {
        Ok(Box::new(Done))
    }
}
