//! # Forma
//!
//! Deep learning in Rust where a model is an annotated struct and shape
//! mistakes are compile errors. This facade re-exports the workspace crates;
//! most programs need only the [`prelude`].
//!
//! ```
//! use forma::prelude::*;
//!
//! let x = Tensor::<(C<2>, C<3>)>::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C)).unwrap();
//! let w = Tensor::<(C<3>, C<4>)>::ones();
//! let y: Tensor<(C<2>, C<4>)> = x.matmul(&w).relu();
//! assert_eq!(y.to_vec()[..4], [6.0, 6.0, 6.0, 6.0]);
//! ```

/// The README's code blocks run as doctests, so its taste of the API stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The PyTorch cheat sheet's Rust blocks (`docs/pytorch.md`) run as
/// doctests too, so every pairing it shows compiles and runs.
#[cfg(doctest)]
#[doc = include_str!("../docs/pytorch.md")]
pub struct PytorchCheatSheetDoctests;

// Inlined, so `cargo doc -p forma` documents every crate's items under
// `forma::` (`forma::nn::layers::Linear`), not only links to the crates.
#[doc(inline)]
pub use forma_core as core;
#[doc(inline)]
pub use forma_cpu as cpu;
#[doc(inline)]
pub use forma_cuda as cuda;
#[doc(inline)]
pub use forma_macros as macros;
#[doc(inline)]
pub use forma_nn as nn;

pub use forma_core::{
    DType, Dim, Dtype, Dyn, Error, Float, Layout, One, Result, Rng, Shape, ShapeError, TensorData,
    C,
};
pub use forma_cpu::Cpu;
/// `Module` is both the trait (in the type namespace) and its derive (in the
/// macro namespace), as with serde's `Serialize`; `Shape` and `Tensor` are
/// both a type and a macro that writes one (`Tensor![B, 3, 224, 224]`).
pub use forma_macros::{Module, Sequential, Shape, Tensor};
pub use forma_nn::compile::{compile, compile_with};
pub use forma_nn::{Forward, Module};

/// A tensor of shape `S`, element type `E` (default f32) on device `D`
/// (default the CPU). See [`forma_core::Tensor`] for its methods.
pub type Tensor<S, E = f32, D = Cpu> = forma_core::Tensor<S, E, D>;

pub use forma_core::ops::cat::{cat, stack, try_cat, try_stack};
pub use forma_core::ops::cmp::{try_where_cond, where_cond};
pub use forma_core::ops::conv::Conv2dParams;
pub use forma_core::ops::einsum::{einsum, try_einsum, EinsumOperands};
pub use forma_core::ops::fused::{fused, try_composed, try_fused};
pub use forma_core::ops::pad::PadMode;
pub use forma_core::ops::pool::Pool2dParams;
pub use forma_core::ops::resample::{Interpolation, Resize};
pub use forma_core::shape::Ax;

/// What most programs import: `use forma::prelude::*;`.
pub mod prelude {
    pub use crate::{
        cat, fused, stack, where_cond, Ax, Conv2dParams, Cpu, Dim, Dyn, One, Pool2dParams, Rng,
        Shape, Tensor, C,
    };
    pub use forma_core::device::Device;
    pub use forma_core::dtype::{DType, Dtype, Float};
    pub use forma_core::ops::fused::{BinaryExprs, UnaryExprs};
    pub use forma_macros::{Module, Sequential};
    pub use forma_nn::optim::{NewOptimizer, Optimizer};
    pub use forma_nn::sched::LrScheduler;
    pub use forma_nn::{child, Forward, Module};
    pub use half::{bf16, f16};
}
