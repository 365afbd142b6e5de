//! [`LinearKernel`] for [`Cuda`]: no fused bias yet, so a linear map runs
//! as its composed ops (the product, then the bias added).

use crate::Cuda;
use forma_core::ops::linear::LinearKernel;
use forma_core::Float;

impl<E: Float> LinearKernel<E> for Cuda {}
