//! A model with another element type or on another device, like
//! `model.to(torch.bfloat16)` and `model.to("cuda")`: [`Retype`] gives the
//! same model type with `E` and `D` replaced, its parameters converted
//! (still parameters), its buffers converted (a float buffer takes the new
//! element type; an `i64` counter keeps its own), names and train/eval mode
//! unchanged.
//!
//! `#[derive(Module)]` implements it for a struct generic over type
//! parameters named `E` (the element type) and `D` (the device), as every
//! layer is; a model with fixed types (`Linear<4, 2>` fields, no `E`/`D`)
//! has no conversion and calling one is a compile error saying so (one:
//! [`Module::to_dtype`] and [`Module::to_device`] need one bound each,
//! [`ToDtype`] and [`ToDevice`], derived beside `Retype`).
//!
//! ```
//! use forma::prelude::*;
//! use forma::nn::layers::Linear;
//!
//! #[derive(Module)]
//! struct Net<E: Float = f32, D: Device<E> = Cpu> {
//!     fc: Linear<4, 2, E, D>,
//! }
//!
//! let mut rng = Rng::seed_from(0);
//! let net: Net = Net { fc: Linear::new(&Cpu, &mut rng) };
//! let half: Net<bf16> = net.to_dtype::<bf16>();   // `Module::to_dtype`
//! assert_eq!(half.fc.weight.to_vec()[0], bf16::from_f32(net.fc.weight.to_vec()[0]));
//! let keys = |sd: forma::nn::StateDict| sd.keys().map(String::from).collect::<Vec<_>>();
//! assert_eq!(keys(half.state_dict()), keys(net.state_dict()));
//! ```

use super::Module;
use forma_core::device::Device;
use forma_core::{Backend, Dtype, Error, Float, Result, Shape, Tensor};
use std::any::Any;

/// Converts a model's field to the same field with another element type
/// and device (`T`, on `D2`): the derive calls it on every field whose type
/// names `E` or `D`. Tensors, `Option`, `Vec` and `Box` implement it, and
/// the derive implements it for each struct generic over `E` and `D`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be converted to `{T}`",
    label = "no conversion to another element type or device",
    note = "a converted model's fields must be tensors, modules generic over `E` and `D` \
            (derived), `Option`/`Vec`/`Box` of those, or `Clone` values that name neither"
)]
pub trait Convert<T, D2: Backend> {
    /// The converted value.
    ///
    /// # Errors
    /// A device failure (a transfer or an allocation).
    fn try_convert(&self, device: &D2) -> Result<T>;
}

impl<S: Shape, E: Dtype, F: Dtype, D: Backend, D2: Backend> Convert<Tensor<S, F, D2>, D2>
    for Tensor<S, E, D>
{
    fn try_convert(&self, device: &D2) -> Result<Tensor<S, F, D2>> {
        self.try_converted(device)
    }
}

impl<T: Convert<U, D2>, U, D2: Backend> Convert<Option<U>, D2> for Option<T> {
    fn try_convert(&self, device: &D2) -> Result<Option<U>> {
        self.as_ref().map(|t| t.try_convert(device)).transpose()
    }
}

impl<T: Convert<U, D2>, U, D2: Backend> Convert<Vec<U>, D2> for Vec<T> {
    fn try_convert(&self, device: &D2) -> Result<Vec<U>> {
        self.iter().map(|t| t.try_convert(device)).collect()
    }
}

impl<T: Convert<U, D2>, U, D2: Backend> Convert<Box<U>, D2> for Box<T> {
    fn try_convert(&self, device: &D2) -> Result<Box<U>> {
        Ok(Box::new((**self).try_convert(device)?))
    }
}

/// The message of a model that is not generic over `E` and `D`, shared by
/// [`Retype`], [`ToDtype`] and [`ToDevice`], the traits it wraps.
macro_rules! not_generic {
    ($($item:item)*) => {$(
        #[diagnostic::on_unimplemented(
            message = "`{Self}` cannot change its element type or device",
            label = "not generic over its element type `E` and device `D`",
            note = "declare the model generic over both, as the layers are: \
                    `struct Net<E: Float = f32, D: Device<E> = Cpu> {{ fc: Linear<4, 2, E, D> }}`, \
                    and derive `Module`"
        )]
        $item
    )*};
}

not_generic! {
    /// A model that can be rebuilt with another element type and device, like
    /// `nn.Module.to(dtype)` / `.to(device)`: see the [module docs](self).
    /// `#[derive(Module)]` implements it for a struct with type parameters
    /// `E: Float` and `D: Device<E>`. Call it through [`Module::to_dtype`] and
    /// [`Module::to_device`], which every module has and which say, at compile
    /// time, when a model is not generic enough to convert.
    pub trait Retype: Module + Sized {
        /// The element type now (`E`).
        type Elem: Float;
        /// The device type now (`D`).
        type Dev: Device<Self::Elem>;
        /// The same model with element type `E2` on device type `D2`.
        type With<E2: Float, D2: Device<E2>>: Module;

        /// The model with element type `E2` on `device`, like
        /// `model.to(device, dtype)`: a copy; this one is unchanged.
        ///
        /// # Errors
        /// A device failure.
        fn try_retype<E2: Float, D2: Device<E2>>(&self, device: &D2) -> Result<Self::With<E2, D2>>
        where
            Self: Convert<Self::With<E2, D2>, D2>;
    }
}

not_generic! {
    /// A model that [`Module::to_dtype`] converts to element type `E2` on its
    /// own device: `#[derive(Module)]` implements it beside [`Retype`] for a
    /// struct generic over `E: Float` and `D: Device<E>`, when every field
    /// converts. One bound with its own result type, so that a model that is
    /// not generic is one error (a bound on `Retype` plus one on `Convert` of
    /// `Retype`'s type was two).
    pub trait ToDtype<E2: Float>: Module {
        /// The converted model, [`Retype::With`]`<E2, Self::Dev>`.
        type Out: Module;

        /// [`Module::try_to_dtype`]'s work.
        ///
        /// # Errors
        /// A model without a tensor to take its device from; a device failure.
        fn try_to_dtype_copy(&self) -> Result<Self::Out>;
    }
}

not_generic! {
    /// A model that [`Module::to_device`] moves to a device of type `D2`,
    /// keeping its element type; derived as [`ToDtype`] is.
    pub trait ToDevice<D2: Backend>: Module {
        /// The moved model, [`Retype::With`]`<Self::Elem, D2>`.
        type Out: Module;

        /// [`Module::try_to_device`]'s work.
        ///
        /// # Errors
        /// A device failure.
        fn try_to_device_copy(&self, device: &D2) -> Result<Self::Out>;
    }
}

/// The device of the first tensor of `model` on a `D` device.
#[doc(hidden)]
pub fn device_of<D: Backend>(model: &impl Module) -> Result<D> {
    struct Find<D>(Option<D>);
    impl<D: Backend> super::Visitor for Find<D> {
        fn tensor<S: Shape, E: Dtype, B: Backend>(&mut self, _: &super::Cx, t: &Tensor<S, E, B>) {
            if self.0.is_none() {
                self.0 = (t.device() as &dyn Any).downcast_ref::<D>().cloned();
            }
        }
    }
    let mut find = Find(None);
    model.visit(&mut super::Cx::new(), &mut find);
    find.0.ok_or_else(|| {
        Error::invalid(
            "to_dtype",
            "the model holds no tensor to take its device from: call `try_retype(&device)`",
        )
    })
}

/// What the derive's generated code names.
#[doc(hidden)]
pub mod __private {
    pub use super::device_of;
    pub use forma_core::device::Device;
    pub use forma_core::{Float, Result};

    /// A field a conversion copies as it is (it names neither `E` nor `D`):
    /// `Clone`, behind a parameter so that the derive's bound on it is not
    /// a trivially false one when the field is not `Clone`.
    pub trait Keep<X> {
        fn keep(&self) -> Self;
    }

    impl<T: Clone, X> Keep<X> for T {
        fn keep(&self) -> Self {
            self.clone()
        }
    }
}
