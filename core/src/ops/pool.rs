//! Max and average pooling (1-d and 2-d) with PyTorch's options, max pooling
//! with its indices and its inverse (max unpooling); outputs have `Dyn`
//! spatial sizes (typed layers pin them).

use crate::device::Backend;
use crate::dtype::Float;
use crate::error::{fmt_dims, Error, Result};
use crate::layout::Layout;
use crate::shape::op::{self, ImageInput, ImageUnpool, SequencePool};
use crate::shape::window::pool_window_out;
use crate::shape::{Dim, Dyn, Shape};
use crate::tape::Raw;
use crate::tensor::{ok, Tensor};

/// Options of a 2-d pooling window, PyTorch's names; see [`Pool2dParams::new`]
/// for its defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dParams {
    /// Window size `[h, w]`.
    pub kernel: [usize; 2],
    /// Step `[h, w]` (PyTorch's default: the window size).
    pub stride: [usize; 2],
    /// Implicit padding on each side (at most half the window).
    pub padding: [usize; 2],
    /// Spacing of window taps (max pooling only).
    pub dilation: [usize; 2],
    /// Round the output size up instead of down.
    pub ceil_mode: bool,
    /// Average pooling counts padded zeros in the divisor (PyTorch's default: true).
    pub count_include_pad: bool,
}

impl Pool2dParams {
    /// A `k`-window with PyTorch's defaults: stride `k`, no padding, dilation 1.
    pub fn new(kernel: [usize; 2]) -> Self {
        Pool2dParams {
            kernel,
            stride: kernel,
            padding: [0, 0],
            dilation: [1, 1],
            ceil_mode: false,
            count_include_pad: true,
        }
    }
}

/// Backend support for pooling.
pub trait PoolKernel<E: Float>: Backend {
    /// Max pooling of `[n, c, h, w]` into row-major `[n, c, oh, ow]`; padding
    /// counts as `-inf`; NaN propagates.
    fn max_pool2d(
        &self,
        x: &Self::Storage<E>,
        lx: &Layout,
        p: &Pool2dParams,
        out: [usize; 2],
    ) -> Result<Self::Storage<E>>;
    /// Average pooling of `[n, c, h, w]` into row-major `[n, c, oh, ow]`.
    fn avg_pool2d(
        &self,
        x: &Self::Storage<E>,
        lx: &Layout,
        p: &Pool2dParams,
        out: [usize; 2],
    ) -> Result<Self::Storage<E>>;
    /// Gradient of [`PoolKernel::max_pool2d`]: each output's gradient `g`
    /// goes to the first maximum of its window. Row-major with `x`'s sizes.
    fn max_pool2d_backward(
        &self,
        x: &Self::Storage<E>,
        lx: &Layout,
        g: &Self::Storage<E>,
        lg: &Layout,
        p: &Pool2dParams,
    ) -> Result<Self::Storage<E>>;
    /// Gradient of [`PoolKernel::avg_pool2d`] for an input of `lx`'s sizes.
    fn avg_pool2d_backward(
        &self,
        lx: &Layout,
        g: &Self::Storage<E>,
        lg: &Layout,
        p: &Pool2dParams,
    ) -> Result<Self::Storage<E>>;
}

/// Checks a pooling call on an input of sizes `dims` (`[n, c, h, w]`) and
/// returns the output's `[oh, ow]`: the one set of checks, which core runs
/// before it dispatches and the backends' kernels run again when called
/// directly.
///
/// # Errors
/// When the input is not 4-d, a size or dilation is zero, the padding is
/// more than half the window, or the window does not fit the padded input.
pub fn check_pool(op: &'static str, dims: &[usize], p: &Pool2dParams) -> Result<[usize; 2]> {
    if dims.len() != 4 {
        return Err(Error::invalid(
            op,
            format!("expected [n, c, h, w], got {}", fmt_dims(dims)),
        ));
    }
    let bad = || {
        Error::invalid(
            op,
            format!(
                "a {:?} window does not fit a {}x{} input with {p:?}",
                p.kernel, dims[2], dims[3]
            ),
        )
    };
    if (0..2).any(|i| p.kernel[i] == 0 || p.padding[i] * 2 > p.kernel[i] || p.dilation[i] == 0) {
        return Err(Error::invalid(
            op,
            format!("padding must be at most half the window and sizes positive, got {p:?}"),
        ));
    }
    let oh = pool_window_out(
        dims[2],
        p.kernel[0],
        p.stride[0],
        p.padding[0],
        p.dilation[0],
        p.ceil_mode,
    )
    .ok_or_else(bad)?;
    let ow = pool_window_out(
        dims[3],
        p.kernel[1],
        p.stride[1],
        p.padding[1],
        p.dilation[1],
        p.ceil_mode,
    )
    .ok_or_else(bad)?;
    Ok([oh, ow])
}

/// The output of the 2-d pooling `Op` of an input `S`: its batch and
/// channels, then the pooled height and width. The rule that `S` is
/// `[batch, channels, height, width]` is stated on the parameters' type
/// `P` (see [`crate::shape::op::ImageInput`]), so a tensor of another rank
/// is one error naming the op, not "no method named `max_pool2d`".
type PoolOut<S, P, Op, E, D> = Tensor<
    (
        <P as ImageInput<S, Op>>::Batch,
        <P as ImageInput<S, Op>>::Channels,
        Dyn,
        Dyn,
    ),
    E,
    D,
>;

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    /// Max pooling of `[n, c, h, w]`, like `F.max_pool2d(x, kernel, stride,
    /// padding, dilation, ceil_mode)`; `p` is a [`Pool2dParams`].
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::core::ops::pool::Pool2dParams;
    /// let x = Tensor::<(C<1>, C<1>, C<2>, C<4>)>::from_vec(vec![1., 5., 2., 0., 3., 4., 7., 6.], (C, C, C, C)).unwrap();
    /// assert_eq!(x.max_pool2d(Pool2dParams::new([2, 2])).to_vec(), [5., 7.]);
    /// ```
    ///
    /// # Errors
    /// When the window does not fit the padded input.
    pub fn try_max_pool2d<P>(&self, p: P) -> Result<PoolOut<S, P, op::max_pool2d, E, D>>
    where
        P: ImageInput<S, op::max_pool2d> + Into<Pool2dParams>,
    {
        let x = self.clone().retype::<(Dyn, Dyn, Dyn, Dyn)>();
        Ok(x.try_max_pool2d_at(p.into())?.retype())
    }

    /// Average pooling of `[n, c, h, w]`, like `F.avg_pool2d(x, kernel,
    /// stride, padding, ceil_mode, count_include_pad)`; `p` is a
    /// [`Pool2dParams`].
    ///
    /// # Errors
    /// When the window does not fit the padded input.
    pub fn try_avg_pool2d<P>(&self, p: P) -> Result<PoolOut<S, P, op::avg_pool2d, E, D>>
    where
        P: ImageInput<S, op::avg_pool2d> + Into<Pool2dParams>,
    {
        let x = self.clone().retype::<(Dyn, Dyn, Dyn, Dyn)>();
        Ok(x.try_avg_pool2d_at(p.into())?.retype())
    }

    /// [`Tensor::try_max_pool2d`] that panics when the window does not fit.
    #[track_caller]
    pub fn max_pool2d<P>(&self, p: P) -> PoolOut<S, P, op::max_pool2d, E, D>
    where
        P: ImageInput<S, op::max_pool2d> + Into<Pool2dParams>,
    {
        ok(self.try_max_pool2d(p))
    }

    /// [`Tensor::try_avg_pool2d`] that panics when the window does not fit.
    #[track_caller]
    pub fn avg_pool2d<P>(&self, p: P) -> PoolOut<S, P, op::avg_pool2d, E, D>
    where
        P: ImageInput<S, op::avg_pool2d> + Into<Pool2dParams>,
    {
        ok(self.try_avg_pool2d(p))
    }

    /// Max pooling that also returns where each maximum came from, like
    /// `F.max_pool2d(x, ..., return_indices=True)`: each index is the flat
    /// position `row * w + col` of its window's maximum within its input
    /// plane (`[h, w]`), the first maximum of the window, a NaN winning as in
    /// PyTorch's CPU kernel. The values are [`Tensor::try_max_pool2d`]'s,
    /// with its gradient; the indices are found on the host (from a copy of
    /// the input when it lives on a device). [`Tensor::try_max_unpool2d`]
    /// puts the values back.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::core::ops::pool::Pool2dParams;
    /// let x = Tensor::<(C<1>, C<1>, C<2>, C<4>)>::from_vec(vec![1., 5., 2., 0., 3., 4., 7., 6.], (C, C, C, C)).unwrap();
    /// let (y, idx) = x.try_max_pool2d_with_indices(Pool2dParams::new([2, 2])).unwrap();
    /// assert_eq!(y.to_vec(), [5., 7.]);
    /// assert_eq!(idx.to_vec(), [1, 6]);
    /// ```
    ///
    /// # Errors
    /// When the window does not fit the padded input.
    #[allow(clippy::type_complexity)] // PyTorch's (values, indices)
    pub fn try_max_pool2d_with_indices<P>(
        &self,
        p: P,
    ) -> Result<(
        PoolOut<S, P, op::max_pool2d_with_indices, E, D>,
        PoolOut<S, P, op::max_pool2d_with_indices, i64, D>,
    )>
    where
        P: ImageInput<S, op::max_pool2d_with_indices> + Into<Pool2dParams>,
    {
        let x = self.clone().retype::<(Dyn, Dyn, Dyn, Dyn)>();
        let (y, idx) = x.try_max_pool2d_with_indices_at(p.into())?;
        Ok((y.retype(), idx.retype()))
    }

    /// Places each value at its index in a zero `[n, c, oh, ow]` map, like
    /// `F.max_unpool2d(y, idx, kernel, stride, padding, output_size)` given
    /// the output size: the inverse of [`Tensor::try_max_pool2d_with_indices`]
    /// (`idx` holds flat positions `row * ow + col` within each plane). Where
    /// several values name one position (overlapping windows sharing a
    /// maximum) the last one is kept, as in PyTorch's CPU kernel, and each
    /// still receives that position's gradient.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let y = Tensor::<(C<1>, C<1>, C<1>, C<2>)>::from_vec(vec![5., 7.], (C, C, C, C)).unwrap();
    /// let idx = Tensor::<(C<1>, C<1>, C<1>, C<2>), i64>::from_vec(vec![1, 6], (C, C, C, C)).unwrap();
    /// let u = y.try_max_unpool2d(&idx, [2, 4]).unwrap();
    /// assert_eq!(u.to_vec(), [0., 5., 0., 0., 0., 0., 7., 0.]);
    /// ```
    ///
    /// # Errors
    /// When `idx` does not have this tensor's sizes, or an index falls
    /// outside the output plane.
    pub fn try_max_unpool2d<O>(
        &self,
        idx: &Tensor<S, i64, D>,
        output_size: O,
    ) -> Result<Tensor<(O::Batch, O::Channels, Dyn, Dyn), E, D>>
    where
        O: ImageUnpool<S, op::max_unpool2d>,
    {
        let x = self.clone().retype::<(Dyn, Dyn, Dyn, Dyn)>();
        let idx = idx.clone().retype::<(Dyn, Dyn, Dyn, Dyn)>();
        Ok(x.try_max_unpool2d_at(&idx, output_size.size())?.retype())
    }
}

impl<N: Dim, Ch: Dim, H: Dim, W: Dim, E: Float, D: crate::device::Device<E>>
    Tensor<(N, Ch, H, W), E, D>
{
    fn try_max_pool2d_unnoted(&self, p: Pool2dParams) -> Result<Tensor<(N, Ch, Dyn, Dyn), E, D>> {
        let [oh, ow] = check_pool("max_pool2d", &self.layout.dims, &p)?;
        let s = self
            .device
            .max_pool2d(&self.storage(), &self.layout, &p, [oh, ow])?;
        let xr = self.raw();
        Ok(Tensor::from_storage(
            s,
            &[self.layout.dims[0], self.layout.dims[1], oh, ow],
            self.device.clone(),
        )
        .record(
            "max_pool2d",
            std::slice::from_ref(&self.var),
            vec![xr.saved()],
            move |g| {
                let gx = g.device.max_pool2d_backward(
                    &xr.storage(),
                    &xr.layout,
                    &g.storage(),
                    &g.layout,
                    &p,
                )?;
                Ok(vec![Some(Raw::new(gx, &xr.layout.dims, g.device.clone()))])
            },
        ))
    }

    fn try_max_pool2d_at(&self, p: Pool2dParams) -> Result<Tensor<(N, Ch, Dyn, Dyn), E, D>> {
        let y = self.try_max_pool2d_unnoted(p)?;
        Ok(y.noted(|| (crate::graph::Op::MaxPool(p), vec![self.val()])))
    }

    fn try_avg_pool2d_unnoted(&self, p: Pool2dParams) -> Result<Tensor<(N, Ch, Dyn, Dyn), E, D>> {
        let [oh, ow] = check_pool("avg_pool2d", &self.layout.dims, &p)?;
        let s = self
            .device
            .avg_pool2d(&self.storage(), &self.layout, &p, [oh, ow])?;
        let lx = self.layout;
        Ok(Tensor::from_storage(
            s,
            &[self.layout.dims[0], self.layout.dims[1], oh, ow],
            self.device.clone(),
        )
        .record(
            "avg_pool2d",
            std::slice::from_ref(&self.var),
            vec![],
            move |g| {
                let gx = g
                    .device
                    .avg_pool2d_backward(&lx, &g.storage(), &g.layout, &p)?;
                Ok(vec![Some(Raw::new(gx, &lx.dims, g.device.clone()))])
            },
        ))
    }

    fn try_avg_pool2d_at(&self, p: Pool2dParams) -> Result<Tensor<(N, Ch, Dyn, Dyn), E, D>> {
        let y = self.try_avg_pool2d_unnoted(p)?;
        Ok(y.noted(|| (crate::graph::Op::AvgPool(p), vec![self.val()])))
    }

    #[allow(clippy::type_complexity)] // PyTorch's (values, indices)
    fn try_max_pool2d_with_indices_at(
        &self,
        p: Pool2dParams,
    ) -> Result<(
        Tensor<(N, Ch, Dyn, Dyn), E, D>,
        Tensor<(N, Ch, Dyn, Dyn), i64, D>,
    )> {
        crate::graph::refuse(
            "max_pool2d_with_indices",
            "finds its indices on the host and has no graph form yet",
        );
        let y = self.try_max_pool2d(p)?;
        let [n, c, h, w] = <[usize; 4]>::try_from(&self.layout.dims[..]).expect("4-d");
        let (oh, ow) = (y.layout.dims[2], y.layout.dims[3]);
        let x = self.try_to_vec()?;
        // The taps of one window along one axis, inside the input.
        let taps = |o: usize, axis: usize, len: usize| {
            (0..p.kernel[axis]).filter_map(move |k| {
                (o * p.stride[axis] + k * p.dilation[axis])
                    .checked_sub(p.padding[axis])
                    .filter(|&i| i < len)
            })
        };
        let mut idx = Vec::with_capacity(n * c * oh * ow);
        for plane in 0..n * c {
            let values = &x[plane * h * w..(plane + 1) * h * w];
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut best: Option<(usize, f64)> = None;
                    for iy in taps(oy, 0, h) {
                        for ix in taps(ox, 1, w) {
                            let at = iy * w + ix;
                            let v = crate::dtype::Dtype::to_f64(values[at]);
                            if best.is_none_or(|(_, b)| v > b || v.is_nan()) {
                                best = Some((at, v));
                            }
                        }
                    }
                    idx.push(best.map_or(0, |(at, _)| at as i64));
                }
            }
        }
        let idx = Tensor::from_vec_on(idx, y.shape(), &self.device)?;
        Ok((y, idx))
    }

    /// [`Tensor::try_max_unpool2d`] on a rank-4 input.
    fn try_max_unpool2d_at(
        &self,
        idx: &Tensor<(N, Ch, H, W), i64, D>,
        output_size: [usize; 2],
    ) -> Result<Tensor<(N, Ch, Dyn, Dyn), E, D>> {
        self.same_device("max_unpool2d", idx)?;
        if idx.layout.dims != self.layout.dims {
            return Err(Error::shape(
                "max_unpool2d",
                format!(
                    "indices of the input's sizes {}",
                    fmt_dims(&self.layout.dims)
                ),
                &idx.layout.dims,
            ));
        }
        let [n, c, h, w] = <[usize; 4]>::try_from(&self.layout.dims[..]).expect("4-d");
        let [oh, ow] = output_size;
        let (plane_in, plane_out) = (h * w, oh * ow);
        let positions = idx.try_to_vec()?;
        if let Some(&bad) = positions
            .iter()
            .find(|&&i| i < 0 || i as usize >= plane_out)
        {
            return Err(Error::IndexOutOfRange {
                op: "max_unpool2d",
                index: bad,
                size: plane_out,
            });
        }
        // Which values a later one of the same plane overwrites.
        let mut last = vec![usize::MAX; plane_out];
        let mut keep = vec![true; positions.len()];
        for plane in 0..n * c {
            let span = plane * plane_in..(plane + 1) * plane_in;
            for i in span.clone() {
                last[positions[i] as usize] = i;
            }
            for i in span {
                keep[i] = last[positions[i] as usize] == i;
            }
        }
        // Fully dynamic shapes inside: the generic `N` and `Ch` do not
        // broadcast with themselves without extra bounds.
        let flat_in = (Dyn(n), Dyn(c), Dyn(plane_in));
        let flat_out = (Dyn(n), Dyn(c), Dyn(plane_out));
        let y = self.try_reshape_to(flat_in)?;
        let src = if keep.iter().all(|&k| k) {
            y
        } else {
            // The overwritten values add zero to the output but keep their
            // gradient: `y - detach(y)` is zero with the gradient of `y`
            // (NaN for an overwritten infinite value, the one difference
            // from PyTorch).
            let keep: Vec<E> = keep
                .iter()
                .map(|&k| E::from_f64(f64::from(u8::from(k))))
                .collect();
            let keep = Tensor::from_vec_on(keep, flat_in, &self.device)?;
            let ghost = &(&y - &y.detach()) * &keep.mul_scalar(-1.0).add_scalar(1.0);
            &(&y * &keep) + &ghost
        };
        let idx = Tensor::from_vec_on(positions, flat_in, &self.device)?;
        let out = Tensor::zeros_on(flat_out, &self.device).try_scatter_add::<2, _>(&idx, &src)?;
        out.try_reshape_to((self.shape().0, self.shape().1, Dyn(oh), Dyn(ow)))
    }
}

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    /// 1-d pooling of `[n, c, l]` as a 2-d pooling of `[n, c, 1, l]`.
    fn pool1d<K: SequencePool<S, Op>, Op>(
        &self,
        kernel: K,
        stride: usize,
        padding: usize,
        max: bool,
    ) -> Result<Tensor<(K::Batch, K::Channels, Dyn), E, D>> {
        let kernel = kernel.size();
        let p = Pool2dParams {
            kernel: [1, kernel],
            stride: [1, stride],
            padding: [0, padding],
            ..Pool2dParams::new([1, kernel])
        };
        let x = self.clone().retype::<(Dyn, Dyn, Dyn)>().unsqueeze::<2>();
        let y = if max {
            x.try_max_pool2d_at(p)?
        } else {
            x.try_avg_pool2d_at(p)?
        };
        let d = y.layout.dims;
        Ok(y.try_reshape_to((Dyn(d[0]), Dyn(d[1]), Dyn(d[3])))?
            .retype())
    }

    /// 1-d max pooling of `[batch, channels, length]`, like
    /// `F.max_pool1d(x, kernel, stride, padding)`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<1>, C<1>, C<4>)>::from_vec(vec![1., 3., 2., 0.], (C, C, C)).unwrap();
    /// assert_eq!(x.try_max_pool1d(2, 2, 0).unwrap().to_vec(), [3., 2.]);
    /// ```
    ///
    /// # Errors
    /// When the window does not fit the padded input.
    pub fn try_max_pool1d<K: SequencePool<S, op::max_pool1d>>(
        &self,
        kernel: K,
        stride: usize,
        padding: usize,
    ) -> Result<Tensor<(K::Batch, K::Channels, Dyn), E, D>> {
        self.pool1d(kernel, stride, padding, true)
    }

    /// 1-d average pooling of `[batch, channels, length]`, like
    /// `F.avg_pool1d(x, kernel, stride, padding)`.
    ///
    /// # Errors
    /// When the window does not fit the padded input.
    pub fn try_avg_pool1d<K: SequencePool<S, op::avg_pool1d>>(
        &self,
        kernel: K,
        stride: usize,
        padding: usize,
    ) -> Result<Tensor<(K::Batch, K::Channels, Dyn), E, D>> {
        self.pool1d(kernel, stride, padding, false)
    }
}
