//! [`UpdateKernel`] for [`Cuda`]: no fused kernel yet, so every update is
//! declined and optimizers run their rules as composed ops.

use crate::Cuda;
use forma_core::ops::update::UpdateKernel;
use forma_core::Float;

impl<E: Float> UpdateKernel<E> for Cuda {}
