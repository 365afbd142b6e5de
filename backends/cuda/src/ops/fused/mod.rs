//! [`FusedKernel`] for [`Cuda`]: no fused kernel yet (an expression is Rust
//! code, and this backend compiles no kernels at run time), so every
//! expression runs as its composed ops, each a CUDA kernel.

use crate::Cuda;
use forma_core::ops::fused::FusedKernel;
use forma_core::Float;

impl<E: Float> FusedKernel<E> for Cuda {}
