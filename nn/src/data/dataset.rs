//! The [`Dataset`] trait (PyTorch's map-style `Dataset`), its impls for
//! vectors and in-memory tensors, and [`Subset`] / [`random_split`].

use super::DataError;
use forma_core::shape::HasAxis;
use forma_core::{Backend, DefaultDevice, Dim, Dtype, Dyn, Rng, Shape, Tensor};
use forma_cpu::Cpu;
use std::sync::Arc;

/// A map-style dataset: `len()` items, fetched one at a time by index, like
/// PyTorch's `Dataset` with `__len__` and `__getitem__`.
///
/// `get` takes `&self` and datasets are `Send + Sync`, so a
/// [`super::DataLoader`]'s worker threads can fetch items concurrently. The
/// trait has no generic methods, so `Box<dyn Dataset<Item = T>>` works (and
/// is itself a dataset).
///
/// `Vec<T>` is a dataset, so where this trait is in scope `vec.get(i)` means
/// [`Dataset::get`] (a `Result`, cloning the item) rather than the slice's
/// `get` (an `Option` of a reference); write `vec.as_slice().get(i)` for the
/// latter. The two return types differ, so a mix-up does not compile.
///
/// ```
/// use forma::nn::data::{DataError, Dataset};
///
/// /// The squares 0, 1, 4, 9, ... computed on demand.
/// struct Squares(usize);
///
/// impl Dataset for Squares {
///     type Item = u64;
///     fn len(&self) -> usize {
///         self.0
///     }
///     fn get(&self, index: usize) -> Result<u64, DataError> {
///         if index >= self.0 {
///             return Err(DataError::IndexOutOfRange { index, len: self.0 });
///         }
///         Ok((index * index) as u64)
///     }
/// }
///
/// let boxed: Box<dyn Dataset<Item = u64>> = Box::new(Squares(5));
/// assert_eq!(boxed.len(), 5);
/// assert_eq!(boxed.get(3).unwrap(), 9);
/// assert!(boxed.get(5).is_err());
/// ```
pub trait Dataset: Send + Sync {
    /// What one index yields, e.g. `(Tensor<(C<1>, C<28>, C<28>)>, i64)`.
    type Item;

    /// Number of items.
    fn len(&self) -> usize;

    /// Whether there are no items.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The item at `index`.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] for `index >= len()`, or whatever the
    /// dataset's source reports.
    fn get(&self, index: usize) -> Result<Self::Item, DataError>;
}

impl<T: Clone + Send + Sync> Dataset for [T] {
    type Item = T;
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    fn get(&self, index: usize) -> Result<T, DataError> {
        <[T]>::get(self, index)
            .cloned()
            .ok_or(DataError::IndexOutOfRange {
                index,
                len: <[T]>::len(self),
            })
    }
}

impl<T: Clone + Send + Sync> Dataset for Vec<T> {
    type Item = T;
    fn len(&self) -> usize {
        self.as_slice().len()
    }
    fn get(&self, index: usize) -> Result<T, DataError> {
        Dataset::get(self.as_slice(), index)
    }
}

macro_rules! forward_dataset {
    ($($ptr:ty),*) => {$(
        impl<D: Dataset + ?Sized> Dataset for $ptr {
            type Item = D::Item;
            fn len(&self) -> usize {
                (**self).len()
            }
            fn get(&self, index: usize) -> Result<D::Item, DataError> {
                (**self).get(index)
            }
        }
    )*};
}
forward_dataset!(Box<D>, Arc<D>, &D);

/// Labelled examples held in memory as one tensor, like PyTorch's
/// `TensorDataset(features, labels)`: item `i` is a view of row `i` of the
/// features (no copy) and its target: an `i64` class label
/// ([`TensorDataset::new`]) or a row of a target tensor of any shape and
/// type ([`TensorDataset::with_targets`], for regression).
///
/// `S` is one item's shape: the features' shape without its first axis.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::data::{Dataset, TensorDataset};
///
/// let x = Tensor::<(Dyn, C<2>)>::from_vec(vec![1., 2., 3., 4., 5., 6.], (Dyn(3), C)).unwrap();
/// let y = Tensor::<(Dyn,), i64>::from_vec(vec![7, 8, 9], (Dyn(3),)).unwrap();
/// let data = TensorDataset::new(&x, &y).unwrap();
/// let (row, label): (Tensor<(C<2>,)>, i64) = data.get(1).unwrap();
/// assert_eq!(row.to_vec(), [3., 4.]);
/// assert_eq!(label, 8);
/// ```
pub struct TensorDataset<S: Shape, E: Dtype = f32, D: Backend = Cpu, T: Target = i64> {
    /// Every item's values, item after item.
    flat: Tensor<(Dyn,), E, D>,
    item_shape: S,
    targets: T::Store,
}

impl<S: Shape, E: Dtype, D: Backend, T: Target> std::fmt::Debug for TensorDataset<S, E, D, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorDataset")
            .field("len", &T::count(&self.targets))
            .field("item_shape", &self.item_shape)
            .field("dtype", &E::DTYPE)
            .finish()
    }
}

/// What a [`TensorDataset`] pairs each row with: an `i64` class label
/// (kept on the host, as [`TensorDataset::new`] makes), or a row of a
/// target tensor of any shape and type ([`TensorDataset::with_targets`]:
/// regression values, one-hot rows, masks).
pub trait Target: Sized + Send + Sync {
    /// Every item's target.
    type Store: Send + Sync;
    /// The number of targets stored.
    fn count(store: &Self::Store) -> usize;
    /// Target `index` (in range).
    ///
    /// # Errors
    /// A device error viewing a row.
    fn fetch(store: &Self::Store, index: usize) -> Result<Self, DataError>;
}

impl Target for i64 {
    type Store = Vec<i64>;

    fn count(store: &Vec<i64>) -> usize {
        store.len()
    }

    fn fetch(store: &Vec<i64>, index: usize) -> Result<i64, DataError> {
        Ok(store[index])
    }
}

/// Target rows of shape `S`, stored as one flat tensor and viewed row by
/// row (no copy), like the features.
#[derive(Debug)]
pub struct TargetRows<S: Shape, E: Dtype, D: Backend> {
    flat: Tensor<(Dyn,), E, D>,
    shape: S,
    count: usize,
}

impl<S: Shape, E: Dtype, D: Backend> Target for Tensor<S, E, D> {
    type Store = TargetRows<S, E, D>;

    fn count(store: &TargetRows<S, E, D>) -> usize {
        store.count
    }

    fn fetch(store: &TargetRows<S, E, D>, index: usize) -> Result<Self, DataError> {
        row(&store.flat, store.shape, index)
    }
}

/// Row `index` of a flat tensor of rows of shape `shape`, as a view.
fn row<S: Shape, E: Dtype, D: Backend>(
    flat: &Tensor<(Dyn,), E, D>,
    shape: S,
    index: usize,
) -> Result<Tensor<S, E, D>, DataError> {
    let per = shape.numel();
    Ok(flat
        .try_narrow::<0>(index * per, per)?
        .try_reshape_to(shape)?)
}

/// The sizes of one row of `t` (its dims past the first) as `S`, and its
/// rows as one flat, detached, contiguous tensor.
fn rows<B: Shape, S: Shape, E: Dtype, D: Backend>(
    what: &str,
    t: &Tensor<B, E, D>,
) -> Result<(Tensor<(Dyn,), E, D>, S, usize), DataError> {
    let dims = t.dims();
    let shape = S::from_dims(&dims[1..]).ok_or_else(|| {
        // A tensor's sizes always fit its own shape type, so this is
        // only reachable through a broken `Shape` impl.
        DataError::invalid(
            "TensorDataset",
            format!(
                "{what} {dims:?} do not fit the item shape {}",
                S::describe()
            ),
        )
    })?;
    Ok((t.detach().contiguous().flatten_all(), shape, dims[0]))
}

impl<S: Shape, E: Dtype, D: Backend> TensorDataset<S, E, D> {
    /// Pairs `features` (first axis: the items) with one class label per
    /// item. The features are detached (a dataset holds data, not a graph);
    /// the labels are copied to the host once, so fetching one is free.
    ///
    /// # Errors
    /// [`DataError::Invalid`] when the counts differ, or a device error
    /// reading the labels.
    pub fn new<B, L: Dim>(
        features: &Tensor<B, E, D>,
        labels: &Tensor<(L,), i64, D>,
    ) -> Result<Self, DataError>
    where
        B: Shape + HasAxis<0, Removed = S>,
    {
        let (flat, item_shape, n) = rows("features", features)?;
        let labels = labels.try_to_vec()?;
        if labels.len() != n {
            return Err(DataError::invalid(
                "TensorDataset",
                format!("{n} feature rows but {} labels", labels.len()),
            ));
        }
        Ok(TensorDataset {
            flat,
            item_shape,
            targets: labels,
        })
    }

    /// The labels, one per item.
    pub fn labels(&self) -> &[i64] {
        &self.targets
    }
}

impl<S: Shape, E: Dtype, D: Backend, TS: Shape, F: Dtype> TensorDataset<S, E, D, Tensor<TS, F, D>> {
    /// Pairs `features` with the rows of `targets` (first axis: the items),
    /// like `TensorDataset(features, targets)` with a float target tensor:
    /// item `i` is `(features[i], targets[i])`, both views. A `(N,)` target
    /// gives scalar (`()`-shaped) targets, which batch to `(B,)`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::data::{Dataset, TensorDataset};
    ///
    /// let x = Tensor::<(Dyn, C<2>)>::from_vec(vec![1., 2., 3., 4.], (Dyn(2), C)).unwrap();
    /// let y = Tensor::<(Dyn, C<1>)>::from_vec(vec![0.5, -1.5], (Dyn(2), C)).unwrap();
    /// let data = TensorDataset::with_targets(&x, &y).unwrap();
    /// let (row, target): (Tensor<(C<2>,)>, Tensor<(C<1>,)>) = data.get(1).unwrap();
    /// assert_eq!((row.to_vec(), target.to_vec()), (vec![3., 4.], vec![-1.5]));
    /// ```
    ///
    /// # Errors
    /// [`DataError::Invalid`] when the counts differ.
    pub fn with_targets<B, TB>(
        features: &Tensor<B, E, D>,
        targets: &Tensor<TB, F, D>,
    ) -> Result<Self, DataError>
    where
        B: Shape + HasAxis<0, Removed = S>,
        TB: Shape + HasAxis<0, Removed = TS>,
    {
        let (flat, item_shape, n) = rows("features", features)?;
        let (targets, shape, count) = rows("targets", targets)?;
        if count != n {
            return Err(DataError::invalid(
                "TensorDataset",
                format!("{n} feature rows but {count} target rows"),
            ));
        }
        Ok(TensorDataset {
            flat,
            item_shape,
            targets: TargetRows {
                flat: targets,
                shape,
                count,
            },
        })
    }
}

impl<S: Shape, E: Dtype, D: Backend, T: Target> TensorDataset<S, E, D, T> {
    /// One item's shape.
    pub fn item_shape(&self) -> S {
        self.item_shape
    }
}

impl<S: Shape, E: Dtype, D: DefaultDevice> TensorDataset<S, E, D> {
    /// Builds from host values: `data` holds `labels.len()` items of
    /// `item_shape`, item after item.
    ///
    /// # Errors
    /// [`DataError::Invalid`] when `data.len()` is not `labels.len()` times
    /// the item's element count.
    pub fn from_vec(data: Vec<E>, item_shape: S, labels: Vec<i64>) -> Result<Self, DataError> {
        let per = item_shape.numel();
        if Some(data.len()) != per.checked_mul(labels.len()) {
            return Err(DataError::invalid(
                "TensorDataset",
                format!(
                    "{} values are not {} items of shape {:?}",
                    data.len(),
                    labels.len(),
                    item_shape.dims()
                ),
            ));
        }
        let flat = Tensor::from_vec_on(data, (Dyn(per * labels.len()),), &D::default_device())?;
        Ok(TensorDataset {
            flat,
            item_shape,
            targets: labels,
        })
    }
}

impl<S: Shape, E: Dtype, D: Backend, T: Target> Dataset for TensorDataset<S, E, D, T> {
    type Item = (Tensor<S, E, D>, T);

    fn len(&self) -> usize {
        T::count(&self.targets)
    }

    fn get(&self, index: usize) -> Result<Self::Item, DataError> {
        let len = T::count(&self.targets);
        if index >= len {
            return Err(DataError::IndexOutOfRange { index, len });
        }
        let target = T::fetch(&self.targets, index)?;
        Ok((row(&self.flat, self.item_shape, index)?, target))
    }
}

/// The items of a dataset at chosen indices, like `torch.utils.data.Subset`.
/// The dataset is shared, not copied.
pub struct Subset<D: Dataset> {
    dataset: Arc<D>,
    indices: Vec<usize>,
}

impl<D: Dataset> std::fmt::Debug for Subset<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subset")
            .field("len", &self.indices.len())
            .field("of", &self.dataset.len())
            .finish()
    }
}

impl<D: Dataset> Clone for Subset<D> {
    fn clone(&self) -> Self {
        Subset {
            dataset: Arc::clone(&self.dataset),
            indices: self.indices.clone(),
        }
    }
}

impl<D: Dataset> Subset<D> {
    /// The items of `dataset` at `indices`, in that order.
    ///
    /// # Errors
    /// [`DataError::IndexOutOfRange`] for an index past the dataset's end.
    pub fn new(dataset: Arc<D>, indices: Vec<usize>) -> Result<Self, DataError> {
        let len = dataset.len();
        if let Some(&index) = indices.iter().find(|&&i| i >= len) {
            return Err(DataError::IndexOutOfRange { index, len });
        }
        Ok(Subset { dataset, indices })
    }

    /// The indices into the underlying dataset.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// The underlying dataset.
    pub fn dataset(&self) -> &Arc<D> {
        &self.dataset
    }
}

impl<D: Dataset> Dataset for Subset<D> {
    type Item = D::Item;
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn get(&self, index: usize) -> Result<D::Item, DataError> {
        let &i = <[usize]>::get(&self.indices, index).ok_or(DataError::IndexOutOfRange {
            index,
            len: self.indices.len(),
        })?;
        self.dataset.get(i)
    }
}

/// A uniformly random permutation of `0..n` (Fisher-Yates).
pub(crate) fn permutation(n: usize, rng: &mut Rng) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

/// Splits a dataset into non-overlapping random subsets of the given
/// lengths, like `torch.utils.data.random_split(dataset, lengths, generator)`:
/// a permutation drawn from `seed` is cut into consecutive runs. The same
/// seed gives the same split (the permutation is Forma's, not PyTorch's, as
/// the generators differ).
///
/// ```
/// use forma::nn::data::{random_split, Dataset};
/// use std::sync::Arc;
///
/// let all: Vec<u32> = (0..10).collect();
/// let parts = random_split(Arc::new(all), &[8, 2], 42).unwrap();
/// assert_eq!((parts[0].len(), parts[1].len()), (8, 2));
/// let mut seen: Vec<u32> = parts.iter().flat_map(|p| (0..p.len()).map(|i| p.get(i).unwrap())).collect();
/// seen.sort();
/// assert_eq!(seen, (0..10).collect::<Vec<u32>>());
/// ```
///
/// # Errors
/// [`DataError::SplitLengths`] when the lengths do not add up to the
/// dataset's length.
pub fn random_split<D: Dataset>(
    dataset: Arc<D>,
    lengths: &[usize],
    seed: u64,
) -> Result<Vec<Subset<D>>, DataError> {
    let len = dataset.len();
    let sum = lengths
        .iter()
        .try_fold(0usize, |a, &l| a.checked_add(l))
        .unwrap_or(usize::MAX);
    if sum != len {
        return Err(DataError::SplitLengths {
            lengths: lengths.to_vec(),
            sum,
            len,
        });
    }
    let perm = permutation(len, &mut Rng::seed_from(seed));
    let mut start = 0;
    Ok(lengths
        .iter()
        .map(|&l| {
            let indices = perm[start..start + l].to_vec();
            start += l;
            Subset {
                dataset: Arc::clone(&dataset),
                indices,
            }
        })
        .collect())
}

/// Lengths for [`random_split`] from fractions that sum to 1, as PyTorch
/// computes them: `floor(len * f)` each, then the remainder handed out one
/// by one from the first subset on.
///
/// # Errors
/// [`DataError::Invalid`] when a fraction is outside `[0, 1]` or they do not
/// sum to 1 (within 1e-9).
pub fn split_lengths(len: usize, fractions: &[f64]) -> Result<Vec<usize>, DataError> {
    let sum: f64 = fractions.iter().sum();
    if fractions.iter().any(|f| !(0.0..=1.0).contains(f)) || (sum - 1.0).abs() > 1e-9 {
        return Err(DataError::invalid(
            "split_lengths",
            format!("fractions {fractions:?} must each be in [0, 1] and sum to 1"),
        ));
    }
    let mut lengths: Vec<usize> = fractions
        .iter()
        .map(|f| (len as f64 * f).floor() as usize)
        .collect();
    let rest = len - lengths.iter().sum::<usize>().min(len);
    let k = lengths.len();
    for i in 0..rest {
        lengths[i % k] += 1;
    }
    Ok(lengths)
}
