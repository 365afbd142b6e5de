//! Constructors: constant fills, data from the host, ranges, identity and
//! seeded random tensors. Values are made on the host and moved to the device
//! once, so every backend gets them for free.

use super::{ok, Tensor};
use crate::device::{Backend, DefaultDevice};
use crate::dtype::{Dtype, Float};
use crate::error::{fmt_dims, Error, Result};
use crate::rng::Rng;
use crate::shape::{ConstShape, Dim, Dyn, Shape};

impl<S: Shape, E: Dtype, D: Backend> Tensor<S, E, D> {
    /// A tensor of `shape` filled with `value`, on `device`.
    pub fn full_on(shape: S, value: E, device: &D) -> Self {
        let dims = shape.dims();
        let s = ok(device.full(dims.numel(), value));
        Self::from_storage(s, &dims, device.clone()).constant()
    }

    /// Zeros of `shape` on `device`.
    pub fn zeros_on(shape: S, device: &D) -> Self {
        Self::full_on(shape, E::from_f64(0.0), device)
    }

    /// Ones of `shape` on `device`.
    pub fn ones_on(shape: S, device: &D) -> Self {
        Self::full_on(shape, E::from_f64(1.0), device)
    }

    /// A tensor of the same shape, dtype and device filled with `value`.
    pub fn full_like(&self, value: E) -> Self {
        Self::full_on(self.shape(), value, &self.device)
    }

    /// Zeros like `self`.
    pub fn zeros_like(&self) -> Self {
        self.full_like(E::from_f64(0.0))
    }

    /// Ones like `self`.
    pub fn ones_like(&self) -> Self {
        self.full_like(E::from_f64(1.0))
    }

    /// A tensor holding `data` (row-major) with `shape`, on `device`.
    ///
    /// # Errors
    /// [`Error::DataLength`] when `data` does not have exactly as many values as
    /// the shape has elements.
    pub fn from_vec_on(data: Vec<E>, shape: S, device: &D) -> Result<Self> {
        let dims = shape.dims();
        if data.len() != dims.numel() {
            return Err(Error::DataLength {
                op: "from_vec",
                len: data.len(),
                numel: dims.numel(),
                shape: fmt_dims(&dims),
            });
        }
        let s = device.upload(data)?;
        Ok(Self::from_storage(s, &dims, device.clone()).constant())
    }

    /// Values drawn by `f` from `rng`, one per element, on `device`.
    fn sample_on(shape: S, device: &D, rng: &mut Rng, mut f: impl FnMut(&mut Rng) -> f64) -> Self {
        let n = shape.numel();
        let data: Vec<E> = (0..n).map(|_| E::from_f64(f(rng))).collect();
        ok(Self::from_vec_on(data, shape, device))
    }

    /// Uniform values in `[low, high)` from `rng`, like `torch.empty(..).uniform_(low, high)`.
    pub fn uniform_on(shape: S, low: f64, high: f64, rng: &mut Rng, device: &D) -> Self {
        Self::sample_on(shape, device, rng, |r| low + (high - low) * r.uniform())
    }

    /// Normal values with `mean` and `std` from `rng`.
    pub fn normal_on(shape: S, mean: f64, std: f64, rng: &mut Rng, device: &D) -> Self {
        Self::sample_on(shape, device, rng, |r| mean + std * r.normal())
    }
}

impl<S: Shape, E: Dtype, D: DefaultDevice> Tensor<S, E, D> {
    /// A tensor of `shape` holding `data` (row-major) on the default device.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let t = Tensor::<(C<2>, C<3>)>::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C)).unwrap();
    /// assert_eq!(t.dims().to_vec(), vec![2, 3]);
    /// ```
    ///
    /// # Errors
    /// [`Error::DataLength`] when the lengths disagree.
    pub fn from_vec(data: Vec<E>, shape: S) -> Result<Self> {
        Self::from_vec_on(data, shape, &D::default_device())
    }

    /// Like [`Tensor::from_vec`] from a slice.
    ///
    /// # Errors
    /// [`Error::DataLength`] when the lengths disagree.
    pub fn from_slice(data: &[E], shape: S) -> Result<Self> {
        Self::from_vec(data.to_vec(), shape)
    }

    /// Zeros of a runtime `shape` on the default device.
    pub fn zeros_with(shape: S) -> Self {
        Self::zeros_on(shape, &D::default_device())
    }

    /// Ones of a runtime `shape` on the default device.
    pub fn ones_with(shape: S) -> Self {
        Self::ones_on(shape, &D::default_device())
    }

    /// `value` everywhere, for a runtime `shape`, on the default device.
    pub fn full_with(shape: S, value: E) -> Self {
        Self::full_on(shape, value, &D::default_device())
    }

    /// Uniform values in `[0, 1)` from `rng`, like `torch.rand`.
    pub fn rand(shape: S, rng: &mut Rng) -> Self {
        Self::uniform_on(shape, 0.0, 1.0, rng, &D::default_device())
    }

    /// Standard normal values from `rng`, like `torch.randn`.
    pub fn randn(shape: S, rng: &mut Rng) -> Self {
        Self::normal_on(shape, 0.0, 1.0, rng, &D::default_device())
    }
}

impl<S: ConstShape, E: Dtype, D: DefaultDevice> Tensor<S, E, D> {
    /// Zeros of a fully static shape: `Tensor::<(C<2>, C<3>)>::zeros()`.
    pub fn zeros() -> Self {
        Self::zeros_with(S::VALUE)
    }

    /// Ones of a fully static shape.
    pub fn ones() -> Self {
        Self::ones_with(S::VALUE)
    }

    /// `value` everywhere, for a fully static shape.
    pub fn full(value: E) -> Self {
        Self::full_with(S::VALUE, value)
    }
}

impl<E: Dtype, D: Backend> Tensor<(Dyn,), E, D> {
    /// `start, start + step, ...` up to but excluding `end`, like `torch.arange`.
    ///
    /// # Errors
    /// When `step` is zero or has the wrong sign, or a bound is not finite.
    pub fn arange_on(start: f64, end: f64, step: f64, device: &D) -> Result<Self> {
        if step == 0.0 || !start.is_finite() || !end.is_finite() || (end - start) * step < 0.0 {
            return Err(Error::invalid(
                "arange",
                format!("cannot go from {start} to {end} in steps of {step}"),
            ));
        }
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        let data = (0..n)
            .map(|i| E::from_f64(start + i as f64 * step))
            .collect();
        let t = Self::from_vec_on(data, (Dyn(n),), device)?;
        if crate::graph::capturing() {
            crate::graph::note_arange(start, step, n, &t.val());
        }
        Ok(t)
    }

    /// `steps` evenly spaced values from `start` to `end` inclusive, like `torch.linspace`.
    pub fn linspace_on(start: f64, end: f64, steps: usize, device: &D) -> Self {
        let data = (0..steps)
            .map(|i| {
                // PyTorch fills the second half from the end, so the last value is exact.
                let step = if steps > 1 {
                    (end - start) / (steps - 1) as f64
                } else {
                    0.0
                };
                let v = if i < steps / 2 || steps == 1 {
                    start + step * i as f64
                } else {
                    end - step * (steps - 1 - i) as f64
                };
                E::from_f64(v)
            })
            .collect();
        ok(Self::from_vec_on(data, (Dyn(steps),), device))
    }
}

impl<E: Dtype, D: DefaultDevice> Tensor<(Dyn,), E, D> {
    /// [`Tensor::arange_on`] on the default device.
    ///
    /// # Errors
    /// When `step` is zero or has the wrong sign.
    pub fn arange(start: f64, end: f64, step: f64) -> Result<Self> {
        Self::arange_on(start, end, step, &D::default_device())
    }

    /// [`Tensor::linspace_on`] on the default device.
    pub fn linspace(start: f64, end: f64, steps: usize) -> Self {
        Self::linspace_on(start, end, steps, &D::default_device())
    }
}

impl<A: Dim, B: Dim, E: Dtype, D: Backend> Tensor<(A, B), E, D> {
    /// Ones on the diagonal and zeros elsewhere, like `torch.eye(n, m)`.
    pub fn eye_on(shape: (A, B), device: &D) -> Self {
        let (n, m) = (shape.0.size(), shape.1.size());
        let data = (0..n * m)
            .map(|i| E::from_f64(if i / m == i % m { 1.0 } else { 0.0 }))
            .collect();
        ok(Self::from_vec_on(data, shape, device))
    }
}

impl<A: Dim, B: Dim, E: Dtype, D: DefaultDevice> Tensor<(A, B), E, D> {
    /// [`Tensor::eye_on`] on the default device.
    pub fn eye(shape: (A, B)) -> Self {
        Self::eye_on(shape, &D::default_device())
    }
}

impl<S: Shape, E: Float, D: Backend> Tensor<S, E, D> {
    /// Whether every element is finite (no NaN or Inf).
    pub fn all_finite(&self) -> bool {
        self.to_vec().iter().all(|v| v.is_finite())
    }
}
