//! [`DistributedSampler`]: each process of a data-parallel job takes its own
//! share of every epoch, like `torch.utils.data.distributed.DistributedSampler`.

use super::dataset::permutation;
use super::loader::epoch_rng;
use super::DataError;

/// Splits each epoch's order into `num_replicas` equal shares and keeps share
/// `rank`, with PyTorch's rules:
///
/// - the order is a permutation drawn from the seed and the epoch (the same
///   on every rank, so the shares never overlap), or `0..n` without
///   [`shuffle`](DistributedSampler::shuffle);
/// - without [`drop_last`](DistributedSampler::drop_last) the order is padded
///   by repeating its start until it divides evenly (a few items appear
///   twice in an epoch); with it, the tail that does not divide is dropped;
/// - rank `r` takes positions `r, r + num_replicas, r + 2 * num_replicas, ...`.
///
/// Every rank therefore gets [`num_samples`](DistributedSampler::num_samples)
/// items per epoch, so every rank runs the same number of steps. Give it to
/// a [`DataLoader`](super::DataLoader) with
/// [`sampler`](super::DataLoader::sampler); the loader's epoch counter plays
/// the part of PyTorch's `set_epoch`, so each epoch is shuffled differently
/// without a call. The permutations are Forma's (the generators differ from
/// PyTorch's); the split and padding rules are PyTorch's.
///
/// ```
/// use forma::nn::data::DistributedSampler;
///
/// // 10 items over 3 processes, in order: padded to 12 by repeating 0 and 1.
/// let s = DistributedSampler::new(3, 1)?.shuffle(false);
/// assert_eq!(s.num_samples(10), 4);
/// assert_eq!(s.indices(10, 0), [1, 4, 7, 0]);
/// // drop_last: 9 items, 3 each.
/// let s = s.drop_last(true);
/// assert_eq!(s.indices(10, 0), [1, 4, 7]);
/// # Ok::<(), forma::nn::data::DataError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DistributedSampler {
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
}

impl DistributedSampler {
    /// Share `rank` of `num_replicas`, shuffled with seed 0 and padded
    /// (PyTorch's defaults).
    ///
    /// # Errors
    /// [`DataError::Invalid`] when `num_replicas` is 0 or `rank` is not below it.
    pub fn new(num_replicas: usize, rank: usize) -> Result<Self, DataError> {
        if num_replicas == 0 || rank >= num_replicas {
            return Err(DataError::invalid(
                "DistributedSampler",
                format!("rank {rank} is not one of {num_replicas} replicas (0..{num_replicas})"),
            ));
        }
        Ok(DistributedSampler {
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
        })
    }

    /// Whether each epoch's order is a fresh permutation (default `true`).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// The seed of the permutations; must be the same on every rank.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drop the tail that does not divide evenly instead of padding.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// The number of processes.
    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// This process's share.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Items each rank gets per epoch from a dataset of `len` items.
    pub fn num_samples(&self, len: usize) -> usize {
        if self.drop_last {
            len / self.num_replicas
        } else {
            len.div_ceil(self.num_replicas)
        }
    }

    /// This rank's indices for epoch `epoch` of a dataset of `len` items.
    pub fn indices(&self, len: usize, epoch: u64) -> Vec<usize> {
        let mut order = if self.shuffle {
            permutation(len, &mut epoch_rng(self.seed, epoch))
        } else {
            (0..len).collect()
        };
        let total = self.num_samples(len) * self.num_replicas;
        if order.len() < total {
            // Repeat the order's start (the whole order as often as needed).
            let base = order.clone();
            while order.len() < total {
                let take = (total - order.len()).min(base.len());
                order.extend_from_slice(&base[..take]);
            }
        }
        order.truncate(total);
        order
            .into_iter()
            .skip(self.rank)
            .step_by(self.num_replicas)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_the_epoch_once_and_pad_like_pytorch() {
        // PyTorch, shuffle=False, 5 items over 2 ranks: [0, 2, 4] and [1, 3, 0].
        let a = DistributedSampler::new(2, 0).unwrap().shuffle(false);
        let b = DistributedSampler::new(2, 1).unwrap().shuffle(false);
        assert_eq!(a.indices(5, 0), [0, 2, 4]);
        assert_eq!(b.indices(5, 0), [1, 3, 0]);
        // drop_last: [0, 2] and [1, 3].
        assert_eq!(a.drop_last(true).indices(5, 0), [0, 2]);
        assert_eq!(b.drop_last(true).indices(5, 0), [1, 3]);
        // Fewer items than ranks: the order repeats whole (PyTorch: 2 items, 5 ranks).
        let s = DistributedSampler::new(5, 4).unwrap().shuffle(false);
        assert_eq!(s.indices(2, 0), [0]);
        assert_eq!(
            DistributedSampler::new(5, 2)
                .unwrap()
                .shuffle(false)
                .indices(2, 0),
            [0]
        );
        assert_eq!(
            DistributedSampler::new(5, 3)
                .unwrap()
                .shuffle(false)
                .indices(2, 0),
            [1]
        );
    }

    #[test]
    fn shuffled_shares_are_disjoint_and_change_with_the_epoch() {
        let n = 103;
        let shares = |epoch| {
            (0..4)
                .map(|r| {
                    DistributedSampler::new(4, r)
                        .unwrap()
                        .seed(9)
                        .indices(n, epoch)
                })
                .collect::<Vec<_>>()
        };
        let e0 = shares(0);
        let mut all: Vec<usize> = e0.iter().flatten().copied().collect();
        assert_eq!(all.len(), 104); // padded by one
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
        assert_ne!(e0, shares(1));
        assert_eq!(e0, shares(0));
    }

    #[test]
    fn refuses_a_rank_outside_the_group() {
        let e = DistributedSampler::new(2, 2).unwrap_err();
        assert!(e.to_string().contains("rank 2"), "{e}");
        assert!(DistributedSampler::new(0, 0).is_err());
    }
}
