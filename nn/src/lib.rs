//! Neural-network building blocks in PyTorch's names and defaults: the
//! [`Module`] trait that `#[derive(Module)]` implements, state dicts, and the
//! layers. The tensor kernels the layers wrap (conv, pooling, softmax,
//! embedding) are in `forma-core`.

pub mod data;
pub mod hooks;
pub mod init;
pub mod layers;
pub mod loss;
pub mod module;
pub mod optim;
pub mod sched;
pub mod scope;
pub mod state;

pub use forma_core::tape::HookHandle;
pub use module::{Cx, Forward, Module, ReprNode, Role, TensorField, Training, Visitor, VisitorMut};
pub use state::{
    Checkpoint, CheckpointError, LoadError, LoadOptions, LoadReport, StateDict, TensorInfo,
};

/// Activation functions as plain functions, so layers and user code share them.
pub mod functional {
    pub use forma_core::ops::cat::{cat, stack};
    pub use forma_core::ops::cmp::where_cond;
}
