//! Neural-network building blocks in PyTorch's names and defaults. Layers,
//! losses, optimizers and data loading arrive with the nn issue; the tensor
//! kernels they wrap (conv, pooling, softmax, embedding) are in `forma-core`.

/// Activation functions as plain functions, so layers and user code share them.
pub mod functional {
    pub use forma_core::ops::cat::{cat, stack};
    pub use forma_core::ops::cmp::where_cond;
}
