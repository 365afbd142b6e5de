//! [`AttentionKernel`] for [`Cuda`]: no fused kernel yet, so attention runs
//! as its composed ops (products, mask, softmax), each a CUDA kernel.

use crate::Cuda;
use forma_core::ops::attention::AttentionKernel;
use forma_core::Float;

impl<E: Float> AttentionKernel<E> for Cuda {}
