//! [`DataLoader`]: batches from a [`Dataset`], in a seeded shuffled order,
//! optionally loaded by worker threads, with a position that a checkpoint can
//! save and restore.
//!
//! An epoch is an index permutation (or `0..len` without shuffling) cut into
//! batches; items are fetched per batch, so nothing is copied per epoch but
//! the permutation itself. Epoch `e`'s permutation depends only on the seed
//! and `e`, which is what makes a resumed run bit-identical: the loader's
//! whole position is two numbers ([`LoaderState`]).

use super::collate::{Collate, DefaultCollate};
use super::dataset::{permutation, Dataset};
use super::{DataError, DistributedSampler};
use forma_core::Rng;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Where a [`DataLoader`] is: the epoch it is in and the next batch it will
/// yield. Plain numbers, for checkpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LoaderState {
    /// The current epoch, counting from 0.
    pub epoch: u64,
    /// The index of the next batch of that epoch.
    pub batch: usize,
}

/// Batches a [`Dataset`], like `torch.utils.data.DataLoader`.
///
/// - `batch_size` items per batch; the last batch is smaller unless
///   [`drop_last`](DataLoader::drop_last) drops it.
/// - [`shuffle`](DataLoader::shuffle)`(seed)`: each epoch visits the items in
///   a different random order, drawn from the seed and the epoch number, so
///   the same seed replays the same orders (they are not PyTorch's orders: the
///   generators differ).
/// - [`num_workers`](DataLoader::num_workers)`(n)`: `n` threads fetch and
///   collate batches ahead of time; batches still come out in order, exactly
///   as with `n = 0` (loading on the calling thread).
/// - [`collate`](DataLoader::collate): how items become a batch, by default
///   [`DefaultCollate`] (stacks tensors, numbers and tuples of them).
///
/// [`iter`](DataLoader::iter) yields the rest of the current epoch and moves
/// the loader's position as it goes; once an epoch's last batch is out, the
/// position is the next epoch's start. [`state`](DataLoader::state) /
/// [`set_state`](DataLoader::set_state) save and restore the position, so
/// an interrupted run resumes with the very batches it would have seen.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::data::{DataLoader, LoaderState, TensorDataset};
///
/// // Ten examples of two features, labelled 0..10.
/// let x = Tensor::<(Dyn, C<2>)>::from_vec((0..20).map(|v| v as f32).collect(), (Dyn(10), C))?;
/// let y = Tensor::<(Dyn,), i64>::from_vec((0..10).collect(), (Dyn(10),))?;
/// let data = TensorDataset::new(&x, &y)?;
///
/// let mut loader = DataLoader::new(data, 4)?.shuffle(7).drop_last(true).num_workers(2);
/// assert_eq!(loader.len(), 2); // 10 items, batches of 4, the last 2 dropped
///
/// let mut seen = Vec::new();
/// for batch in loader.iter() {
///     let (xb, yb): (Tensor<(Dyn, C<2>)>, Tensor<(Dyn,), i64>) = batch?;
///     assert_eq!(xb.dims()[..], [4, 2]);
///     // Row i of a batch is example yb[i]: features 2 * label and 2 * label + 1.
///     for (row, label) in xb.to_vec().chunks(2).zip(yb.to_vec()) {
///         assert_eq!(row, [2.0 * label as f32, 2.0 * label as f32 + 1.0]);
///         seen.push(label);
///     }
/// }
/// seen.sort();
/// seen.dedup();
/// assert_eq!(seen.len(), 8); // no example twice in an epoch
/// assert_eq!(loader.state(), LoaderState { epoch: 1, batch: 0 });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DataLoader<D: Dataset, C = DefaultCollate> {
    dataset: Arc<D>,
    collate: Arc<C>,
    batch_size: usize,
    seed: Option<u64>,
    sampler: Option<DistributedSampler>,
    drop_last: bool,
    num_workers: usize,
    prefetch_factor: usize,
    state: LoaderState,
}

impl<D: Dataset, C> std::fmt::Debug for DataLoader<D, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataLoader")
            .field("items", &self.dataset.len())
            .field("batch_size", &self.batch_size)
            .field("shuffle_seed", &self.seed)
            .field("sampler", &self.sampler)
            .field("drop_last", &self.drop_last)
            .field("num_workers", &self.num_workers)
            .field("prefetch_factor", &self.prefetch_factor)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<D: Dataset> DataLoader<D, DefaultCollate> {
    /// A loader of `batch_size` items per batch, in order, loading on the
    /// calling thread, collated by [`DefaultCollate`].
    ///
    /// # Errors
    /// [`DataError::Invalid`] for a batch size of 0.
    pub fn new(dataset: D, batch_size: usize) -> Result<Self, DataError> {
        if batch_size == 0 {
            return Err(DataError::invalid(
                "DataLoader",
                "batch_size must be at least 1",
            ));
        }
        Ok(DataLoader {
            dataset: Arc::new(dataset),
            collate: Arc::new(DefaultCollate),
            batch_size,
            seed: None,
            sampler: None,
            drop_last: false,
            num_workers: 0,
            prefetch_factor: 2,
            state: LoaderState::default(),
        })
    }
}

impl<D: Dataset, C> DataLoader<D, C> {
    /// Shuffles every epoch, the orders drawn from `seed`.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Whether to drop the last batch of an epoch when it is smaller than
    /// `batch_size` (default `false`).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Loads batches on `n` worker threads (default 0: on the calling
    /// thread). The batches and their order do not depend on `n`.
    pub fn num_workers(mut self, n: usize) -> Self {
        self.num_workers = n;
        self
    }

    /// How many batches each worker may load ahead (default 2, like
    /// PyTorch's; at least 1).
    pub fn prefetch_factor(mut self, n: usize) -> Self {
        self.prefetch_factor = n.max(1);
        self
    }

    /// The same loader with another way to make batches: a
    /// [`Collate`] value or a `Fn(Vec<Item>) -> Result<Batch, DataError>`.
    pub fn collate<C2: Collate<D::Item>>(self, collate: C2) -> DataLoader<D, C2> {
        DataLoader {
            dataset: self.dataset,
            collate: Arc::new(collate),
            batch_size: self.batch_size,
            seed: self.seed,
            sampler: self.sampler,
            drop_last: self.drop_last,
            num_workers: self.num_workers,
            prefetch_factor: self.prefetch_factor,
            state: self.state,
        }
    }

    /// Draws each epoch's indices from `sampler` (this process's share of
    /// a data-parallel job) instead of the whole dataset, like
    /// `DataLoader(dataset, sampler=DistributedSampler(...))`. The sampler
    /// decides the order (its own shuffle and seed; the loader's
    /// [`shuffle`](DataLoader::shuffle) no longer applies) and is told the
    /// loader's epoch, as `sampler.set_epoch(epoch)` would.
    pub fn sampler(mut self, sampler: DistributedSampler) -> Self {
        self.sampler = Some(sampler);
        self
    }

    /// Batches per epoch.
    pub fn len(&self) -> usize {
        let n = self.samples_per_epoch();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// Items per epoch: the dataset's, or the sampler's share of it.
    fn samples_per_epoch(&self) -> usize {
        let n = self.dataset.len();
        self.sampler.map_or(n, |s| s.num_samples(n))
    }

    /// Whether an epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Items per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The dataset.
    pub fn dataset(&self) -> &D {
        &self.dataset
    }

    /// The position: the current epoch and the next batch to come.
    pub fn state(&self) -> LoaderState {
        self.state
    }

    /// Moves to a position saved by [`DataLoader::state`]; the next
    /// [`DataLoader::iter`] starts there.
    ///
    /// # Errors
    /// [`DataError::BadState`] when `state.batch` is not a batch of an epoch
    /// (it must be below [`DataLoader::len`], or 0 for an empty loader).
    pub fn set_state(&mut self, state: LoaderState) -> Result<(), DataError> {
        let len = self.len();
        if state.batch >= len && state.batch != 0 {
            return Err(DataError::BadState {
                batch: state.batch,
                len,
            });
        }
        self.state = state;
        Ok(())
    }

    /// The order in which epoch `epoch` visits the dataset's indices (before
    /// cutting into batches and dropping the last one).
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let n = self.dataset.len();
        if let Some(sampler) = &self.sampler {
            return sampler.indices(n, epoch);
        }
        match self.seed {
            Some(seed) => permutation(n, &mut epoch_rng(seed, epoch)),
            None => (0..n).collect(),
        }
    }
}

impl<D, C> DataLoader<D, C>
where
    D: Dataset + 'static,
    C: Collate<D::Item> + 'static,
    C::Batch: Send + 'static,
{
    /// The remaining batches of the current epoch, from [`DataLoader::state`]
    /// on. Each batch yielded moves the loader's position; after the last
    /// one it is the next epoch's start, so a `for` loop over `iter()` per
    /// epoch walks through epochs 0, 1, 2, ... (an epoch with no batches is
    /// counted as soon as it starts). Dropping the iterator early keeps the
    /// position of the last batch yielded; batches that workers had loaded
    /// ahead are discarded.
    ///
    /// A batch whose loading failed is yielded as its error and counts as
    /// consumed.
    pub fn iter(&mut self) -> Batches<'_, D, C> {
        let len = self.len();
        let epoch = self.state.epoch;
        let start = self.state.batch.min(len);
        if len == 0 {
            self.state = LoaderState {
                epoch: epoch + 1,
                batch: 0,
            };
        }
        let plan = Arc::new(Plan {
            order: self.indices(epoch),
            batch_size: self.batch_size,
        });
        let source = if self.num_workers > 0 && start < len {
            Pool::spawn(
                &self.dataset,
                &self.collate,
                &plan,
                start,
                len,
                self.num_workers,
                self.num_workers * self.prefetch_factor,
            )
        } else {
            None
        };
        let source = match source {
            Some(pool) => Source::Pool(pool),
            None => Source::Inline {
                dataset: Arc::clone(&self.dataset),
                collate: Arc::clone(&self.collate),
            },
        };
        Batches {
            state: &mut self.state,
            epoch,
            next: start,
            len,
            plan,
            source,
        }
    }
}

impl<'a, D, C> IntoIterator for &'a mut DataLoader<D, C>
where
    D: Dataset + 'static,
    C: Collate<D::Item> + 'static,
    C::Batch: Send + 'static,
{
    type Item = Result<C::Batch, DataError>;
    type IntoIter = Batches<'a, D, C>;
    fn into_iter(self) -> Batches<'a, D, C> {
        self.iter()
    }
}

/// The generator of epoch `epoch`'s order: a function of the seed and the
/// epoch alone, so any epoch can be replayed without replaying the ones
/// before it.
pub(crate) fn epoch_rng(seed: u64, epoch: u64) -> Rng {
    let base = Rng::seed_from(seed).next_u64();
    // Multiplying by an odd constant is a bijection, so distinct epochs give
    // distinct seeds.
    Rng::seed_from(base ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// One epoch's order, cut into batches.
struct Plan {
    order: Vec<usize>,
    batch_size: usize,
}

impl Plan {
    fn batch(&self, b: usize) -> &[usize] {
        let start = b * self.batch_size;
        let end = (start + self.batch_size).min(self.order.len());
        &self.order[start..end]
    }
}

fn load_batch<D: Dataset, C: Collate<D::Item>>(
    dataset: &D,
    collate: &C,
    indices: &[usize],
) -> Result<C::Batch, DataError> {
    let items = indices
        .iter()
        .map(|&i| dataset.get(i))
        .collect::<Result<Vec<_>, _>>()?;
    collate.collate(items)
}

/// The remaining batches of one epoch of a [`DataLoader`]; see
/// [`DataLoader::iter`].
pub struct Batches<'a, D: Dataset, C: Collate<D::Item>> {
    state: &'a mut LoaderState,
    epoch: u64,
    next: usize,
    len: usize,
    plan: Arc<Plan>,
    source: Source<D, C>,
}

impl<D: Dataset, C: Collate<D::Item>> std::fmt::Debug for Batches<'_, D, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batches")
            .field("epoch", &self.epoch)
            .field("next", &self.next)
            .field("len", &self.len)
            .field(
                "workers",
                &match &self.source {
                    Source::Inline { .. } => 0,
                    Source::Pool(p) => p.workers.len(),
                },
            )
            .finish_non_exhaustive()
    }
}

impl<D: Dataset, C: Collate<D::Item>> Batches<'_, D, C> {
    /// The loader's position after the batches yielded so far (what to save
    /// in a checkpoint taken inside the loop).
    pub fn state(&self) -> LoaderState {
        *self.state
    }
}

impl<D: Dataset, C: Collate<D::Item>> Iterator for Batches<'_, D, C> {
    type Item = Result<C::Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.len {
            return None;
        }
        let b = self.next;
        let batch = match &mut self.source {
            Source::Inline { dataset, collate } => {
                load_batch(&**dataset, &**collate, self.plan.batch(b))
            }
            Source::Pool(pool) => pool.get(b),
        };
        self.next += 1;
        *self.state = if self.next == self.len {
            LoaderState {
                epoch: self.epoch + 1,
                batch: 0,
            }
        } else {
            LoaderState {
                epoch: self.epoch,
                batch: self.next,
            }
        };
        Some(batch)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.len - self.next;
        (n, Some(n))
    }
}

impl<D: Dataset, C: Collate<D::Item>> ExactSizeIterator for Batches<'_, D, C> {}

enum Source<D: Dataset, C: Collate<D::Item>> {
    Inline { dataset: Arc<D>, collate: Arc<C> },
    Pool(Pool<C::Batch>),
}

/// Worker threads loading batches by index. Workers take batch indices from
/// one shared queue and send back `(index, result)`; finished batches wait
/// in `ready` until their turn, so the output order never depends on which
/// worker is faster. At most `window` batches are queued or waiting.
struct Pool<B> {
    tasks: Option<Sender<usize>>,
    results: Receiver<(usize, Result<B, DataError>)>,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<()>>,
    ready: HashMap<usize, Result<B, DataError>>,
    dispatched: usize,
    end: usize,
    window: usize,
}

impl<B: Send + 'static> Pool<B> {
    /// Starts `n` workers for batches `start..end`; `None` when no thread
    /// could be started (the caller then loads on its own thread).
    fn spawn<D, C>(
        dataset: &Arc<D>,
        collate: &Arc<C>,
        plan: &Arc<Plan>,
        start: usize,
        end: usize,
        n: usize,
        window: usize,
    ) -> Option<Self>
    where
        D: Dataset + 'static,
        C: Collate<D::Item, Batch = B> + 'static,
    {
        let (task_tx, task_rx) = channel::<usize>();
        let task_rx = Arc::new(Mutex::new(task_rx));
        let (result_tx, results) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let (dataset, collate, plan) = (dataset.clone(), collate.clone(), plan.clone());
            let (task_rx, result_tx, stop) = (task_rx.clone(), result_tx.clone(), stop.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("forma-data-{i}"))
                .spawn(move || loop {
                    // Holding the lock while waiting is fine: the other idle
                    // workers would only wait on the queue instead.
                    let task = task_rx
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .recv();
                    let Ok(b) = task else { break };
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let result = catch_unwind(AssertUnwindSafe(|| {
                        load_batch(&*dataset, &*collate, plan.batch(b))
                    }))
                    .unwrap_or_else(|payload| {
                        Err(DataError::WorkerPanic {
                            batch: b,
                            message: panic_message(&payload),
                        })
                    });
                    if result_tx.send((b, result)).is_err() {
                        break;
                    }
                });
            // A thread that cannot start leaves the work to the others.
            if let Ok(handle) = spawned {
                workers.push(handle);
            }
        }
        if workers.is_empty() {
            return None;
        }
        Some(Pool {
            tasks: Some(task_tx),
            results,
            stop,
            workers,
            ready: HashMap::new(),
            dispatched: start,
            end,
            window: window.max(1),
        })
    }
}

impl<B> Pool<B> {
    /// Batch `b`, waiting for it if needed; keeps the queue topped up.
    fn get(&mut self, b: usize) -> Result<B, DataError> {
        while self.dispatched < self.end && self.dispatched < b + self.window {
            let sent = self
                .tasks
                .as_ref()
                .is_some_and(|tx| tx.send(self.dispatched).is_ok());
            if !sent {
                break;
            }
            self.dispatched += 1;
        }
        loop {
            if let Some(r) = self.ready.remove(&b) {
                return r;
            }
            match self.results.recv() {
                Ok((i, r)) => {
                    self.ready.insert(i, r);
                }
                // Workers catch panics, so they only go away together with
                // the queue; this is a last resort rather than a hang.
                Err(_) => {
                    return Err(DataError::WorkerPanic {
                        batch: b,
                        message: "every worker thread exited".to_string(),
                    })
                }
            }
        }
    }
}

impl<B> Drop for Pool<B> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Closing the queue wakes idle workers; busy ones finish their batch,
        // see `stop`, and exit. Joining means no worker outlives the loop.
        self.tasks = None;
        for handle in self.workers.drain(..) {
            let _ = handle.join();
        }
    }
}

fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}
