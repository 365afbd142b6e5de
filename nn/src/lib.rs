//! Neural-network building blocks in PyTorch's names and defaults: the
//! [`Module`] trait that `#[derive(Module)]` implements, state dicts, and the
//! layers. The tensor kernels the layers wrap (conv, pooling, softmax,
//! embedding) are in `forma-core`.

pub mod capture;
pub mod compile;
pub mod data;
pub mod hooks;
pub mod init;
pub mod layers;
pub mod loss;
pub mod module;
pub mod optim;
pub mod sched;
pub mod scope;
pub mod shape_step;
pub mod state;

pub use forma_core::tape::HookHandle;
pub use module::{Cx, Forward, Module, ReprNode, Role, TensorField, Training, Visitor, VisitorMut};
pub use state::{
    Checkpoint, CheckpointError, LoadError, LoadOptions, LoadReport, StateDict, TensorInfo,
};

/// Free functions of several tensors, PyTorch's `torch.cat`, `torch.stack`,
/// `torch.where` and `torch.nn.functional.batch_norm` (which updates the
/// running statistics it is given). What PyTorch writes as
/// `torch.nn.functional.*` on one tensor (activations, softmax, layer
/// normalisation, dropout masks) is a tensor method in Forma: `x.relu()`,
/// `x.gelu()`, `x.softmax::<1>()`, `x.layer_norm(w, b, eps)`.
pub mod functional {
    pub use crate::layers::norm::batch_norm;
    pub use forma_core::ops::cat::{cat, stack};
    pub use forma_core::ops::cmp::where_cond;
}
