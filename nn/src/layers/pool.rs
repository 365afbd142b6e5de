//! Pooling layers: `MaxPool1d`, `MaxPool2d`, `AvgPool1d`, `AvgPool2d` and
//! `AdaptiveAvgPool2d`, like PyTorch's. `MaxPool2d` takes dilation and
//! `ceil_mode`, `AvgPool2d` `ceil_mode` and `count_include_pad`, as const
//! parameters after the window's (defaults PyTorch's); the 1-d layers keep
//! PyTorch's defaults for those.

use super::check::{assert_pool_window, assert_window};
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

/// Max pooling over `K`x`K` windows with stride `S` (default `K`), padding
/// `P`, dilation `L` (default 1) and `CEIL` mode (default `false`), like
/// `nn.MaxPool2d(K, S, P, dilation=L, ceil_mode=CEIL)`. The caller states
/// the output size, checked at build time like [`super::Conv2d`]'s.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::MaxPool2d, Forward};
/// let row = vec![1., 3., 2., 0., 4.];
/// let x = Tensor::<(C<1>, C<1>, C<2>, C<5>)>::from_vec([row.clone(), row].concat(), (C, C, C, C)).unwrap();
/// let y: Tensor<(C<1>, C<1>, C<1>, C<2>)> = MaxPool2d::<2>.forward(x.clone());
/// assert_eq!(y.to_vec(), [3., 2.]);
/// // ceil_mode keeps the last, partial window: a width of 5 gives 3.
/// let y: Tensor<(C<1>, C<1>, C<1>, C<3>)> = MaxPool2d::<2, 2, 0, 1, true>.forward(x);
/// assert_eq!(y.to_vec(), [3., 2., 4.]);
/// ```
#[derive(Module, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct MaxPool2d<
    const K: usize,
    const S: usize = K,
    const P: usize = 0,
    const L: usize = 1,
    const CEIL: bool = false,
>;

impl<const K: usize, const S: usize, const P: usize, const L: usize, const CEIL: bool>
    MaxPool2d<K, S, P, L, CEIL>
{
    fn extra_repr(&self) -> String {
        let ceil = if CEIL { "True" } else { "False" };
        format!("kernel_size={K}, stride={S}, padding={P}, dilation={L}, ceil_mode={ceil}")
    }
}

impl<
        B: Dim,
        Ch: Dim,
        H: Dim,
        W: Dim,
        H2: Dim,
        W2: Dim,
        const K: usize,
        const S: usize,
        const P: usize,
        const L: usize,
        const CEIL: bool,
        E: Float,
        D: Device<E>,
    > Forward<Tensor<(B, Ch, H, W), E, D>, Tensor<(B, Ch, H2, W2), E, D>>
    for MaxPool2d<K, S, P, L, CEIL>
{
    fn try_forward(&self, x: Tensor<(B, Ch, H, W), E, D>) -> Result<Tensor<(B, Ch, H2, W2), E, D>> {
        const {
            assert_pool_window(
                "MaxPool2d",
                "height",
                H::STATIC,
                K,
                S,
                P,
                L,
                CEIL,
                H2::STATIC,
            );
            assert_pool_window(
                "MaxPool2d",
                "width",
                W::STATIC,
                K,
                S,
                P,
                L,
                CEIL,
                W2::STATIC,
            );
        };
        let p = Pool2dParams {
            dilation: [L, L],
            ceil_mode: CEIL,
            ..params::<K, S, P>()
        };
        stated_output("MaxPool2d", x.try_max_pool2d(p)?)
    }
}

/// Average pooling over `K`x`K` windows with stride `S` (default `K`),
/// padding `P`, `CEIL` mode (default `false`) and `COUNT_PAD` (default
/// `true`: padded zeros count in the divisor), like `nn.AvgPool2d(K, S, P,
/// ceil_mode=CEIL, count_include_pad=COUNT_PAD)`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::AvgPool2d, Forward};
/// let x = Tensor::<(C<1>, C<1>, C<1>, C<2>)>::from_vec(vec![2., 4.], (C, C, C, C)).unwrap();
/// // 3x3 windows with padding 1: the padded zeros count in the divisor or not.
/// let y: Tensor<(C<1>, C<1>, C<1>, C<2>)> = AvgPool2d::<3, 1, 1>.forward(x.clone());
/// assert!(y.to_vec().iter().all(|v| (v - 6. / 9.).abs() < 1e-6));
/// let y: Tensor<(C<1>, C<1>, C<1>, C<2>)> = AvgPool2d::<3, 1, 1, false, false>.forward(x);
/// assert_eq!(y.to_vec(), [3., 3.]);
/// ```
#[derive(Module, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct AvgPool2d<
    const K: usize,
    const S: usize = K,
    const P: usize = 0,
    const CEIL: bool = false,
    const COUNT_PAD: bool = true,
>;

impl<const K: usize, const S: usize, const P: usize, const CEIL: bool, const COUNT_PAD: bool>
    AvgPool2d<K, S, P, CEIL, COUNT_PAD>
{
    /// PyTorch's `AvgPool2d` prints only the window, whatever its modes.
    fn extra_repr(&self) -> String {
        format!("kernel_size={K}, stride={S}, padding={P}")
    }
}

impl<
        B: Dim,
        Ch: Dim,
        H: Dim,
        W: Dim,
        H2: Dim,
        W2: Dim,
        const K: usize,
        const S: usize,
        const P: usize,
        const CEIL: bool,
        const COUNT_PAD: bool,
        E: Float,
        D: Device<E>,
    > Forward<Tensor<(B, Ch, H, W), E, D>, Tensor<(B, Ch, H2, W2), E, D>>
    for AvgPool2d<K, S, P, CEIL, COUNT_PAD>
{
    fn try_forward(&self, x: Tensor<(B, Ch, H, W), E, D>) -> Result<Tensor<(B, Ch, H2, W2), E, D>> {
        const {
            assert_pool_window(
                "AvgPool2d",
                "height",
                H::STATIC,
                K,
                S,
                P,
                1,
                CEIL,
                H2::STATIC,
            );
            assert_pool_window(
                "AvgPool2d",
                "width",
                W::STATIC,
                K,
                S,
                P,
                1,
                CEIL,
                W2::STATIC,
            );
        };
        let p = Pool2dParams {
            ceil_mode: CEIL,
            count_include_pad: COUNT_PAD,
            ..params::<K, S, P>()
        };
        stated_output("AvgPool2d", x.try_avg_pool2d(p)?)
    }
}

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
