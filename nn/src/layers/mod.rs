//! Layers in PyTorch's names, parameter shapes and default initialisation.
//! Each is a derived [`crate::Module`], so its `state_dict` keys are PyTorch's.
//!
//! Sizes that decide a layer's parameter shapes are const generics
//! (`Linear<784, 512>`); a layer's output size that needs arithmetic stable Rust
//! cannot do in types (a convolution's height) is stated by the caller's type
//! annotation and checked when the program is built (see [`check`]).

pub mod activation;
pub mod attention;
pub mod check;
pub mod conv;
pub mod dropout;
pub mod embedding;
pub mod flatten;
pub mod linear;
pub mod norm;
pub mod pool;
pub mod recurrent;
pub mod seq_first;
pub mod transformer;
pub mod transformer_stack;

pub use activation::{
    Gelu, GeluTanh, Identity, LeakyRelu, LogSoftmax, Relu, Sigmoid, Silu, Softmax, Tanh,
};
pub use attention::{
    AttnMasks, AttnOutput, Mask, MultiheadAttention, NonDynamicallyQuantizableLinear,
};
pub use conv::{Conv1d, Conv2d, Conv2dRect, ConvTranspose2d, PaddingMode};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use flatten::Flatten;
pub use linear::{Bilinear, Linear, LinearFeatures};
pub use norm::{BatchNorm1d, BatchNorm2d, BatchNormOptions, GroupNorm, LayerNorm, RMSNorm};
pub use pool::{
    AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d, MaxUnpool2d, Pooled,
};
pub use recurrent::{Gru, Lstm, LstmState, RnnOptions, RnnParams, RnnWeights};
pub use seq_first::{SeqFirst, SeqFirstAttnOutput};
pub use transformer::{
    Activation, TransformerDecoderLayer, TransformerEncoderLayer, TransformerOptions,
};
pub use transformer_stack::{TransformerDecoder, TransformerEncoder};

use forma_core::{Backend, Float, Rng, Shape, Tensor};

/// PyTorch's default init for Linear and Conv weights and biases
/// (`kaiming_uniform_(a=sqrt(5))`, which is `U(-1/sqrt(fan_in), 1/sqrt(fan_in))`).
pub(crate) fn fan_in_uniform<S: Shape, E: Float, D: forma_core::device::Device<E>>(
    shape: S,
    fan_in: usize,
    device: &D,
    rng: &mut Rng,
) -> Tensor<S, E, D> {
    let bound = if fan_in == 0 {
        0.0
    } else {
        1.0 / (fan_in as f64).sqrt()
    };
    Tensor::uniform_on(shape, -bound, bound, rng, device).requires_grad()
}

/// Gives a result computed on erased (`Dyn`) sizes back its caller's shape
/// type. Layers compute on erased sizes so that their generic batch and
/// length dims need no broadcasting bounds; the sizes are unchanged, so this
/// cannot fail.
pub(crate) fn restore<S: Shape, S2: Shape, E: Float, D: Backend>(
    y: Tensor<S2, E, D>,
) -> Tensor<S, E, D> {
    match y.try_into_shape::<S>() {
        Ok(y) => y,
        Err(e) => unreachable!("a layer changed its output sizes: {e}"),
    }
}

/// A buffer or parameter filled with `value`.
pub(crate) fn filled<S: Shape, E: Float, D: Backend>(
    shape: S,
    value: f64,
    device: &D,
) -> Tensor<S, E, D> {
    Tensor::full_on(shape, E::from_f64(value), device)
}
