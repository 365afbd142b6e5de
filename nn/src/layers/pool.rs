//! Pooling layers: `MaxPool1d`, `MaxPool2d`, `AvgPool1d`, `AvgPool2d` and
//! `AdaptiveAvgPool2d`, like PyTorch's. `MaxPool2d` takes dilation and
//! `ceil_mode`, `AvgPool2d` `ceil_mode` and `count_include_pad`, as const
//! parameters after the window's (defaults PyTorch's); the 1-d layers keep
//! PyTorch's defaults for those.

use super::check::{assert_pool_window, assert_transposed_window, assert_window};
use crate::module::ok;
use crate::Forward;
use forma_core::device::Device;
use forma_core::ops::pool::Pool2dParams;
use forma_core::{Dim, Dyn, Error, Float, Result, Tensor, C};
use forma_cpu::Cpu;
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

/// Pooled values and the indices of their maxima, `[batch, channels, h, w]`
/// each: what [`MaxPool2d::forward_with_indices`] returns and
/// [`MaxUnpool2d`] takes, like PyTorch's `(output, indices)`.
pub type Pooled<B, Ch, H, W, E = f32, D = Cpu> =
    (Tensor<(B, Ch, H, W), E, D>, Tensor<(B, Ch, H, W), i64, D>);

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

    /// Fails the build when a static output size is not the window's.
    fn check_window<H: Dim, W: Dim, H2: Dim, W2: Dim>() {
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
    }

    fn pool_params() -> Pool2dParams {
        Pool2dParams {
            dilation: [L, L],
            ceil_mode: CEIL,
            ..params::<K, S, P>()
        }
    }

    /// The pooled values and where each came from, like the layer built
    /// with `return_indices=True`: each index is the flat position
    /// `row * w + col` of the maximum in its input plane (`int64`), what
    /// [`MaxUnpool2d`] takes back.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::layers::{MaxPool2d, MaxUnpool2d};
    /// use forma::nn::Forward;
    /// let x = Tensor::<(C<1>, C<1>, C<2>, C<4>)>::from_vec(vec![1., 5., 2., 0., 3., 4., 7., 6.], (C, C, C, C)).unwrap();
    /// let (y, idx): (Tensor<(C<1>, C<1>, C<1>, C<2>)>, _) = MaxPool2d::<2>.forward_with_indices(x);
    /// assert_eq!((y.to_vec(), idx.to_vec()), (vec![5., 7.], vec![1, 6]));
    /// let back: Tensor<(C<1>, C<1>, C<2>, C<4>)> = MaxUnpool2d::<2>.forward((y, idx));
    /// assert_eq!(back.to_vec(), [0., 5., 0., 0., 0., 0., 7., 0.]);
    /// ```
    ///
    /// # Panics
    /// When a `Dyn` input is too small for the window.
    #[track_caller]
    pub fn forward_with_indices<
        B: Dim,
        Ch: Dim,
        H: Dim,
        W: Dim,
        H2: Dim,
        W2: Dim,
        E: Float,
        D: Device<E>,
    >(
        &self,
        x: Tensor<(B, Ch, H, W), E, D>,
    ) -> Pooled<B, Ch, H2, W2, E, D> {
        ok(self.try_forward_with_indices(x))
    }

    /// Fallible [`MaxPool2d::forward_with_indices`].
    ///
    /// # Errors
    /// When the window does not fit the padded input, or a `Dyn` input
    /// gives another output size than the one stated.
    pub fn try_forward_with_indices<
        B: Dim,
        Ch: Dim,
        H: Dim,
        W: Dim,
        H2: Dim,
        W2: Dim,
        E: Float,
        D: Device<E>,
    >(
        &self,
        x: Tensor<(B, Ch, H, W), E, D>,
    ) -> Result<Pooled<B, Ch, H2, W2, E, D>> {
        Self::check_window::<H, W, H2, W2>();
        let (y, idx) = x.try_max_pool2d_with_indices(Self::pool_params())?;
        let idx = idx.try_into_shape().map_err(|e| {
            Error::invalid(
                "MaxPool2d",
                format!("the stated output size does not fit: {e}"),
            )
        })?;
        Ok((stated_output("MaxPool2d", y)?, idx))
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
        Self::check_window::<H, W, H2, W2>();
        stated_output("MaxPool2d", x.try_max_pool2d(Self::pool_params())?)
    }
}

/// The inverse of max pooling, like `nn.MaxUnpool2d(K, S, P)`: each value
/// of `(values, indices)` (from [`MaxPool2d::forward_with_indices`]) put
/// back at its index in a zero map, every other position zero. The output
/// size is PyTorch's default, `(h - 1) S - 2P + K` per axis (a static size
/// that disagrees fails the build); [`MaxUnpool2d::try_forward_with_size`]
/// takes PyTorch's `output_size` instead (an input whose pooling rounded
/// down). Where several values name one position (overlapping windows
/// sharing a maximum) the last is kept, as PyTorch's CPU kernel does.
/// See [`forma_core::Tensor::try_max_unpool2d`].
#[derive(Module, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct MaxUnpool2d<const K: usize, const S: usize = K, const P: usize = 0>;

impl<const K: usize, const S: usize, const P: usize> MaxUnpool2d<K, S, P> {
    fn extra_repr(&self) -> String {
        format!("kernel_size=({K}, {K}), stride=({S}, {S}), padding=({P}, {P})")
    }

    /// The default output size along an axis of `n` pooled values.
    fn default_size(n: usize) -> Option<usize> {
        (n.checked_sub(1)? * S + K).checked_sub(2 * P)
    }

    /// Unpooling into `output_size` (`[h, w]`), like `unpool(y, idx,
    /// output_size)`: as PyTorch, it must lie between the default size and
    /// one stride less than the next.
    ///
    /// # Errors
    /// An output size outside that range, indices of other sizes than the
    /// values, or an index outside the output.
    pub fn try_forward_with_size<B: Dim, Ch: Dim, H: Dim, W: Dim, E: Float, D: Device<E>>(
        &self,
        (y, idx): Pooled<B, Ch, H, W, E, D>,
        output_size: [usize; 2],
    ) -> Result<Tensor<(B, Ch, Dyn, Dyn), E, D>> {
        let d = y.dims();
        for (axis, (&n, &size)) in d[2..].iter().zip(&output_size).enumerate() {
            let fits = Self::default_size(n).is_some_and(|lo| (lo..lo + S).contains(&size));
            if !fits {
                return Err(Error::invalid(
                    "MaxUnpool2d",
                    format!(
                        "output_size {output_size:?}: axis {} must be between {:?} and one stride ({S}) more, for {n} pooled values",
                        axis + 2,
                        Self::default_size(n)
                    ),
                ));
            }
        }
        y.try_max_unpool2d(&idx, output_size)
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
        E: Float,
        D: Device<E>,
    > Forward<Pooled<B, Ch, H, W, E, D>, Tensor<(B, Ch, H2, W2), E, D>> for MaxUnpool2d<K, S, P>
{
    fn try_forward(
        &self,
        (y, idx): Pooled<B, Ch, H, W, E, D>,
    ) -> Result<Tensor<(B, Ch, H2, W2), E, D>> {
        const {
            assert_transposed_window(
                "MaxUnpool2d",
                "height",
                H::STATIC,
                K,
                S,
                P,
                0,
                1,
                H2::STATIC,
            );
            assert_transposed_window("MaxUnpool2d", "width", W::STATIC, K, S, P, 0, 1, W2::STATIC);
        };
        let d = y.dims();
        let size = |n: usize| {
            Self::default_size(n).ok_or_else(|| {
                Error::invalid(
                    "MaxUnpool2d",
                    format!(
                        "{n} pooled values give no output with kernel {K}, stride {S}, padding {P}"
                    ),
                )
            })
        };
        let out = [size(d[2])?, size(d[3])?];
        stated_output("MaxUnpool2d", y.try_max_unpool2d(&idx, out)?)
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

// What each pooling layer does to a shape, for `#[derive(Sequential)]`.
use crate::shape_step::{ShapeStep, Step, WindowAxis};

impl<const K: usize, const S: usize, const P: usize, const L: usize, const CEIL: bool> ShapeStep
    for MaxPool2d<K, S, P, L, CEIL>
{
    const STEP: Step = {
        let axis = WindowAxis {
            ceil_mode: CEIL,
            ..WindowAxis::new(K, S, P, L)
        };
        Step::Window {
            layer: "MaxPool2d",
            channels: None,
            spatial: 2,
            axes: [axis, axis],
        }
    };
}

impl<const K: usize, const S: usize, const P: usize, const CEIL: bool, const COUNT_PAD: bool>
    ShapeStep for AvgPool2d<K, S, P, CEIL, COUNT_PAD>
{
    const STEP: Step = {
        let axis = WindowAxis {
            ceil_mode: CEIL,
            ..WindowAxis::new(K, S, P, 1)
        };
        Step::Window {
            layer: "AvgPool2d",
            channels: None,
            spatial: 2,
            axes: [axis, axis],
        }
    };
}

macro_rules! pool1d_step {
    ($($name:ident),*) => {$(
        impl<const K: usize, const S: usize, const P: usize> ShapeStep for $name<K, S, P> {
            const STEP: Step = Step::Window {
                layer: stringify!($name),
                channels: None,
                spatial: 1,
                axes: [WindowAxis::new(K, S, P, 1), WindowAxis::new(K, S, P, 1)],
            };
        }
    )*};
}
pool1d_step!(MaxPool1d, AvgPool1d);

impl<const OH: usize, const OW: usize> ShapeStep for AdaptiveAvgPool2d<OH, OW> {
    const STEP: Step = Step::Resize {
        layer: "AdaptiveAvgPool2d",
        spatial: 2,
        out: [OH, OW],
    };
}
