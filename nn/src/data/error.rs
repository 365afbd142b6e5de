//! [`DataError`]: why loading data failed. File errors name the file, since
//! data files come from outside and the user needs to know which one is bad.

use std::path::PathBuf;

/// Why reading a data file, fetching an item or assembling a batch failed.
///
/// Every variant about a file names it; the IDX variants say what the header
/// declared and what the file holds, so a truncated download reads as one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The file does not exist.
    #[error("{}: no such file", path.display())]
    NotFound {
        /// The file.
        path: PathBuf,
    },
    /// The file could not be opened or read.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The gzip stream of a `.gz` file is corrupt.
    #[error("{}: corrupt gzip data: {source}", path.display())]
    Gzip {
        /// The file.
        path: PathBuf,
        /// The decoder's error.
        source: std::io::Error,
    },
    /// The first two bytes are not the zeros every IDX file starts with.
    #[error(
        "{}: not an IDX file: the magic number is {:02x} {:02x} {:02x} {:02x}, but an IDX file starts with 00 00",
        path.display(), magic[0], magic[1], magic[2], magic[3]
    )]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first four bytes.
        magic: [u8; 4],
    },
    /// The magic number's third byte is not a known element type.
    #[error(
        "{}: unsupported IDX type code 0x{code:02x} (known: 0x08 u8, 0x09 i8, 0x0b i16, 0x0c i32, 0x0d f32, 0x0e f64)",
        path.display()
    )]
    UnsupportedType {
        /// The file.
        path: PathBuf,
        /// The type byte.
        code: u8,
    },
    /// The magic number's fourth byte (the rank) is zero or absurdly large.
    #[error(
        "{}: IDX rank {rank} is not between 1 and {}",
        path.display(), super::idx::MAX_IDX_RANK
    )]
    BadRank {
        /// The file.
        path: PathBuf,
        /// The declared rank.
        rank: u8,
    },
    /// The declared dims describe more bytes than this machine can address.
    #[error(
        "{}: the dims {dims:?} of {elem_size}-byte elements overflow the addressable size",
        path.display()
    )]
    SizeOverflow {
        /// The file.
        path: PathBuf,
        /// The declared dims.
        dims: Vec<u64>,
        /// Bytes per element.
        elem_size: usize,
    },
    /// The file ends before the header or the data it declares. Byte counts
    /// are of the whole (decompressed) file, header included.
    #[error(
        "{}: truncated {what}: expected {expected} bytes, found {found}",
        path.display()
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// `"header"` or `"data"`.
        what: &'static str,
        /// Bytes the header requires.
        expected: u64,
        /// Bytes the file holds.
        found: u64,
    },
    /// The file holds more bytes than its header declares.
    #[error(
        "{}: {}{} trailing bytes: the header declares {expected} bytes in all, the file holds {}{found}",
        path.display(),
        if *counted_all { "" } else { "at least " },
        found - expected,
        if *counted_all { "" } else { "at least " },
    )]
    TrailingBytes {
        /// The file.
        path: PathBuf,
        /// Bytes the header declares, header included.
        expected: u64,
        /// Bytes the file holds (for gzip, counted up to a cap: decompressing
        /// stops soon after the declared size).
        found: u64,
        /// Whether `found` counts every byte (false when the count stopped
        /// at the cap).
        counted_all: bool,
    },
    /// The header declares more data than the caller allows
    /// ([`super::read_idx_limited`]); nothing was decompressed or allocated.
    #[error(
        "{}: the header declares {declared} bytes of data, more than the limit of {limit}",
        path.display()
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Bytes of data the header declares.
        declared: u64,
        /// The caller's limit.
        limit: u64,
    },
    /// A valid IDX file that holds something other than what was asked for
    /// (labels where images were expected, f32 where u8 was).
    #[error("{}: expected {expected}, found {found}", path.display())]
    WrongContent {
        /// The file.
        path: PathBuf,
        /// What the reader wants, e.g. `u8 images [count, rows, cols]`.
        expected: String,
        /// What the file holds, e.g. `u8 [60000]`.
        found: String,
    },
    /// The images do not fit the item shape the dataset was asked for.
    #[error(
        "{}: images of {rows}x{cols} pixels do not fit the item shape {expected}",
        path.display()
    )]
    ImageShape {
        /// The images file.
        path: PathBuf,
        /// Rows per image.
        rows: usize,
        /// Columns per image.
        cols: usize,
        /// The requested item shape, e.g. `[1, 28, 28]`.
        expected: String,
    },
    /// An images file and a labels file disagree on the number of examples.
    #[error(
        "{} holds {images} images but {} holds {labels} labels",
        images_path.display(), labels_path.display()
    )]
    CountMismatch {
        /// The images file.
        images_path: PathBuf,
        /// The number of images.
        images: usize,
        /// The labels file.
        labels_path: PathBuf,
        /// The number of labels.
        labels: usize,
    },
    /// An item index past the end of a dataset.
    #[error("index {index} is out of range for a dataset of {len} items")]
    IndexOutOfRange {
        /// The index asked for.
        index: usize,
        /// The dataset's length.
        len: usize,
    },
    /// Split lengths that do not add up to the dataset's length.
    #[error("split lengths {lengths:?} add up to {sum}, not the dataset's {len} items")]
    SplitLengths {
        /// The requested lengths.
        lengths: Vec<usize>,
        /// Their sum.
        sum: usize,
        /// The dataset's length.
        len: usize,
    },
    /// A loader position past the end of an epoch.
    #[error("loader position batch {batch} is past the end of an epoch of {len} batches")]
    BadState {
        /// The batch index asked for.
        batch: usize,
        /// Batches per epoch.
        len: usize,
    },
    /// A setting that cannot work (batch size 0, a non-positive std, ...).
    #[error("{what}: {reason}")]
    Invalid {
        /// The setting.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Items that cannot be put together into one batch.
    #[error("collate: {reason}")]
    Collate {
        /// What is wrong.
        reason: String,
    },
    /// A tensor operation failed (stacking items of different sizes, ...).
    #[error(transparent)]
    Tensor(#[from] forma_core::Error),
    /// A worker thread panicked while loading a batch; the panic is caught
    /// so the loader reports it instead of hanging.
    #[error("a data-loader worker panicked while loading batch {batch}: {message}")]
    WorkerPanic {
        /// The batch being loaded.
        batch: usize,
        /// The panic's message.
        message: String,
    },
    /// An error from a user's dataset or collate function.
    #[error("{0}")]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl DataError {
    /// Wraps an error (or a message) from user code: a custom [`super::Dataset`]
    /// or collate function.
    pub fn other(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        DataError::Other(e.into())
    }

    /// The file the error is about, when it is about one file.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            DataError::NotFound { path }
            | DataError::Io { path, .. }
            | DataError::Gzip { path, .. }
            | DataError::BadMagic { path, .. }
            | DataError::UnsupportedType { path, .. }
            | DataError::BadRank { path, .. }
            | DataError::SizeOverflow { path, .. }
            | DataError::Truncated { path, .. }
            | DataError::TrailingBytes { path, .. }
            | DataError::TooLarge { path, .. }
            | DataError::WrongContent { path, .. }
            | DataError::ImageShape { path, .. } => Some(path),
            _ => None,
        }
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        DataError::Invalid {
            what,
            reason: reason.into(),
        }
    }
}
