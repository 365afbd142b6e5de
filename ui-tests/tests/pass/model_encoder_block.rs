// A transformer encoder block (post-norm, like `nn.TransformerEncoderLayer`
// with `batch_first=True`) over sequences whose length is only known at run
// time: `[batch, Dyn, 64]`. The embedding size is static, so the attention's
// head split and every layer's features are checked at build time.
use forma::nn::layers::{Dropout, Linear, LayerNorm, MultiheadAttention, Relu};
use forma::prelude::*;

#[derive(Module)]
pub struct EncoderBlock {
    pub self_attn: MultiheadAttention<64, 4>,
    pub linear1: Linear<64, 128>,
    pub dropout: Dropout,
    pub linear2: Linear<128, 64>,
    pub norm1: LayerNorm<64>,
    pub norm2: LayerNorm<64>,
    pub dropout1: Dropout,
    pub dropout2: Dropout,
    pub activation: Relu,
}

impl EncoderBlock {
    pub fn new(rng: &mut Rng) -> Self {
        EncoderBlock {
            self_attn: MultiheadAttention::new(&Cpu, rng),
            linear1: Linear::new(&Cpu, rng),
            dropout: Dropout::new(0.1, rng),
            linear2: Linear::new(&Cpu, rng),
            norm1: LayerNorm::new(&Cpu),
            norm2: LayerNorm::new(&Cpu),
            dropout1: Dropout::new(0.1, rng),
            dropout2: Dropout::new(0.1, rng),
            activation: Relu,
        }
    }
}

type Seq = Tensor![Dyn, Dyn, 64];

impl Forward<Seq, Seq> for EncoderBlock {
    fn try_forward(&self, x: Seq) -> forma::Result<Seq> {
        let attn = child!(self.dropout1, child!(self.self_attn, x.clone())?)?;
        let x = child!(self.norm1, &x + &attn)?;
        let hidden = child!(self.activation, child!(self.linear1, x.clone())?)?;
        let hidden = child!(self.dropout, hidden)?;
        let ff = child!(self.dropout2, child!(self.linear2, hidden)?)?;
        child!(self.norm2, &x + &ff)
    }
}

#[allow(dead_code)]
fn main() {
    let mut rng = Rng::seed_from(0);
    let mut block = EncoderBlock::new(&mut rng);
    block.eval();
    for len in [3, 7] {
        let y = block.forward(Tensor::randn((Dyn(2), Dyn(len), C), &mut rng));
        assert_eq!(y.dims()[..], [2, len, 64]);
    }
}
