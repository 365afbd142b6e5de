//! Shapes. A shape is a tuple of dimensions, rank 0 to 6: `(Dyn, C<3>, C<224>, C<224>)`.
//!
//! - [`C<N>`] is a static size, known to the compiler.
//! - [`Dyn`] is a size known at run time (batch, sequence length).
//! - [`One`] is a static size 1 that *stretches* under broadcasting, as PyTorch's
//!   size-1 dims do. Reductions with `keepdim` and `unsqueeze` produce it. A plain
//!   `C<1>` is an ordinary size that must match exactly (Rust's trait coherence
//!   cannot let `C<1>` both match `C<1>` and stretch to `C<N>`).
//!
//! Every shape rule lives in this module as a trait over shapes, so ops state
//! their rules as bounds and the compiler reports a violation at the call site:
//! [`Broadcasts`] (elementwise), [`MatmulShape`], [`HasAxis`] (reductions,
//! softmax, indexing), [`InsertAxis`], [`SwapAxes`], [`PermuteShape`],
//! [`ExpandTo`]; element counts for `reshape` are checked by a const assertion
//! ([`check`]) because they need arithmetic on the sizes.

pub mod check;
mod dims;
mod generated;
pub mod op;
pub mod window;

pub use dims::*;
pub use generated::*;

/// The largest rank a [`crate::Layout`] holds. Typed shapes go to rank 6;
/// kernels get two more for internal views (im2col, grouped conv).
pub const MAX_RANK: usize = 8;

/// Sizes of a shape, erased: a small fixed array, so no allocation per op.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Dims {
    len: u8,
    d: [usize; MAX_RANK],
}

impl Dims {
    /// Builds from a slice (rank at most [`MAX_RANK`]).
    ///
    /// # Panics
    /// If `s` is longer than [`MAX_RANK`]; typed shapes never are.
    pub fn from_slice(s: &[usize]) -> Self {
        assert!(
            s.len() <= MAX_RANK,
            "rank {} exceeds the maximum of {MAX_RANK}",
            s.len()
        );
        let mut d = [0; MAX_RANK];
        d[..s.len()].copy_from_slice(s);
        Dims {
            len: s.len() as u8,
            d,
        }
    }

    /// Number of elements (1 for rank 0).
    pub fn numel(&self) -> usize {
        self.iter().product()
    }
}

impl std::ops::Deref for Dims {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.d[..self.len as usize]
    }
}

impl std::ops::DerefMut for Dims {
    fn deref_mut(&mut self) -> &mut [usize] {
        &mut self.d[..self.len as usize]
    }
}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::error::fmt_dims(self))
    }
}

/// A tensor's shape: a tuple of [`Dim`]s. Implemented for tuples of rank 0 to 6.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a tensor shape",
    note = "a shape is a tuple of dimensions such as `(Dyn, C<3>)`, rank 0 to 6; a rank-1 shape needs the trailing comma: `(C<3>,)`"
)]
pub trait Shape: Copy + Clone + std::fmt::Debug + PartialEq + Send + Sync + 'static {
    /// Number of dimensions.
    const RANK: usize;
    /// The element count when every dim is static.
    const STATIC_NUMEL: Option<usize>;
    /// The same rank with every dim [`Dyn`].
    type Dynamic: Shape;
    /// The runtime sizes.
    fn dims(&self) -> Dims;
    /// Builds the shape from runtime sizes; `None` when a static dim disagrees
    /// or the rank differs.
    fn from_dims(dims: &[usize]) -> Option<Self>;
    /// The sizes each dim requires: `Some(n)` for static dims, `None` for `Dyn`.
    fn static_dims() -> Vec<Option<usize>>;
    /// Number of elements.
    fn numel(&self) -> usize {
        self.dims().numel()
    }
    /// The required sizes written like a shape: `[_, 3]`.
    fn describe() -> String {
        let parts: Vec<String> = Self::static_dims()
            .iter()
            .map(|d| d.map_or("_".to_string(), |n| n.to_string()))
            .collect();
        format!("[{}]", parts.join(", "))
    }
}

/// A shape whose every dim is static, so it has a single value.
pub trait ConstShape: Shape {
    /// The shape's value.
    const VALUE: Self;
}
