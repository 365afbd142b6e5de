//! [`Mnist`]: an images file and a labels file in IDX format as a dataset of
//! `(image tensor, label)` pairs, like `torchvision.datasets.MNIST` with
//! `ToTensor()` (and optionally `Normalize`). Works for every dataset in
//! MNIST's format: Fashion-MNIST, KMNIST, EMNIST.

use super::idx::{plain_or_gz, read_idx_images, read_idx_labels};
use super::{DataError, Dataset};
use forma_core::{Shape, Tensor, C};
use forma_cpu::Cpu;
use std::path::{Path, PathBuf};

/// Which half of MNIST to load from a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MnistSplit {
    /// `train-images-idx3-ubyte` and `train-labels-idx1-ubyte` (60000 in MNIST).
    Train,
    /// `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte` (10000 in MNIST).
    Test,
}

impl MnistSplit {
    /// The images and labels file names, as MNIST distributes them.
    pub fn file_names(self) -> (&'static str, &'static str) {
        match self {
            MnistSplit::Train => ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
            MnistSplit::Test => ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
        }
    }
}

/// MNIST-format images and labels: item `i` is image `i` as an f32 tensor of
/// shape `S` with values `pixel / 255` (then `(v - mean) / std` after
/// [`Mnist::normalize`]), and label `i` as an `i64`, ready for cross-entropy.
///
/// `S` is the item shape, by default `(C<1>, C<28>, C<28>)` (channels, rows,
/// cols), as convolutional nets take it; a rank-2 shape takes `(rows, cols)`
/// and a rank-1 shape the flattened `rows * cols` pixels, as an MLP takes
/// them: `Mnist::<(C<784>,)>::load(..)`. The pixels stay bytes in memory
/// (47 MB for MNIST's training set) and are converted per item when fetched.
///
/// ```no_run
/// use forma::prelude::*;
/// use forma::nn::data::{DataLoader, Mnist, MnistSplit};
///
/// let train = Mnist::<(C<1>, C<28>, C<28>)>::from_dir("data/mnist", MnistSplit::Train)?
///     .normalize(0.1307, 0.3081)?;
/// let mut loader = DataLoader::new(train, 64)?.shuffle(0).num_workers(2);
/// for batch in loader.iter() {
///     let (x, y): (Tensor<(Dyn, C<1>, C<28>, C<28>)>, Tensor<(Dyn,), i64>) = batch?;
///     # let _ = (x, y);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Mnist<S: Shape = (C<1>, C<28>, C<28>)> {
    pixels: Vec<u8>,
    labels: Vec<u8>,
    rows: usize,
    cols: usize,
    item_shape: S,
    mean: f32,
    std: f32,
}

impl<S: Shape> std::fmt::Debug for Mnist<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mnist")
            .field("len", &self.labels.len())
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("item_shape", &self.item_shape)
            .field("mean", &self.mean)
            .field("std", &self.std)
            .finish_non_exhaustive()
    }
}

impl<S: Shape> Mnist<S> {
    /// Reads an images file and a labels file (plain or `.gz`).
    ///
    /// # Errors
    /// Any error of [`super::read_idx_images`] / [`super::read_idx_labels`],
    /// [`DataError::CountMismatch`] when the counts differ, and
    /// [`DataError::ImageShape`] when the images do not fit `S`.
    pub fn load(images: impl AsRef<Path>, labels: impl AsRef<Path>) -> Result<Self, DataError> {
        let (images_path, labels_path) = (images.as_ref(), labels.as_ref());
        let images = read_idx_images(images_path)?;
        let item_shape =
            Self::shape_for(images.rows, images.cols).ok_or_else(|| DataError::ImageShape {
                path: images_path.to_path_buf(),
                rows: images.rows,
                cols: images.cols,
                expected: S::describe(),
            })?;
        let labels = read_idx_labels(labels_path)?;
        if labels.len() != images.count {
            return Err(DataError::CountMismatch {
                images_path: images_path.to_path_buf(),
                images: images.count,
                labels_path: labels_path.to_path_buf(),
                labels: labels.len(),
            });
        }
        Ok(Mnist {
            pixels: images.data,
            labels,
            rows: images.rows,
            cols: images.cols,
            item_shape,
            mean: 0.0,
            std: 1.0,
        })
    }

    /// Reads a split from a directory holding MNIST's files under their
    /// usual names, each either plain or with a `.gz` suffix.
    ///
    /// # Errors
    /// As [`Mnist::load`]; a missing file is [`DataError::NotFound`] naming
    /// the uncompressed name.
    pub fn from_dir(dir: impl AsRef<Path>, split: MnistSplit) -> Result<Self, DataError> {
        let (images, labels) = split.file_names();
        let find = |name: &str| plain_or_gz(PathBuf::from(dir.as_ref()).join(name));
        Self::load(find(images), find(labels))
    }

    /// Normalises as `transforms.Normalize((mean,), (std,))` after
    /// `ToTensor()`: items become `(pixel / 255 - mean) / std`, in f32.
    /// MNIST's usual values are `mean = 0.1307, std = 0.3081`.
    ///
    /// # Errors
    /// [`DataError::Invalid`] when `std` is not positive and finite, or `mean`
    /// is not finite.
    pub fn normalize(mut self, mean: f32, std: f32) -> Result<Self, DataError> {
        if !(std > 0.0 && std.is_finite() && mean.is_finite()) {
            return Err(DataError::invalid(
                "Mnist::normalize",
                format!("mean {mean} must be finite and std {std} positive and finite"),
            ));
        }
        self.mean = mean;
        self.std = std;
        Ok(self)
    }

    /// The item shape `S` for images of `rows` x `cols`, if they fit it.
    fn shape_for(rows: usize, cols: usize) -> Option<S> {
        match S::RANK {
            1 => S::from_dims(&[rows.checked_mul(cols)?]),
            2 => S::from_dims(&[rows, cols]),
            3 => S::from_dims(&[1, rows, cols]),
            _ => None,
        }
    }

    /// Rows per image.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns per image.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Every label, in file order.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// The raw pixels of image `index`.
    pub fn pixels(&self, index: usize) -> Option<&[u8]> {
        let n = self.rows * self.cols;
        (index < self.labels.len()).then(|| &self.pixels[index * n..(index + 1) * n])
    }
}

impl<S: Shape> Dataset for Mnist<S> {
    type Item = (Tensor<S, f32, Cpu>, i64);

    fn len(&self) -> usize {
        self.labels.len()
    }

    fn get(&self, index: usize) -> Result<Self::Item, DataError> {
        let pixels = self.pixels(index).ok_or(DataError::IndexOutOfRange {
            index,
            len: self.labels.len(),
        })?;
        // In f32 and in this order, as `ToTensor` (`x.float().div(255)`)
        // then `Normalize` (`sub_(mean).div_(std)`) compute it; without
        // `normalize` the mean is 0 and the std 1, which change nothing.
        let (mean, std) = (self.mean, self.std);
        let values: Vec<f32> = pixels
            .iter()
            .map(|&p| (p as f32 / 255.0 - mean) / std)
            .collect();
        let image = Tensor::from_vec_on(values, self.item_shape, &Cpu)?;
        Ok((image, self.labels[index] as i64))
    }
}
