//! The [`Tensor`] type: a typed view ([`Shape`], [`Dtype`], [`Backend`]) over a
//! reference-counted storage.

mod convert;
mod create;
mod data;
mod fmt;
mod storage;
mod view;

pub use data::{dtype_size, TensorData};
pub use storage::{StorageCell, Versioned};

use crate::device::Backend;
use crate::dtype::{DType, Dtype};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::shape::{Dims, Shape};
use crate::tape::Raw;
use std::marker::PhantomData;
use std::sync::{Arc, RwLockReadGuard, RwLockWriteGuard};

/// An n-dimensional array whose shape `S`, element type `E` and device `D` are
/// part of its type.
///
/// Cloning is cheap: clones and views (transpose, narrow, expand, ...) share the
/// storage. The facade crate `forma` re-exports it with defaults, so a plain
/// `Tensor<(Dyn, C<10>)>` is f32 on the CPU.
pub struct Tensor<S: Shape, E: Dtype, D: Backend> {
    pub(crate) storage: Arc<StorageCell<D::Storage<E>>>,
    pub(crate) layout: Layout,
    pub(crate) device: D,
    /// Autograd state; `None` for a tensor that needs no gradient.
    pub(crate) var: Option<Arc<crate::tape::Var<E, D>>>,
    pub(crate) _shape: PhantomData<S>,
}

impl<S: Shape, E: Dtype, D: Backend> Clone for Tensor<S, E, D> {
    fn clone(&self) -> Self {
        Tensor {
            storage: Arc::clone(&self.storage),
            layout: self.layout,
            device: self.device.clone(),
            var: self.var.clone(),
            _shape: PhantomData,
        }
    }
}

/// Unwraps a result whose error the types could not rule out (a `Dyn` size
/// mismatch, a backend failure): the plain form of a `try_` op.
#[track_caller]
pub(crate) fn ok<T>(r: Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

impl<S: Shape, E: Dtype, D: Backend> Tensor<S, E, D> {
    /// Wraps a new storage with a row-major layout of `dims`.
    pub(crate) fn from_storage(storage: D::Storage<E>, dims: &[usize], device: D) -> Self {
        debug_assert_eq!(dims.len(), S::RANK);
        let t = Tensor {
            storage: Arc::new(StorageCell::new(storage)),
            layout: Layout::contiguous(dims),
            device,
            var: None,
            _shape: PhantomData,
        };
        if crate::graph::capturing() {
            crate::graph::born(&t.val());
        }
        t
    }

    /// A new view over the same storage, possibly of another shape type.
    pub(crate) fn view_as<S2: Shape>(&self, layout: Layout) -> Tensor<S2, E, D> {
        debug_assert_eq!(layout.rank(), S2::RANK);
        Tensor {
            storage: Arc::clone(&self.storage),
            layout,
            device: self.device.clone(),
            var: None,
            _shape: PhantomData,
        }
    }

    /// The same tensor (and the same autograd variable) under another shape
    /// type with the same sizes.
    pub(crate) fn retype<S2: Shape>(self) -> Tensor<S2, E, D> {
        debug_assert!(S2::from_dims(&self.layout.dims).is_some());
        Tensor {
            storage: self.storage,
            layout: self.layout,
            device: self.device,
            var: self.var,
            _shape: PhantomData,
        }
    }

    /// A view with layout `layout` whose gradient is `back(output gradient)`.
    pub(crate) fn view_with_grad<S2: Shape>(
        &self,
        layout: Layout,
        name: &'static str,
        back: impl Fn(&crate::tape::Raw<E, D>) -> Result<crate::tape::Raw<E, D>> + Send + 'static,
    ) -> Tensor<S2, E, D> {
        self.view_as::<S2>(layout)
            .record(name, std::slice::from_ref(&self.var), vec![], move |g| {
                Ok(vec![Some(back(g)?)])
            })
    }

    /// Read access to the storage (for kernels).
    pub fn storage(&self) -> RwLockReadGuard<'_, D::Storage<E>> {
        self.storage.read()
    }

    /// Runs `f` with write access to the storage and this tensor's layout, for
    /// an in-place update by code outside Forma's ops: a communication
    /// library reducing a gradient where it lies. Like every in-place write
    /// it bumps the version counter, so a backward that saved this tensor
    /// refuses to run; `f` must keep to the elements the layout addresses.
    pub fn with_storage_mut<R>(&self, f: impl FnOnce(&mut D::Storage<E>, &Layout) -> R) -> R {
        let mut storage = self.storage_mut();
        f(&mut storage, &self.layout)
    }

    /// Write access to the storage for an in-place update; bumps the version
    /// counter. Crate-private: users write in place through the checked
    /// methods ([`Tensor::assign`], [`Tensor::fill`], the optimizers), so a
    /// tensor saved for a backward cannot change behind the tape's back.
    pub(crate) fn storage_mut(&self) -> RwLockWriteGuard<'_, D::Storage<E>> {
        if crate::graph::capturing() {
            crate::graph::write(
                "an in-place op",
                Arc::as_ptr(&self.storage) as *const () as usize,
            );
        }
        self.storage.write()
    }

    /// How many in-place writes this tensor's storage has seen, like
    /// PyTorch's `tensor._version` (views and clones share the counter).
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>,)>::zeros();
    /// assert_eq!(x.version(), 0);
    /// x.fill(1.0);
    /// assert_eq!(x.version(), 1);
    /// ```
    pub fn version(&self) -> u64 {
        self.storage.version()
    }

    /// This tensor as the tape saves it for a backward: its storage's version
    /// counter and the version now. Pass it to [`Tensor::record`] for every
    /// tensor the backward closure reads.
    pub fn saved(&self) -> crate::tape::Saved {
        crate::tape::Saved::new(&self.storage, &self.layout.dims, E::DTYPE)
    }

    /// The typed shape (static dims and the runtime sizes of `Dyn` dims).
    pub fn shape(&self) -> S {
        S::from_dims(&self.layout.dims).expect("a tensor's layout always fits its shape type")
    }

    /// The sizes, like `tensor.shape` in PyTorch.
    pub fn dims(&self) -> Dims {
        self.layout.dims
    }

    /// The size of one axis.
    ///
    /// # Panics
    /// If `axis >= rank`.
    pub fn size(&self, axis: usize) -> usize {
        self.layout.dims[axis]
    }

    /// The strided view the kernels see.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        S::RANK
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// The runtime dtype tag.
    pub fn dtype(&self) -> DType {
        E::DTYPE
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// Whether the view is row-major and dense.
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// Whether two tensors share a storage (one is a view of the other).
    pub fn shares_storage<S2: Shape>(&self, other: &Tensor<S2, E, D>) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// The elements in row-major order, on the host.
    #[track_caller]
    pub fn to_vec(&self) -> Vec<E> {
        ok(self.try_to_vec())
    }

    /// Fallible [`Tensor::to_vec`] (a device copy can fail).
    pub fn try_to_vec(&self) -> Result<Vec<E>> {
        if crate::graph::capturing() {
            crate::graph::host_read("to_vec", &self.val());
        }
        self.device.to_vec(&self.storage(), &self.layout)
    }

    /// The single value of a one-element tensor, like `tensor.item()`.
    ///
    /// # Panics
    /// If the tensor does not hold exactly one element.
    pub fn item(&self) -> E {
        let v = self.to_vec();
        assert_eq!(
            v.len(),
            1,
            "item: the tensor has {} elements, not 1",
            v.len()
        );
        v[0]
    }

    /// A row-major tensor with the same values: the same storage when already
    /// contiguous, else a copy.
    pub fn contiguous(&self) -> Self {
        if self.is_contiguous() {
            return self.clone();
        }
        let s = ok(self.device.contiguous(&self.storage(), &self.layout));
        let y = Self::from_storage(s, &self.layout.dims, self.device.clone()).record(
            "contiguous",
            std::slice::from_ref(&self.var),
            vec![],
            |g| Ok(vec![Some(g.clone())]),
        );
        if crate::graph::capturing() {
            crate::graph::alias(&self.val(), &y.val());
        }
        y
    }

    /// Converts to another dtype (a copy), like `tensor.to(dtype)`.
    ///
    /// Differentiable, as in PyTorch: on the tape, the result's gradient is
    /// cast back to this tensor's dtype (a cast to a non-float type, whose
    /// result cannot carry a gradient, panics there; detach first).
    ///
    /// # Panics
    /// A cast of a tensor on the tape to a type without gradients (see
    /// [`Tensor::try_to_dtype`]).
    #[track_caller]
    pub fn to_dtype<F: Dtype>(&self) -> Tensor<S, F, D> {
        ok(self.try_to_dtype())
    }

    /// Fallible [`Tensor::to_dtype`].
    ///
    /// # Errors
    /// A tensor on the tape cast to a type that cannot carry a gradient
    /// (an integer or bool type: call `.detach()` first to cut the graph
    /// explicitly); a device failure.
    pub fn try_to_dtype<F: Dtype>(&self) -> Result<Tensor<S, F, D>> {
        let s = self.device.cast::<E, F>(&self.storage(), &self.layout)?;
        let mut y = Tensor::from_storage(s, &self.layout.dims, self.device.clone());
        crate::graph::note_op!(crate::graph::Op::Cast { to: F::DTYPE }, [self], y);
        if let Some(var) = self.var.as_ref().filter(|_| crate::tape::is_grad_enabled()) {
            let ops = self.device.grad_ops::<F>().ok_or_else(|| {
                Error::invalid(
                    "to_dtype",
                    format!(
                        "a cast to {} cannot carry a gradient: call `.detach()` first to cut the graph explicitly",
                        F::DTYPE
                    ),
                )
            })?;
            let node = crate::tape::Node::crossing("to_dtype", Arc::clone(var), |g: &Raw<F, D>| {
                let s = g.device.cast::<F, E>(&g.storage(), &g.layout)?;
                Ok(Raw::new(s, &g.layout.dims, g.device.clone()))
            });
            y.var = Some(Arc::new(crate::tape::Var::from_node(node, ops)));
        }
        Ok(y)
    }

    /// Copies to another device (or another instance of the same backend),
    /// like `tensor.to(device)`. Differentiable: the result's gradient is
    /// moved back.
    ///
    /// # Panics
    /// See [`Tensor::try_to_device`].
    #[track_caller]
    pub fn to_device<D2: Backend>(&self, device: &D2) -> Tensor<S, E, D2> {
        ok(self.try_to_device(device))
    }

    /// Fallible [`Tensor::to_device`].
    ///
    /// # Errors
    /// A tensor on the tape moved to a device without gradient arithmetic
    /// for its dtype; a transfer failure.
    pub fn try_to_device<D2: Backend>(&self, device: &D2) -> Result<Tensor<S, E, D2>> {
        let host = self.try_to_vec()?;
        let s = device.upload(host)?;
        let mut y = Tensor::from_storage(s, &self.layout.dims, device.clone());
        if let Some(var) = self.var.as_ref().filter(|_| crate::tape::is_grad_enabled()) {
            let ops = device.grad_ops::<E>().ok_or_else(|| {
                Error::invalid(
                    "to_device",
                    format!(
                        "{} has no gradient arithmetic for {}: call `.detach()` first to cut the graph explicitly",
                        device.name(),
                        E::DTYPE
                    ),
                )
            })?;
            let home = self.device.clone();
            let node =
                crate::tape::Node::crossing("to_device", Arc::clone(var), move |g: &Raw<E, D2>| {
                    let host = g.device.to_vec(&g.storage(), &g.layout)?;
                    Ok(Raw::new(home.upload(host)?, &g.layout.dims, home.clone()))
                });
            y.var = Some(Arc::new(crate::tape::Var::from_node(node, ops)));
        }
        Ok(y)
    }

    /// This tensor's values as element type `F` on `device`, as
    /// `nn.Module.to` converts a parameter: off the tape, and a new leaf
    /// that requires a gradient when this tensor is one (a parameter stays
    /// a parameter, with no gradient yet).
    ///
    /// # Errors
    /// A parameter converted to a type that cannot carry a gradient (an
    /// integer or bool type); a device failure.
    pub fn try_converted<F: Dtype, D2: Backend>(&self, device: &D2) -> Result<Tensor<S, F, D2>> {
        let _off = crate::tape::no_grad();
        let mut y = self.try_to_dtype::<F>()?.try_to_device(device)?;
        if self.var.as_ref().is_some_and(|v| v.is_leaf()) {
            let ops = device.grad_ops::<F>().ok_or_else(|| {
                Error::invalid(
                    "to_dtype",
                    format!(
                        "a parameter converted to {} cannot require a gradient",
                        F::DTYPE
                    ),
                )
            })?;
            y.var = Some(Arc::new(crate::tape::Var::leaf(ops)));
        }
        Ok(y)
    }

    /// Checks that another operand lives on the same device.
    pub(crate) fn same_device<S2: Shape, E2: Dtype>(
        &self,
        op: &'static str,
        other: &Tensor<S2, E2, D>,
    ) -> Result<()> {
        if self.device == other.device {
            Ok(())
        } else {
            Err(Error::invalid(
                op,
                format!(
                    "operands are on different devices: {} and {}",
                    self.device.name(),
                    other.device.name()
                ),
            ))
        }
    }
}
