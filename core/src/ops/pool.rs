//! Max and average pooling (1-d and 2-d) with PyTorch's options; outputs have
//! `Dyn` spatial sizes (typed layers pin them).

use crate::device::Backend;
use crate::dtype::Float;
use crate::error::{fmt_dims, Error, Result};
use crate::layout::Layout;
use crate::shape::window::pool_window_out;
use crate::shape::{Dim, Dyn};
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

    /// Max pooling, like `F.max_pool2d`.
    ///
    /// # Errors
    /// When the window does not fit the padded input.
    pub fn try_max_pool2d(&self, p: Pool2dParams) -> Result<Tensor<(N, Ch, Dyn, Dyn), E, D>> {
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

    /// Average pooling, like `F.avg_pool2d`.
    ///
    /// # Errors
    /// When the window does not fit the padded input.
    pub fn try_avg_pool2d(&self, p: Pool2dParams) -> Result<Tensor<(N, Ch, Dyn, Dyn), E, D>> {
        let y = self.try_avg_pool2d_unnoted(p)?;
        Ok(y.noted(|| (crate::graph::Op::AvgPool(p), vec![self.val()])))
    }

    /// [`Tensor::try_max_pool2d`] that panics when the window does not fit.
    pub fn max_pool2d(&self, p: Pool2dParams) -> Tensor<(N, Ch, Dyn, Dyn), E, D> {
        ok(self.try_max_pool2d(p))
    }

    /// [`Tensor::try_avg_pool2d`] that panics when the window does not fit.
    pub fn avg_pool2d(&self, p: Pool2dParams) -> Tensor<(N, Ch, Dyn, Dyn), E, D> {
        ok(self.try_avg_pool2d(p))
    }
}

impl<N: Dim, Ch: Dim, L: Dim, E: Float, D: crate::device::Device<E>> Tensor<(N, Ch, L), E, D> {
    fn pool1d(&self, p: Pool2dParams, max: bool) -> Result<Tensor<(N, Ch, Dyn), E, D>> {
        let x = self.unsqueeze::<2>();
        let y = if max {
            x.try_max_pool2d(p)?
        } else {
            x.try_avg_pool2d(p)?
        };
        let d = y.layout.dims;
        y.try_reshape_to((
            N::from_size(d[0]).expect("batch kept"),
            Ch::from_size(d[1]).expect("channels kept"),
            Dyn(d[3]),
        ))
    }

    /// 1-d max pooling, like `F.max_pool1d(x, kernel, stride, padding)`.
    ///
    /// # Errors
    /// When the window does not fit the padded input.
    pub fn try_max_pool1d(
        &self,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Tensor<(N, Ch, Dyn), E, D>> {
        let p = Pool2dParams {
            kernel: [1, kernel],
            stride: [1, stride],
            padding: [0, padding],
            ..Pool2dParams::new([1, kernel])
        };
        self.pool1d(p, true)
    }

    /// 1-d average pooling, like `F.avg_pool1d(x, kernel, stride, padding)`.
    ///
    /// # Errors
    /// When the window does not fit the padded input.
    pub fn try_avg_pool1d(
        &self,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Tensor<(N, Ch, Dyn), E, D>> {
        let p = Pool2dParams {
            kernel: [1, kernel],
            stride: [1, stride],
            padding: [0, padding],
            ..Pool2dParams::new([1, kernel])
        };
        self.pool1d(p, false)
    }
}
