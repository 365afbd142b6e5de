//! [`NormKernel`] for [`Cuda`]: no fused layer norm yet, so it runs as its
//! composed ops (mean, variance, scale and shift), each a CUDA kernel.

use crate::Cuda;
use forma_core::ops::norm::NormKernel;
use forma_core::Float;

impl<E: Float> NormKernel<E> for Cuda {}
