//! The kernel traits of `forma_core::ops` for [`Cuda`](crate::Cuda), one
//! folder per op: `mod.rs` (the launch) beside its `.cu` source.

pub(crate) mod attention;
pub(crate) mod binary;
pub(crate) mod cmp;
pub(crate) mod conv;
pub(crate) mod copy;
pub(crate) mod fused;
pub(crate) mod index;
pub(crate) mod linear;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod pool;
pub(crate) mod reduce;
pub(crate) mod softmax;
pub(crate) mod unary;
pub(crate) mod update;
