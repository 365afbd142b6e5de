//! The backend abstraction. A backend (CPU, CUDA) is a device handle type that
//! implements [`Backend`] (storage, copies, casts) and one kernel trait per op
//! family; each kernel trait is declared beside its op in [`crate::ops`].
//! Kernels take storages and erased [`Layout`]s, never typed shapes, so they
//! are compiled once per dtype whatever shapes a program uses.

use crate::dtype::Dtype;
use crate::error::Result;
use crate::layout::Layout;
use std::fmt::Debug;

/// A compute device: where storages live and kernels run.
pub trait Backend: Clone + Debug + PartialEq + Send + Sync + 'static {
    /// A buffer of `E` on this device.
    type Storage<E: Dtype>: Send + Sync + 'static;

    /// Human name, as PyTorch prints it: `cpu`, `cuda:0`.
    fn name(&self) -> String;

    /// Moves host values into a new storage.
    fn upload<E: Dtype>(&self, data: Vec<E>) -> Result<Self::Storage<E>>;

    /// A storage of `len` copies of `value`.
    fn full<E: Dtype>(&self, len: usize, value: E) -> Result<Self::Storage<E>>;

    /// The elements of a strided view, in row-major order, on the host.
    fn to_vec<E: Dtype>(&self, src: &Self::Storage<E>, layout: &Layout) -> Result<Vec<E>>;

    /// A new row-major storage with the elements of a strided view.
    fn contiguous<E: Dtype>(
        &self,
        src: &Self::Storage<E>,
        layout: &Layout,
    ) -> Result<Self::Storage<E>>;

    /// Copies the elements of `src` (viewed by `src_layout`) into the view
    /// `dst_layout` of `dst`. Both views have the same sizes.
    fn copy_strided<E: Dtype>(
        &self,
        src: &Self::Storage<E>,
        src_layout: &Layout,
        dst: &mut Self::Storage<E>,
        dst_layout: &Layout,
    ) -> Result<()>;

    /// A new row-major storage holding the views `parts` (storage and
    /// layout) joined along `axis`, like `torch.cat`: their sizes agree
    /// outside `axis` (the caller has checked). The default writes each
    /// piece into a zero-filled storage; a backend may write each element
    /// once instead.
    fn concat<E: Dtype>(
        &self,
        parts: &[(&Self::Storage<E>, &Layout)],
        axis: usize,
    ) -> Result<Self::Storage<E>> {
        let Some((_, first)) = parts.first() else {
            return self.full(0, E::default());
        };
        let mut dims = first.dims;
        dims[axis] = parts.iter().map(|(_, l)| l.dims[axis]).sum();
        let mut out = self.full(dims.numel(), E::default())?;
        let whole = Layout::contiguous(&dims);
        let mut start = 0;
        for (s, l) in parts {
            let len = l.dims[axis];
            self.copy_strided(s, l, &mut out, &whole.narrow(axis, start, len))?;
            start += len;
        }
        Ok(out)
    }

    /// Converts a strided view to another dtype, into a new row-major storage,
    /// with `torch.Tensor.to`'s rounding rules.
    fn cast<E: Dtype, F: Dtype>(
        &self,
        src: &Self::Storage<E>,
        layout: &Layout,
    ) -> Result<Self::Storage<F>>;

    /// The tape's gradient arithmetic for element type `F` on this backend:
    /// `None` (the default) where `F` is not a float type with every
    /// kernel here. A cast into `F` or a move onto this device records its
    /// backward only when there is one; a backend that has every kernel for
    /// the four float types returns [`crate::tape::float_grad_ops`].
    fn grad_ops<F: Dtype>(&self) -> Option<&'static dyn crate::tape::GradOps<F, Self>> {
        None
    }
}

/// A backend with a default instance, used by constructors that take no device
/// (`Tensor::zeros()`); the CPU has one, CUDA needs an explicit device.
pub trait DefaultDevice: Backend {
    /// The default instance.
    fn default_device() -> Self;
}

/// Declares [`Device`] and its blanket impl from the op list
/// (`kernel_ops!` in `ops/mod.rs`, where a new kernel family is one line).
macro_rules! device_kernels {
    ($($family:ident :: $kernel:ident),* $(,)?) => {
        /// Every kernel a float dtype needs on a backend: the bound generic
        /// model code writes (`D: Device<E>`). Blanket-implemented for every
        /// backend that implements all of them. A backend without its own
        /// kernel for a family implements the trait with no methods (the
        /// defaults decline, and core runs the composed ops).
        pub trait Device<E: crate::Float>: Backend $(+ crate::ops::$family::$kernel<E>)* {}

        impl<E: crate::Float, D> Device<E> for D where D: Backend $(+ crate::ops::$family::$kernel<E>)* {}
    };
}

crate::kernel_ops!(device_kernels);
