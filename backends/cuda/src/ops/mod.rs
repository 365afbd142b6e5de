//! The kernel traits of `forma_core::ops` for [`Cuda`](crate::Cuda), one
//! folder per op family: `mod.rs` (the launch) beside its `.cu` source.
//!
//! The two lists below are the only places a family is named: a family
//! with kernels is a module here, and its sources are found through it; a
//! kernel trait this backend has no kernels for is listed once as composed.

use crate::Cuda;
use forma_core::Float;

/// Declares the family modules and [`all_sources`] from them: a `float`
/// family compiles its `source(dtype)` once per float dtype under the key
/// `family/dtype`; an `own` family lists its modules itself (`sources()`).
macro_rules! cuda_families {
    (float: [$($f:ident),* $(,)?], own: [$($o:ident),* $(,)?] $(,)?) => {
        $(pub(crate) mod $f;)*
        $(pub(crate) mod $o;)*

        /// Every module source the backend can compile, as `(key, source
        /// without the prelude)`.
        pub(crate) fn all_sources() -> Vec<(String, String)> {
            let mut v = Vec::new();
            $(v.extend($o::sources());)*
            for d in crate::kernels::FLOATS {
                let t = crate::kernels::tag(d);
                $(v.push((format!("{}/{t}", stringify!($f)), $f::source(d)));)*
            }
            v
        }
    };
}

cuda_families! {
    float: [binary, cmp, conv, cumsum, index, pool, reduce, softmax, unary],
    own: [copy, matmul],
}

/// Implements kernel traits with no methods: the traits' defaults decline,
/// and core runs the composed ops instead, each of them a CUDA kernel.
macro_rules! composed_here {
    ($($family:ident :: $kernel:ident),* $(,)?) => {
        $(impl<E: Float> forma_core::ops::$family::$kernel<E> for Cuda {})*
    };
}

// No fused kernels on CUDA yet: layer norm, linear with bias, attention,
// optimizer updates, fused expressions and recurrent cells run as their
// composed ops.
composed_here! {
    norm::NormKernel,
    linear::LinearKernel,
    attention::AttentionKernel,
    update::UpdateKernel,
    fused::FusedKernel,
    rnn::RnnKernel,
}
