//! Activation layers: modules wrapping the elementwise ops and softmax, so a
//! model can hold them as fields like `nn.ReLU()`. Each prints like its
//! PyTorch counterpart (`GELU(approximate='none')`, `Softmax(dim=-1)`).

use crate::module::py_float;
use crate::Forward;
use forma_core::device::Device;
use forma_core::shape::check::ConstMsg;
use forma_core::{Dim, Float, Shape, Tensor};
use forma_macros::Module;

macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident => $torch:literal, $extra:literal, |$x:ident| $body:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Module, Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[module(crate = "crate", name = $torch, extra_repr = "Self::extra_repr")]
        pub struct $name;

        impl $name {
            fn extra_repr(&self) -> String {
                $extra.to_string()
            }
        }

        impl<S: Shape, E: Float, D: Device<E>> Forward<Tensor<S, E, D>, Tensor<S, E, D>> for $name {
            fn try_forward(&self, $x: Tensor<S, E, D>) -> forma_core::Result<Tensor<S, E, D>> {
                Ok($body)
            }
        }
    )*};
}

activation! {
    /// `max(x, 0)`, like `nn.ReLU()`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::{layers::Relu, Forward};
    /// let y = Relu.forward(Tensor::<(C<2>,)>::from_vec(vec![-1.0, 2.0], (C,)).unwrap());
    /// assert_eq!(y.to_vec(), [0.0, 2.0]);
    /// ```
    Relu => "ReLU", "", |x| x.relu();
    /// The exact GELU, `x Φ(x)`, like `nn.GELU()` (`approximate='none'`).
    Gelu => "GELU", "approximate='none'", |x| x.gelu();
    /// GELU with the tanh approximation, like `nn.GELU(approximate='tanh')`:
    /// `x/2 (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::nn::{layers::GeluTanh, Forward, Module};
    /// let y = GeluTanh.forward(Tensor::<(C<2>,), f64>::from_vec(vec![0.0, 1.0], (C,)).unwrap());
    /// assert!((y.to_vec()[1] - 0.841_191_990_607_477_2).abs() < 1e-12);
    /// assert_eq!(GeluTanh.repr(), "GELU(approximate='tanh')");
    /// ```
    GeluTanh => "GELU", "approximate='tanh'", |x| x.gelu_tanh();
    /// `tanh(x)`, like `nn.Tanh()`.
    Tanh => "Tanh", "", |x| x.tanh();
    /// `1 / (1 + e^-x)`, like `nn.Sigmoid()`.
    Sigmoid => "Sigmoid", "", |x| x.sigmoid();
    /// `x * sigmoid(x)`, like `nn.SiLU()`.
    Silu => "SiLU", "", |x| x.silu();
    /// The input unchanged, like `nn.Identity()`.
    Identity => "Identity", "", |x| x;
}

/// `x` for `x > 0`, else `negative_slope * x`, like
/// `nn.LeakyReLU(negative_slope=0.01)`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::LeakyRelu, Forward, Module};
/// let act = LeakyRelu::new(0.2);
/// let y = act.forward(Tensor::<(C<2>,)>::from_vec(vec![-1.0, 2.0], (C,)).unwrap());
/// assert_eq!(y.to_vec(), [-0.2, 2.0]);
/// assert_eq!(LeakyRelu::default().repr(), "LeakyReLU(negative_slope=0.01)");
/// ```
#[derive(Module, Clone, Copy, Debug, PartialEq)]
#[module(crate = "crate", name = "LeakyReLU", extra_repr = "Self::extra_repr")]
pub struct LeakyRelu {
    /// The slope for negative inputs.
    pub negative_slope: f64,
}

impl Default for LeakyRelu {
    /// PyTorch's default slope, 0.01.
    fn default() -> Self {
        LeakyRelu::new(0.01)
    }
}

impl LeakyRelu {
    /// A leaky ReLU with slope `negative_slope` below zero.
    pub fn new(negative_slope: f64) -> Self {
        LeakyRelu { negative_slope }
    }

    fn extra_repr(&self) -> String {
        format!("negative_slope={}", py_float(self.negative_slope))
    }
}

impl<S: Shape, E: Float, D: Device<E>> Forward<Tensor<S, E, D>, Tensor<S, E, D>> for LeakyRelu {
    fn try_forward(&self, x: Tensor<S, E, D>) -> forma_core::Result<Tensor<S, E, D>> {
        Ok(x.leaky_relu(self.negative_slope))
    }
}

/// The axis a `dim` names in a tensor of rank `rank`, counting from the end
/// when negative as PyTorch does; a `dim` outside `-rank..rank` fails
/// `cargo build` (it is evaluated in a const block).
pub const fn resolve_dim(layer: &str, dim: isize, rank: usize) -> usize {
    let r = rank as isize;
    if dim < -r || dim >= r {
        let msg = ConstMsg::new().s(layer).s(": dim=");
        let msg = if dim < 0 { msg.s("-") } else { msg };
        msg.n(dim.unsigned_abs())
            .s(" is out of range for an input of rank ")
            .n(rank)
            .panic()
    }
    if dim < 0 {
        (dim + r) as usize
    } else {
        dim as usize
    }
}

/// Softmax along `DIM` (negative counts from the end), like
/// `nn.Softmax(dim=DIM)`. A `DIM` the input lacks fails `cargo build`.
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::{layers::Softmax, Forward, Module};
/// let y = Softmax::<-1>.forward(Tensor::<(C<1>, C<2>)>::from_vec(vec![1.0, 1.0], (C, C)).unwrap());
/// assert_eq!(y.to_vec(), [0.5, 0.5]);
/// assert_eq!(Softmax::<-1>.repr(), "Softmax(dim=-1)");
/// ```
#[derive(Module, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct Softmax<const DIM: isize>;

/// Log-softmax along `DIM` (negative counts from the end), like
/// `nn.LogSoftmax(dim=DIM)`. A `DIM` the input lacks fails `cargo build`.
#[derive(Module, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct LogSoftmax<const DIM: isize>;

impl<const DIM: isize> Softmax<DIM> {
    fn extra_repr(&self) -> String {
        format!("dim={DIM}")
    }
}

impl<const DIM: isize> LogSoftmax<DIM> {
    fn extra_repr(&self) -> String {
        format!("dim={DIM}")
    }
}

macro_rules! softmax_forward {
    ($layer:ident, $method:ident; $rank:literal; $($d:ident $i:literal),*) => {
        impl<$($d: Dim,)* E: Float, D: Device<E>, const DIM: isize>
            Forward<Tensor<($($d,)*), E, D>, Tensor<($($d,)*), E, D>> for $layer<DIM>
        {
            fn try_forward(&self, x: Tensor<($($d,)*), E, D>) -> forma_core::Result<Tensor<($($d,)*), E, D>> {
                match const { resolve_dim(stringify!($layer), DIM, $rank) } {
                    $($i => Ok(x.$method::<$i>()),)*
                    _ => unreachable!("resolve_dim returns an axis below the rank"),
                }
            }
        }
    };
}

macro_rules! softmax_ranks {
    ($layer:ident, $method:ident) => {
        softmax_forward!($layer, $method; 1; A0 0);
        softmax_forward!($layer, $method; 2; A0 0, A1 1);
        softmax_forward!($layer, $method; 3; A0 0, A1 1, A2 2);
        softmax_forward!($layer, $method; 4; A0 0, A1 1, A2 2, A3 3);
        softmax_forward!($layer, $method; 5; A0 0, A1 1, A2 2, A3 3, A4 4);
        softmax_forward!($layer, $method; 6; A0 0, A1 1, A2 2, A3 3, A4 4, A5 5);
    };
}

softmax_ranks!(Softmax, softmax);
softmax_ranks!(LogSoftmax, log_softmax);

// What each activation does to a shape, for `#[derive(Sequential)]`.

macro_rules! same_step {
    ($($name:ident),*) => {$(
        impl crate::shape_step::ShapeStep for $name {
            const STEP: crate::shape_step::Step = crate::shape_step::Step::same(stringify!($name));
        }
    )*};
}
same_step!(Relu, Gelu, GeluTanh, Tanh, Sigmoid, Silu, Identity, LeakyRelu);

/// The fewest axes a softmax along `dim` needs.
const fn softmax_min_rank(dim: isize) -> usize {
    if dim >= 0 {
        dim as usize + 1
    } else {
        dim.unsigned_abs()
    }
}

impl<const DIM: isize> crate::shape_step::ShapeStep for Softmax<DIM> {
    const STEP: crate::shape_step::Step = crate::shape_step::Step::Same {
        layer: "Softmax",
        min_rank: softmax_min_rank(DIM),
    };
}

impl<const DIM: isize> crate::shape_step::ShapeStep for LogSoftmax<DIM> {
    const STEP: crate::shape_step::Step = crate::shape_step::Step::Same {
        layer: "LogSoftmax",
        min_rank: softmax_min_rank(DIM),
    };
}

#[cfg(test)]
mod tests {
    use super::resolve_dim;

    #[test]
    fn dims_count_from_the_end_when_negative() {
        assert_eq!(resolve_dim("Softmax", -1, 3), 2);
        assert_eq!(resolve_dim("Softmax", -3, 3), 0);
        assert_eq!(resolve_dim("Softmax", 1, 3), 1);
    }

    #[test]
    #[should_panic(expected = "Softmax: dim=-4 is out of range for an input of rank 3")]
    fn a_dim_outside_the_rank_is_refused() {
        resolve_dim("Softmax", -4, 3);
    }
}
