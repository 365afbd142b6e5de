//! Forma's core: shapes ([`shape`]), element types ([`dtype`]), the backend
//! abstraction ([`device`]), the [`Tensor`] type and the op definitions ([`ops`]).
//!
//! Static types live here, at the API surface; everything below the
//! [`device::Backend`] traits works on erased sizes ([`layout::Layout`]), so that
//! kernels are compiled once per dtype and never per shape.

pub mod autocast;
pub mod device;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod layout;
pub mod ops;
pub mod rng;
pub mod shape;
pub mod tape;
pub mod tensor;

pub use device::{Backend, DefaultDevice};
pub use dtype::{DType, Dtype, Float};
pub use error::{Error, Result, ShapeError};
pub use layout::Layout;
pub use rng::Rng;
pub use shape::{Dim, Dyn, One, Shape, C};
pub use tensor::{Tensor, TensorData};
