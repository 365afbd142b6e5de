//! `MaxPool2d` and `AvgPool2d`, like `nn.MaxPool2d` and `nn.AvgPool2d`.

use super::check::assert_window;
use crate::Forward;
use forma_core::device::Device;
use forma_core::ops::pool::Pool2dParams;
use forma_core::{Dim, Dyn, Float, Tensor};
use forma_macros::Module;

/// Claims the stated output shape of a sliding-window layer; the static sizes
/// were checked at build time, so only `Dyn` sizes can disagree here.
pub(crate) fn stated_output<B: Dim, Ch: Dim, H2: Dim, W2: Dim, E: Float, D: Device<E>>(
    layer: &str,
    y: Tensor<(B, Ch, Dyn, Dyn), E, D>,
) -> Tensor<(B, Ch, H2, W2), E, D> {
    match y.try_into_shape() {
        Ok(y) => y,
        Err(e) => panic!("{layer}: the stated output size does not fit: {e}"),
    }
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
            fn forward(&self, x: Tensor<(B, Ch, H, W), E, D>) -> Tensor<(B, Ch, H2, W2), E, D> {
                const {
                    assert_window(stringify!($name), "height", H::STATIC, K, S, P, 1, H2::STATIC);
                    assert_window(stringify!($name), "width", W::STATIC, K, S, P, 1, W2::STATIC);
                };
                stated_output(stringify!($name), x.$method(params::<K, S, P>()))
            }
        }
    };
}

pool!(
    /// Max pooling over `K`x`K` windows with stride `S` (default `K`) and
    /// padding `P`, like `nn.MaxPool2d(K, S, P)`. The caller states the output
    /// size, checked at build time like [`super::Conv2d`]'s.
    MaxPool2d,
    max_pool2d,
    "kernel_size={K}, stride={S}, padding={P}, dilation=1, ceil_mode=False"
);
pool!(
    /// Average pooling over `K`x`K` windows with stride `S` (default `K`) and
    /// padding `P` (counted in the average), like `nn.AvgPool2d(K, S, P)`.
    AvgPool2d,
    avg_pool2d,
    "kernel_size={K}, stride={S}, padding={P}"
);
