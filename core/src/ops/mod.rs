//! Op definitions. Each op (or table of elementwise ops) owns a module here
//! with its shape rule (as bounds from [`crate::shape`]), its kernel trait, its
//! public methods and docs; backends implement the kernel traits in their own
//! `ops/` folders. See `README.md` in this folder for how to add an op.

/// Whether a table row's derivative reads an operand: `_` in its `d|..|`
/// parameters says it does not (and the compiler holds the row to it).
macro_rules! reads {
    (_) => {
        false
    };
    ($name:ident) => {
        true
    };
}
pub(crate) use reads;

/// The op list: every op family with a kernel trait, once. Each line is
/// `module::KernelTrait`; [`crate::device::Device`] and its blanket impl
/// are built from it, so a new kernel op is its module (declared below)
/// and one line here. Calls `$callback! { family::Kernel, ... }`.
#[macro_export]
#[doc(hidden)]
macro_rules! kernel_ops {
    ($callback:ident) => {
        $callback! {
            unary::UnaryKernel,
            binary::BinaryKernel,
            cmp::CmpKernel,
            reduce::ReduceKernel,
            cumsum::CumsumKernel,
            softmax::SoftmaxKernel,
            matmul::MatmulKernel,
            index::IndexKernel,
            conv::ConvKernel,
            pool::PoolKernel,
            update::UpdateKernel,
            fused::FusedKernel,
            attention::AttentionKernel,
            norm::NormKernel,
            linear::LinearKernel,
            rnn::RnnKernel,
        }
    };
}

pub mod attention;
pub mod batch_norm;
pub mod binary;
pub mod cat;
pub mod cmp;
pub mod conv;
#[doc(hidden)] // a public `cumsum` would make rustc print `shape::op::cumsum` in full
pub mod cumsum;
pub mod einsum;
pub mod fused;
pub mod index;
pub mod int_reduce;
pub mod linear;
#[doc(hidden)] // a public `matmul` here would make rustc print `shape::op::matmul` in full
pub mod matmul;
pub mod norm;
pub mod packed_weights;
#[doc(hidden)] // as `cumsum` (`shape::op::pad`)
pub mod pad;
pub mod pool;
pub mod reduce;
pub mod resample;
pub mod rnn;
#[doc(hidden)] // as `cumsum` (`shape::op::roll`)
pub mod roll;
#[doc(hidden)] // as `cumsum` (`shape::op::softmax`)
pub mod softmax;
#[doc(hidden)] // as `cumsum` (`shape::op::sort`)
pub mod sort;
pub mod tri;
pub mod unary;
pub mod update;
