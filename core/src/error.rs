//! The error type of the core crate: one enum, grouped by kind, each variant
//! naming the operation and the values involved.

use std::fmt;

/// A shape that did not fit an operation at run time (a `Dyn` size, or a
/// conversion between static and dynamic shapes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeError {
    /// The operation that rejected the shape, e.g. `"add"` or `"try_into_shape"`.
    pub op: &'static str,
    /// What the operation needed, written like a shape: `[_, 3]` (`_` is any size).
    pub expected: String,
    /// What it got.
    pub actual: String,
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: expected shape {}, got {}",
            self.op, self.expected, self.actual
        )
    }
}

impl std::error::Error for ShapeError {}

/// Formats sizes like a shape: `[2, 3]`.
pub fn fmt_dims(dims: &[usize]) -> String {
    let inner: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", inner.join(", "))
}

/// Every way a core operation can fail.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A run-time shape mismatch.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// An index outside the valid range.
    #[error("{op}: index {index} is out of range for a dimension of size {size}")]
    IndexOutOfRange {
        /// The operation.
        op: &'static str,
        /// The offending index.
        index: i64,
        /// The size it was checked against.
        size: usize,
    },
    /// An argument outside what the operation accepts.
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// The data given does not fill the shape asked for.
    #[error("{op}: {len} values cannot fill a shape of {numel} elements {shape}")]
    DataLength {
        /// The operation.
        op: &'static str,
        /// Number of values supplied.
        len: usize,
        /// Elements the shape holds.
        numel: usize,
        /// The shape.
        shape: String,
    },
    /// A tensor an op saved for its backward was written in place before the
    /// backward ran (PyTorch's "one of the variables needed for gradient
    /// computation has been modified by an inplace operation").
    #[error("backward of `{op}`: a tensor it saved for the gradient ({tensor}, saved tensor {index}) was modified by an in-place operation: it is at version {actual}, expected version {expected}; modify a clone instead, or modify it after backward")]
    ModifiedInPlace {
        /// The op whose backward needed the tensor.
        op: &'static str,
        /// Which of the op's saved tensors it is.
        index: usize,
        /// Its sizes and dtype, e.g. `[3] f32`.
        tensor: String,
        /// The version it was saved at.
        expected: u64,
        /// Its version now.
        actual: u64,
    },
    /// A backend failure (device missing, out of memory, kernel failure).
    #[error("{backend}: {msg}")]
    Backend {
        /// The backend's name (`cpu`, `cuda:0`).
        backend: String,
        /// What failed.
        msg: String,
    },
    /// An error raised inside a module's forward, with the dotted path of
    /// that module (its `state_dict` prefix, e.g. `encoder.layer.3.attention`).
    #[error("{path}: {source}")]
    InModule {
        /// The module's dotted path.
        path: String,
        /// The error the module raised.
        source: Box<Error>,
    },
}

/// `Result` with the core [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Builds an [`Error::InvalidArgument`].
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op,
            msg: msg.into(),
        }
    }

    /// Builds a shape error from two sets of sizes.
    pub fn shape(op: &'static str, expected: impl Into<String>, actual: &[usize]) -> Self {
        Error::Shape(ShapeError {
            op,
            expected: expected.into(),
            actual: fmt_dims(actual),
        })
    }

    /// The error with the path of the module it was raised in; an error
    /// that already carries a path (raised deeper) keeps it.
    pub fn in_module(self, path: impl FnOnce() -> String) -> Self {
        match self {
            e @ Error::InModule { .. } => e,
            e => Error::InModule {
                path: path(),
                source: Box::new(e),
            },
        }
    }

    /// The dotted path of the module that raised this error, if it was raised
    /// inside a module's forward.
    pub fn module_path(&self) -> Option<&str> {
        match self {
            Error::InModule { path, .. } => Some(path),
            _ => None,
        }
    }

    /// The error without the module path around it.
    pub fn innermost(&self) -> &Error {
        match self {
            Error::InModule { source, .. } => source.innermost(),
            e => e,
        }
    }
}
