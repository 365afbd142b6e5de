// `#[derive(Sequential)]` over every nn layer type that takes one tensor,
// a user's layer that states its shape step, a nested sequential model and
// a model generic over a const size. The derive knows no layer by name: it
// asks each field's `ShapeStep`, and the sizes written in the annotations
// below are the ones it works out (a wrong one would not compile).
use forma::nn::layers::{
    AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv1d, Conv2d,
    Conv2dRect, ConvTranspose2d, Dropout, Flatten, Gelu, GeluTanh, GroupNorm, Gru, Identity,
    LayerNorm, LeakyRelu, Linear, LogSoftmax, Lstm, MaxPool1d, MaxPool2d, MultiheadAttention,
    RMSNorm, Relu, SeqFirst, Sigmoid, Silu, Softmax, Tanh, TransformerEncoder,
    TransformerEncoderLayer,
};
use forma::nn::shape_step::{ShapeStep, Step};
use forma::prelude::*;

/// Images: [B, 3, 16, 16] through every 2-d layer, then the 1-d ones.
#[derive(Module, Sequential)]
#[sequential(input = [B, 3, 16, 16], output = [B, 10])]
pub struct Images<E: Float = f32, D: Device<E> = Cpu> {
    conv: Conv2d<3, 8, 3, 1, 1, 1, E, D>, // 16x16
    bn: BatchNorm2d<8, E, D>,
    relu: Relu,
    pool: MaxPool2d<3, 2, 0, 1, true>, // ceil_mode: 16 -> 8
    rect: Conv2dRect<8, 8, 3, 1, 1, 1, 1, 0, 1, 1, E, D>,
    gn: GroupNorm<2, 8, E, D>,
    leaky: LeakyRelu,
    avg: AvgPool2d<2>,                       // 8 -> 4
    up: ConvTranspose2d<8, 4, 2, 2, 0, 0, 1, E, D>, // 4 -> 8
    silu: Silu,
    adapt: AdaptiveAvgPool2d<2>, // [B, 4, 2, 2]
    flatten: Flatten,            // [B, 16]
    fc: Linear<16, 32, E, D>,
    bn1: BatchNorm1d<32, E, D>,
    gelu: Gelu,
    drop: Dropout,
    gelu_tanh: GeluTanh,
    ln: LayerNorm<32, E, D>,
    rms: RMSNorm<32, E, D>,
    sigmoid: Sigmoid,
    tanh: Tanh,
    id: Identity,
    head: Linear<32, 10, E, D>,
    log_softmax: LogSoftmax<-1>,
}

/// Signals: [B, 2, 32] through the 1-d layers.
#[derive(Module, Sequential)]
#[sequential(input = [B, 2, 32], output = [B, 3])]
pub struct Signals {
    conv: Conv1d<2, 4, 3>, // 30
    bn: BatchNorm1d<4>,
    max: MaxPool1d<2>, // 15
    avg: AvgPool1d<3>, // 5
    flatten: Flatten,  // 20
    fc: Linear<20, 3>,
    softmax: Softmax<1>,
}

/// Sequences: [B, T, 8] with both sizes known at run time only.
#[derive(Module, Sequential)]
#[sequential(input = [B, T, 8], output = [B, T, 5])]
pub struct Sequences {
    proj: Linear<8, 16>,
    lstm: Lstm<16, 16, true, f32, Cpu, 4>, // proj_size 4, both directions: 8
    gru: Gru<8, 8>,
    attn: MultiheadAttention<8, 2>,
    layer: TransformerEncoderLayer<8, 2, 16>,
    encoder: TransformerEncoder<8, 2, 16>,
    norm: LayerNorm<8>,
    head: Linear<8, 5>,
}

/// Sequence-first: [T, B, 8].
#[derive(Module, Sequential)]
#[sequential(input = [T, B, 8], output = [T, B, 2])]
pub struct SequenceFirst {
    rnn: SeqFirst<Gru<8, 4>>,
    head: Linear<4, 2>,
}

/// A user's layer: it says what it does to a shape, so the derive follows it.
#[derive(Module)]
pub struct Residual {
    fc: Linear<16, 16>,
}

impl ShapeStep for Residual {
    const STEP: Step = Step::features("Residual", 16, 16);
}

impl Forward<Tensor<(Dyn, C<16>)>, Tensor<(Dyn, C<16>)>> for Residual {
    fn try_forward(&self, x: Tensor<(Dyn, C<16>)>) -> forma::Result<Tensor<(Dyn, C<16>)>> {
        Ok(&child!(self.fc, x.clone())? + &x)
    }
}

/// A sequential model used as a layer of another.
#[derive(Module, Sequential)]
#[sequential(input = [B, 4], output = [B, 16])]
pub struct Stem {
    fc: Linear<4, 16>,
    relu: Relu,
}

#[derive(Module, Sequential)]
#[sequential(input = [Dyn, 4], output = [Dyn, 2])]
pub struct Nested {
    stem: Stem,
    block: Residual,
    head: Linear<16, 2>,
}

/// Generic over a const size: followed by the types alone.
#[derive(Module, Sequential)]
#[sequential(input = [B, 4], output = [B, 2])]
pub struct Mlp<const H: usize> {
    fc1: Linear<4, H>,
    relu: Relu,
    fc2: Linear<H, 2>,
}

#[allow(dead_code)]
fn main() {
    let mut rng = Rng::seed_from(0);
    let dev = &Cpu;
    let images = Images::<f32, Cpu> {
        conv: Conv2d::new(dev, &mut rng),
        bn: BatchNorm2d::new(dev),
        relu: Relu,
        pool: MaxPool2d,
        rect: Conv2dRect::new(dev, &mut rng),
        gn: GroupNorm::new(dev),
        leaky: LeakyRelu::new(0.01),
        avg: AvgPool2d,
        up: ConvTranspose2d::new(dev, &mut rng),
        silu: Silu,
        adapt: AdaptiveAvgPool2d,
        flatten: Flatten,
        fc: Linear::new(dev, &mut rng),
        bn1: BatchNorm1d::new(dev),
        gelu: Gelu,
        drop: Dropout::new(0.5, &mut rng),
        gelu_tanh: GeluTanh,
        ln: LayerNorm::new(dev),
        rms: RMSNorm::new(dev),
        sigmoid: Sigmoid,
        tanh: Tanh,
        id: Identity,
        head: Linear::new(dev, &mut rng),
        log_softmax: LogSoftmax,
    };
    let x = Tensor::<(Dyn, C<3>, C<16>, C<16>)>::randn((Dyn(2), C, C, C), &mut rng);
    let y: Tensor<(Dyn, C<10>)> = images.forward(x);
    assert_eq!(y.dims()[..], [2, 10]);
    let total: f32 = y.exp().to_vec().iter().sum();
    assert!((total - 2.0).abs() < 1e-4, "log-softmax rows: {total}");

    let signals = Signals {
        conv: Conv1d::new(dev, &mut rng),
        bn: BatchNorm1d::new(dev),
        max: MaxPool1d,
        avg: AvgPool1d,
        flatten: Flatten,
        fc: Linear::new(dev, &mut rng),
        softmax: Softmax,
    };
    let x = Tensor::<(Dyn, C<2>, C<32>)>::randn((Dyn(3), C, C), &mut rng);
    let y: Tensor<(Dyn, C<3>)> = signals.forward(x);
    assert_eq!(y.dims()[..], [3, 3]);

    let sequences = Sequences {
        proj: Linear::new(dev, &mut rng),
        lstm: Lstm::new(1, dev, &mut rng),
        gru: Gru::new(1, dev, &mut rng),
        attn: MultiheadAttention::new(dev, &mut rng),
        layer: TransformerEncoderLayer::new(dev, &mut rng),
        encoder: TransformerEncoder::new(2, dev, &mut rng),
        norm: LayerNorm::new(dev),
        head: Linear::new(dev, &mut rng),
    };
    let x = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
    let y: Tensor<(Dyn, Dyn, C<5>)> = sequences.forward(x);
    assert_eq!(y.dims()[..], [2, 5, 5]);

    let first = SequenceFirst {
        rnn: SeqFirst(Gru::new(1, dev, &mut rng)),
        head: Linear::new(dev, &mut rng),
    };
    let x = Tensor::<(Dyn, Dyn, C<8>)>::randn((Dyn(5), Dyn(2), C), &mut rng);
    let y: Tensor<(Dyn, Dyn, C<2>)> = first.forward(x);
    assert_eq!(y.dims()[..], [5, 2, 2]);

    let nested = Nested {
        stem: Stem {
            fc: Linear::new(dev, &mut rng),
            relu: Relu,
        },
        block: Residual {
            fc: Linear::new(dev, &mut rng),
        },
        head: Linear::new(dev, &mut rng),
    };
    let x = Tensor::<(Dyn, C<4>)>::randn((Dyn(3), C), &mut rng);
    let y: Tensor<(Dyn, C<2>)> = nested.forward(x.clone());
    // The same chain by hand gives the same numbers.
    let h = nested.stem.fc.forward(x).relu();
    let h = &nested.block.fc.forward(h.clone()) + &h;
    let expected: Tensor<(Dyn, C<2>)> = nested.head.forward(h);
    assert_eq!(y.to_vec(), expected.to_vec());
    assert_eq!(nested.state_dict().len(), 6);

    let mlp = Mlp::<7> {
        fc1: Linear::new(dev, &mut rng),
        relu: Relu,
        fc2: Linear::new(dev, &mut rng),
    };
    let x = Tensor::<(Dyn, C<4>)>::randn((Dyn(3), C), &mut rng);
    let y: Tensor<(Dyn, C<2>)> = mlp.forward(x);
    assert_eq!(y.dims()[..], [3, 2]);
}
