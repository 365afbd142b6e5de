//! The [`Module`] trait: how a model's parameters, buffers and children are
//! found, named and visited. `#[derive(Module)]` writes it for a struct; this
//! module implements it for tensors, containers (`Vec`, arrays, `Option`,
//! tuples, `Box`) and plain values (which hold no tensors), and gives every
//! module the PyTorch conveniences (`state_dict`, `load_state_dict`,
//! `named_parameters`, `train`/`eval`, a parameter count, a repr).
//!
//! Names follow PyTorch's `state_dict`: a module's own parameters first, then
//! its buffers, then its children in field order, dotted (`layers.0.fc.weight`).

pub mod convert;
mod cx;
mod forward;
mod impls;
mod params;
mod repr;

pub use convert::{Convert, Retype, ToDevice, ToDtype};
pub use cx::{Cx, Phase, Role};
pub(crate) use forward::ok;
pub use forward::Forward;
pub use impls::{TensorField, Training};
pub use params::{parameters, ParamRef};
pub use repr::py_float;
pub use repr::ReprNode;

use crate::state::{CheckpointError, LoadError, LoadOptions, LoadReport, StateDict, TensorInfo};
use forma_core::{Backend, Dtype, Float, Shape, Tensor};

/// Receives every tensor of a module, read-only.
pub trait Visitor {
    /// One parameter or buffer; `cx.path()` is its dotted name and `cx.role()`
    /// says which it is.
    fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, D>);

    /// A train/eval flag ([`Training`]) of the module at `cx.path()`.
    fn training(&mut self, cx: &Cx, training: bool) {
        let _ = (cx, training);
    }
}

/// Receives every tensor of a module, mutably.
pub trait VisitorMut {
    /// One parameter or buffer; `cx.path()` is its dotted name.
    fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &mut Tensor<S, E, D>);

    /// A train/eval flag ([`Training`]) of the module at `cx.path()`.
    fn training(&mut self, cx: &Cx, training: &mut bool) {
        let _ = (cx, training);
    }
}

/// A model, a layer, or anything a model's field may hold.
///
/// Derive it (`#[derive(Module)]`) rather than implementing it: the derive
/// visits the fields in PyTorch's order and applies the field attributes
/// (`rename`, `skip`, `buffer`, `flatten`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a module, a tensor or a plain value",
    label = "this field's type does not implement `Module`",
    note = "derive `Module` for it, or mark the field `#[module(skip)]`"
)]
pub trait Module {
    /// Whether this type is a tensor (or an optional tensor): a parameter or
    /// buffer of its parent rather than a child module.
    const IS_TENSOR: bool = false;

    /// Visits every tensor below `cx`'s path.
    fn visit<V: Visitor>(&self, cx: &mut Cx, v: &mut V);

    /// Visits every tensor below `cx`'s path, mutably.
    fn visit_mut<V: VisitorMut>(&mut self, cx: &mut Cx, v: &mut V);

    /// The node of this module in a PyTorch-style repr; `None` for what is not
    /// a module (tensors, plain values, an absent `Option`).
    fn describe(&self) -> Option<ReprNode> {
        None
    }

    /// The name of the field `field` in dotted paths: the field's name, its
    /// `rename`, or `""` when flattened. `child!` uses it to name a child in
    /// module paths with the names `state_dict` uses.
    fn child_name(field: &'static str) -> &'static str
    where
        Self: Sized,
    {
        field
    }

    /// Every parameter with its dotted name, like `named_parameters()`.
    fn named_parameters(&self) -> Vec<(String, TensorInfo)>
    where
        Self: Sized,
    {
        collect_infos(self, |r| r == Role::Parameter)
    }

    /// Every buffer (persistent or not) with its dotted name, like `named_buffers()`.
    fn named_buffers(&self) -> Vec<(String, TensorInfo)>
    where
        Self: Sized,
    {
        collect_infos(self, |r| r != Role::Parameter)
    }

    /// Number of parameter elements, like `sum(p.numel() for p in m.parameters())`.
    fn num_parameters(&self) -> usize
    where
        Self: Sized,
    {
        self.named_parameters().iter().map(|(_, i)| i.numel()).sum()
    }

    /// Parameters and persistent buffers, copied to the host, in PyTorch's
    /// key order.
    ///
    /// # Panics
    /// When a device copy fails; see [`Module::try_state_dict`].
    fn state_dict(&self) -> StateDict
    where
        Self: Sized,
    {
        match self.try_state_dict() {
            Ok(sd) => sd,
            Err(e) => panic!("state_dict: {e}"),
        }
    }

    /// Fallible [`Module::state_dict`].
    ///
    /// # Errors
    /// A device copy failed.
    fn try_state_dict(&self) -> forma_core::Result<StateDict>
    where
        Self: Sized,
    {
        crate::state::collect(self)
    }

    /// Loads a state_dict strictly, like `load_state_dict(sd, strict=True)`:
    /// every key must be present, none extra, every shape equal. Values are
    /// copied into the existing tensors (converting float dtypes). Nothing is
    /// written unless every entry fits.
    ///
    /// # Errors
    /// A [`LoadError`] listing every missing, unexpected and mismatched key.
    fn load_state_dict(&mut self, sd: &StateDict) -> Result<LoadReport, LoadError>
    where
        Self: Sized,
    {
        crate::state::load(self, sd, LoadOptions::default())
    }

    /// [`Module::load_state_dict`] with options (`strict: false` loads what
    /// fits and reports the rest).
    ///
    /// # Errors
    /// As [`Module::load_state_dict`]; a non-strict load fails only on shape
    /// or dtype mismatches.
    fn load_state_dict_with(
        &mut self,
        sd: &StateDict,
        options: LoadOptions,
    ) -> Result<LoadReport, LoadError>
    where
        Self: Sized,
    {
        crate::state::load(self, sd, options)
    }

    /// Copies every parameter and buffer of `other`, a module of the same
    /// architecture on another device or in another dtype: the way to move a
    /// model between backends (`let gpu = Net::new(&cuda); gpu.copy_from(&cpu)`).
    ///
    /// # Errors
    /// As [`Module::load_state_dict`].
    fn copy_from<M: Module>(&mut self, other: &M) -> Result<LoadReport, LoadError>
    where
        Self: Sized,
    {
        let sd = other.try_state_dict().map_err(LoadError::device)?;
        self.load_state_dict(&sd)
    }

    /// Saves the state_dict as a safetensors file (atomically: a failure
    /// leaves any previous file intact), loadable by PyTorch with
    /// `load_state_dict(safetensors.torch.load_file(path), strict=True)`.
    ///
    /// # Errors
    /// A [`CheckpointError`] naming the file.
    fn save_safetensors(&self, path: impl AsRef<std::path::Path>) -> Result<(), CheckpointError>
    where
        Self: Sized,
    {
        let path = path.as_ref();
        let sd = self.try_state_dict().map_err(|e| CheckpointError::Io {
            path: path.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })?;
        crate::state::save_file(&sd, path, &Default::default())
    }

    /// Loads a safetensors file (PyTorch's or Forma's) strictly: see
    /// [`Module::load_state_dict`]. On any error the module is unchanged.
    ///
    /// # Errors
    /// A [`CheckpointError`] naming the file and every problem.
    fn load_safetensors(
        &mut self,
        path: impl AsRef<std::path::Path>,
    ) -> Result<LoadReport, CheckpointError>
    where
        Self: Sized,
    {
        self.load_safetensors_with(path, LoadOptions::default())
    }

    /// [`Module::load_safetensors`] with options (`strict: false` reports
    /// what was skipped).
    ///
    /// # Errors
    /// As [`Module::load_safetensors`].
    fn load_safetensors_with(
        &mut self,
        path: impl AsRef<std::path::Path>,
        options: LoadOptions,
    ) -> Result<LoadReport, CheckpointError>
    where
        Self: Sized,
    {
        crate::state::file::load_file_into(self, path.as_ref(), options)
    }

    /// Sets every [`Training`] flag below this module, like `train(mode)`.
    fn set_training(&mut self, training: bool)
    where
        Self: Sized,
    {
        struct Set(bool);
        impl VisitorMut for Set {
            fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, _: &Cx, _: &mut Tensor<S, E, D>) {}
            fn training(&mut self, _: &Cx, flag: &mut bool) {
                *flag = self.0;
            }
        }
        self.visit_mut(&mut Cx::new(), &mut Set(training));
    }

    /// Training mode for this module and all its children, like `train()`.
    fn train(&mut self)
    where
        Self: Sized,
    {
        self.set_training(true);
    }

    /// Evaluation mode for this module and all its children, like `eval()`.
    fn eval(&mut self)
    where
        Self: Sized,
    {
        self.set_training(false);
    }

    /// Whether the module is in training mode (its first [`Training`] flag;
    /// `true` for a module that has none, like PyTorch's default).
    fn is_training(&self) -> bool
    where
        Self: Sized,
    {
        struct First(Option<bool>);
        impl Visitor for First {
            fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, _: &Cx, _: &Tensor<S, E, D>) {}
            fn training(&mut self, _: &Cx, flag: bool) {
                self.0.get_or_insert(flag);
            }
        }
        let mut f = First(None);
        self.visit(&mut Cx::new(), &mut f);
        f.0.unwrap_or(true)
    }

    /// The same model with element type `E2` on its own device, like
    /// `model.to(torch.bfloat16)`: a converted copy (see [`Retype`]; the
    /// model must be generic over `E` and `D`, which the compiler checks).
    ///
    /// # Errors
    /// A model without a tensor to take its device from (use
    /// [`Retype::try_retype`] with a device); a device failure.
    fn try_to_dtype<E2: Float>(&self) -> forma_core::Result<<Self as ToDtype<E2>>::Out>
    where
        Self: ToDtype<E2>,
    {
        ToDtype::try_to_dtype_copy(self)
    }

    /// [`Module::try_to_dtype`], panicking on its errors.
    ///
    /// # Panics
    /// When [`Module::try_to_dtype`] fails.
    #[track_caller]
    fn to_dtype<E2: Float>(&self) -> <Self as ToDtype<E2>>::Out
    where
        Self: ToDtype<E2>,
    {
        ok(self.try_to_dtype())
    }

    /// The same model on `device`, like `model.to(device)`: a converted
    /// copy (see [`Retype`]).
    ///
    /// # Errors
    /// A device failure.
    fn try_to_device<D2: Backend>(
        &self,
        device: &D2,
    ) -> forma_core::Result<<Self as ToDevice<D2>>::Out>
    where
        Self: ToDevice<D2>,
    {
        ToDevice::try_to_device_copy(self, device)
    }

    /// [`Module::try_to_device`], panicking on its errors.
    ///
    /// # Panics
    /// When [`Module::try_to_device`] fails.
    #[track_caller]
    fn to_device<D2: Backend>(&self, device: &D2) -> <Self as ToDevice<D2>>::Out
    where
        Self: ToDevice<D2>,
    {
        ok(self.try_to_device(device))
    }

    /// Clears the gradient of every parameter, like `zero_grad(set_to_none=True)`.
    fn zero_grad(&self)
    where
        Self: Sized,
    {
        struct Zero;
        impl Visitor for Zero {
            fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, _: &Cx, t: &Tensor<S, E, D>) {
                t.zero_grad();
            }
        }
        self.visit(&mut Cx::new(), &mut Zero);
    }

    /// The PyTorch-style repr, as `print(model)` shows it.
    fn repr(&self) -> String
    where
        Self: Sized,
    {
        self.describe().map(|n| n.to_string()).unwrap_or_default()
    }
}

fn collect_infos<M: Module>(m: &M, keep: impl Fn(Role) -> bool) -> Vec<(String, TensorInfo)> {
    struct Infos<F>(Vec<(String, TensorInfo)>, F);
    impl<F: Fn(Role) -> bool> Visitor for Infos<F> {
        fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, D>) {
            if (self.1)(cx.role()) {
                self.0.push((cx.path().to_string(), TensorInfo::of(t)));
            }
        }
    }
    let mut v = Infos(Vec::new(), keep);
    m.visit(&mut Cx::new(), &mut v);
    v.0
}

/// The tensor a visitor received, as element type `F` on device `B` when it
/// is one (a visitor's `tensor` method is generic over every dtype, since a
/// module may hold `i64` buffers beside its float parameters).
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::module::{downcast_mut, Cx, VisitorMut};
///
/// // Plain SGD over every f32 parameter, through the mutable traversal.
/// struct Sgd(f64);
/// impl VisitorMut for Sgd {
///     fn tensor<S: Shape, E: Dtype, D: forma::core::Backend>(&mut self, _: &Cx, t: &mut forma::core::Tensor<S, E, D>) {
///         let Some(p) = downcast_mut::<_, _, _, f32, Cpu>(t) else { return };
///         if let Some(g) = p.grad() {
///             let _guard = forma::core::tape::no_grad();
///             let flat = p.flatten_all();
///             flat.assign(&(&flat - &g.flatten_all().mul_scalar(self.0)));
///         }
///     }
/// }
/// let mut w = Tensor::<(C<2>,)>::ones().requires_grad();
/// (&w * &w).sum_all().backward();
/// w.visit_mut(&mut Cx::new(), &mut Sgd(0.25));
/// assert_eq!(w.to_vec(), [0.5, 0.5]);
/// ```
pub fn downcast_mut<S: Shape, E: Dtype, D: Backend, F: Dtype, B: Backend>(
    t: &mut Tensor<S, E, D>,
) -> Option<&mut Tensor<S, F, B>> {
    (t as &mut dyn std::any::Any).downcast_mut()
}

/// The read-only form of [`downcast_mut`].
pub fn downcast_ref<S: Shape, E: Dtype, D: Backend, F: Dtype, B: Backend>(
    t: &Tensor<S, E, D>,
) -> Option<&Tensor<S, F, B>> {
    (t as &dyn std::any::Any).downcast_ref()
}
