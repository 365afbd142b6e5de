//! Pooling layers: `MaxPool1d`, `MaxPool2d`, `AvgPool1d`, `AvgPool2d` and
//! `AdaptiveAvgPool2d`, like PyTorch's. The window layers keep PyTorch's
//! defaults for what they do not take (`dilation=1`, `ceil_mode=False`,
//! `count_include_pad=True`).

use super::check::assert_window;
use crate::Forward;
use forma_core::device::Device;
use forma_core::ops::pool::Pool2dParams;
use forma_core::{Dim, Dyn, Error, Float, Result, Tensor, C};
use forma_macros::Module;

/// Claims the stated output shape of a sliding-window layer; the static sizes
/// were checked at build time, so only `Dyn` sizes can disagree here.
pub(crate) fn stated_output<B: Dim, Ch: Dim, H2: Dim, W2: Dim, E: Float, D: Device<E>>(
    layer: &'static str,
    y: Tensor<(B, Ch, Dyn, Dyn), E, D>,
) -> Result<Tensor<(B, Ch, H2, W2), E, D>> {
    y.try_into_shape()
        .map_err(|e| Error::invalid(layer, format!("the stated output size does not fit: {e}")))
}

fn params<const K: usize, const S: usize, const P: usize>() -> Pool2dParams {
    Pool2dParams {
        stride: [S, S],
        padding: [P, P],
        ..Pool2dParams::new([K, K])
    }
}

macro_rules! pool {
    ($(#[$doc:meta])* $name:ident, $method:ident, $repr:literal) => {
        $(#[$doc])*
        #[derive(Module, Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[module(crate = "crate", extra_repr = "Self::extra_repr")]
        pub struct $name<const K: usize, const S: usize = K, const P: usize = 0>;

        impl<const K: usize, const S: usize, const P: usize> $name<K, S, P> {
            fn extra_repr(&self) -> String {
                format!($repr)
            }
        }

        impl<B: Dim, Ch: Dim, H: Dim, W: Dim, H2: Dim, W2: Dim, const K: usize, const S: usize, const P: usize, E: Float, D: Device<E>>
            Forward<Tensor<(B, Ch, H, W), E, D>, Tensor<(B, Ch, H2, W2), E, D>> for $name<K, S, P>
        {
            fn try_forward(&self, x: Tensor<(B, Ch, H, W), E, D>) -> Result<Tensor<(B, Ch, H2, W2), E, D>> {
                const {
                    assert_window(stringify!($name), "height", H::STATIC, K, S, P, 1, H2::STATIC);
                    assert_window(stringify!($name), "width", W::STATIC, K, S, P, 1, W2::STATIC);
                };
                stated_output(stringify!($name), x.$method(params::<K, S, P>())?)
            }
        }
    };
}

pool!(
    /// Max pooling over `K`x`K` windows with stride `S` (default `K`) and
    /// padding `P`, like `nn.MaxPool2d(K, S, P)`. The caller states the output
    /// size, checked at build time like [`super::Conv2d`]'s.
    MaxPool2d,
    try_max_pool2d,
    "kernel_size={K}, stride={S}, padding={P}, dilation=1, ceil_mode=False"
);
pool!(
    /// Average pooling over `K`x`K` windows with stride `S` (default `K`) and
    /// padding `P` (counted in the average), like `nn.AvgPool2d(K, S, P)`.
    AvgPool2d,
    try_avg_pool2d,
    "kernel_size={K}, stride={S}, padding={P}"
);

fn stated_length<B: Dim, Ch: Dim, L2: Dim, E: Float, D: Device<E>>(
    layer: &'static str,
    y: Tensor<(B, Ch, Dyn), E, D>,
) -> Result<Tensor<(B, Ch, L2), E, D>> {
    y.try_into_shape()
        .map_err(|e| Error::invalid(layer, format!("the stated output length does not fit: {e}")))
}

macro_rules! pool1d {
    ($(#[$doc:meta])* $name:ident, $method:ident, $repr:literal) => {
        $(#[$doc])*
        #[derive(Module, Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[module(crate = "crate", extra_repr = "Self::extra_repr")]
        pub struct $name<const K: usize, const S: usize = K, const P: usize = 0>;

        impl<const K: usize, const S: usize, const P: usize> $name<K, S, P> {
            fn extra_repr(&self) -> String {
                format!($repr)
            }
        }

        impl<B: Dim, Ch: Dim, L: Dim, L2: Dim, const K: usize, const S: usize, const P: usize, E: Float, D: Device<E>>
            Forward<Tensor<(B, Ch, L), E, D>, Tensor<(B, Ch, L2), E, D>> for $name<K, S, P>
        {
            fn try_forward(&self, x: Tensor<(B, Ch, L), E, D>) -> Result<Tensor<(B, Ch, L2), E, D>> {
                const {
                    assert_window(stringify!($name), "length", L::STATIC, K, S, P, 1, L2::STATIC);
                };
                stated_length(stringify!($name), x.$method(K, S, P)?)
            }
        }
    };
}

pool1d!(
    /// Max pooling over windows of `K` with stride `S` (default `K`) and
    /// padding `P`, like `nn.MaxPool1d(K, S, P)`, on `[batch, channels,
    /// length]`. The caller states the output length, checked at build time.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::{layers::MaxPool1d, Forward};
    /// let x = Tensor::<(C<1>, C<1>, C<4>)>::from_vec(vec![1., 3., 2., 0.], (C, C, C)).unwrap();
    /// let y: Tensor<(C<1>, C<1>, C<2>)> = MaxPool1d::<2>.forward(x);
    /// assert_eq!(y.to_vec(), [3., 2.]);
    /// ```
    MaxPool1d,
    try_max_pool1d,
    "kernel_size={K}, stride={S}, padding={P}, dilation=1, ceil_mode=False"
);
pool1d!(
    /// Average pooling over windows of `K` with stride `S` (default `K`) and
    /// padding `P` (counted in the average), like `nn.AvgPool1d(K, S, P)`, on
    /// `[batch, channels, length]`. The caller states the output length,
    /// checked at build time.
    AvgPool1d,
    try_avg_pool1d,
    "kernel_size=({K},), stride=({S},), padding=({P},)"
);

/// Average pooling to a fixed `OH`x`OW` output whatever the input size,
/// like `nn.AdaptiveAvgPool2d((OH, OW))`: output cell `i` averages input
/// rows `floor(i * h / OH)` up to (not including) `ceil((i + 1) * h / OH)`,
/// and likewise for columns. Its repr always prints the size as a pair.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::AdaptiveAvgPool2d, Forward};
/// let x = Tensor::<(C<1>, C<1>, C<1>, C<3>)>::from_vec(vec![1., 2., 4.], (C, C, C, C)).unwrap();
/// let y = AdaptiveAvgPool2d::<1, 2>.forward(x);
/// assert_eq!(y.to_vec(), [1.5, 3.0]);
/// ```
#[derive(Module, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct AdaptiveAvgPool2d<const OH: usize, const OW: usize = OH>;

impl<const OH: usize, const OW: usize> AdaptiveAvgPool2d<OH, OW> {
    fn extra_repr(&self) -> String {
        format!("output_size=({OH}, {OW})")
    }
}

/// The `[out, input]` matrix whose row `i` averages PyTorch's adaptive window
/// `floor(i * input / out) .. ceil((i + 1) * input / out)`.
fn adaptive_weights<E: Float, D: Device<E>>(
    out: usize,
    input: usize,
    device: &D,
) -> Tensor<(Dyn, Dyn), E, D> {
    let mut m = vec![E::from_f64(0.0); out * input];
    for i in 0..out {
        let start = i * input / out;
        let end = ((i + 1) * input).div_ceil(out);
        let share = E::from_f64(1.0 / (end - start) as f64);
        m[i * input + start..i * input + end].fill(share);
    }
    match Tensor::from_vec_on(m, (Dyn(out), Dyn(input)), device) {
        Ok(t) => t,
        Err(e) => unreachable!("the matrix fills its shape: {e}"),
    }
}

impl<B: Dim, Ch: Dim, H: Dim, W: Dim, const OH: usize, const OW: usize, E: Float, D: Device<E>>
    Forward<Tensor<(B, Ch, H, W), E, D>, Tensor<(B, Ch, C<OH>, C<OW>), E, D>>
    for AdaptiveAvgPool2d<OH, OW>
{
    fn try_forward(
        &self,
        x: Tensor<(B, Ch, H, W), E, D>,
    ) -> Result<Tensor<(B, Ch, C<OH>, C<OW>), E, D>> {
        let (h, w) = (x.dims()[2], x.dims()[3]);
        if OH == 0 || OW == 0 || h == 0 || w == 0 {
            return Err(Error::invalid(
                "AdaptiveAvgPool2d",
                format!("cannot pool a {h}x{w} input to {OH}x{OW}"),
            ));
        }
        if h.is_multiple_of(OH) && w.is_multiple_of(OW) {
            // Equal windows that tile the input: plain average pooling.
            let p = Pool2dParams::new([h / OH, w / OW]);
            return stated_output("AdaptiveAvgPool2d", x.try_avg_pool2d(p)?);
        }
        // The windows are rectangles, so the average is separable:
        // `rows @ x @ cols^T` with one averaging matrix per axis.
        let dev = x.device();
        let rows = adaptive_weights::<E, D>(OH, h, dev);
        let cols = adaptive_weights::<E, D>(OW, w, dev);
        let x = x.into_dyn();
        let y = rows.try_matmul(&x.try_matmul(&cols.t())?)?;
        Ok(super::restore(y))
    }
}
