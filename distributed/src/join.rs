//! Uneven inputs: [`EvenBatches`] stops every rank together, or reports the
//! ranks that ran out.

use crate::error::{DistError, Result};
use crate::group::ProcessGroup;
use crate::wire::BufMut;

/// An iterator over one rank's batches that keeps the ranks in step: before
/// each batch the ranks tell each other whether they have one (one small
/// all-gather). When all do, the batch comes out; when none do, the
/// iterator ends on every rank; when some do and some do not, it yields one
/// [`DistError::UnevenInputs`] naming the ranks that ran out, and ends.
/// Without it, a rank that runs out leaves the others waiting in their next
/// gradient reduction until the timeout.
///
/// ```
/// use forma_distributed::{EvenBatches, ProcessGroup};
///
/// let world = ProcessGroup::single();
/// let steps: Vec<_> = EvenBatches::new(&world, 0..3).collect::<Result<_, _>>()?;
/// assert_eq!(steps, [0, 1, 2]);
/// # Ok::<(), forma_distributed::DistError>(())
/// ```
#[derive(Debug)]
pub struct EvenBatches<'g, I> {
    group: &'g ProcessGroup,
    inner: I,
    step: u64,
    done: bool,
}

impl<'g, I: Iterator> EvenBatches<'g, I> {
    /// Wraps this rank's batches.
    pub fn new(group: &'g ProcessGroup, inner: I) -> Self {
        EvenBatches {
            group,
            inner,
            step: 0,
            done: false,
        }
    }

    fn agree(&self, have: bool) -> Result<Vec<bool>> {
        let world = self.group.world_size();
        let mut mine = [u8::from(have)];
        let mut all = vec![0u8; world];
        self.group.comm().all_gather(
            BufMut::U8(&mut mine),
            BufMut::U8(&mut all),
            self.group.timeout(),
        )?;
        Ok(all.into_iter().map(|b| b != 0).collect())
    }
}

impl<I: Iterator> Iterator for EvenBatches<'_, I> {
    type Item = Result<I::Item>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.inner.next();
        let all = match self.agree(item.is_some()) {
            Ok(all) => all,
            Err(e) => {
                self.done = true;
                return Some(Err(e));
            }
        };
        let step = self.step;
        self.step += 1;
        if all.iter().all(|&h| h) {
            return item.map(Ok);
        }
        self.done = true;
        if all.iter().all(|&h| !h) {
            return None;
        }
        let (still, ran_out): (Vec<usize>, Vec<usize>) = (0..all.len()).partition(|&r| all[r]);
        Some(Err(DistError::UnevenInputs {
            step,
            ran_out,
            still,
        }))
    }
}
