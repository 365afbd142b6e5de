//! 04: the module DSL in depth — nested modules, a `Vec` of blocks, field
//! attributes, PyTorch's state_dict names, and the errors a wrong
//! checkpoint or a wrong layer size gives.
//!
//! Run with `cargo run --release -p forma-examples --example 04-dsl-state-dict`.
//!
//! `#[derive(Module)]` walks the fields: a tensor is a parameter (or, with
//! `#[module(buffer)]`, a buffer), anything else a child module, `Vec`s and
//! `Option`s included. The names are the ones PyTorch's `state_dict()` gives
//! the same architecture, so checkpoints move between the two unchanged.

use forma::nn::layers::{Embedding, LayerNorm, Linear, Relu};
use forma::prelude::*;

/// One residual block, `x + relu(fc(norm(x)))`: two child modules.
#[derive(Module)]
struct Block {
    norm: LayerNorm<16>,
    fc: Linear<16, 16>,
}

impl Block {
    fn new(rng: &mut Rng) -> Self {
        Block {
            norm: LayerNorm::new(&Cpu),
            fc: Linear::new(&Cpu, rng),
        }
    }

    // A hand-written forward: any method will do; `Forward` (below) is
    // the trait generic code calls.
    fn forward(&self, x: Tensor<(Dyn, C<16>)>) -> Tensor<(Dyn, C<16>)> {
        let h = self.fc.forward(self.norm.forward(x.clone())).relu();
        &x + &h
    }
}

/// A toy token classifier whose embedding key follows Hugging Face BERT's.
#[derive(Module)]
struct Encoder {
    /// `rename` sets the key: `embeddings.word_embeddings.weight`, not `embed.weight`.
    #[module(rename = "embeddings.word_embeddings")]
    embed: Embedding<100, 16>,
    /// A buffer (`register_buffer`): saved and loaded, never trained.
    #[module(buffer)]
    scale: Tensor<(C<16>,)>,
    /// A non-persistent buffer (`persistent=False`): moves with the model,
    /// but the state_dict leaves it out.
    #[module(buffer(persistent = false))]
    position_ids: Tensor<(C<8>,), i64>,
    /// A `Vec` of children: `layers.0.norm.weight`, `layers.1...`, like `nn.ModuleList`.
    layers: Vec<Block>,
    head: Linear<16, 4>,
    /// Not part of the model: `skip` leaves it out of every traversal.
    #[module(skip)]
    vocab: Vec<String>,
}

impl Encoder {
    fn new(rng: &mut Rng) -> Self {
        Encoder {
            embed: Embedding::new(&Cpu, rng),
            scale: Tensor::full(0.25),
            position_ids: Tensor::from_vec((0..8).collect(), (C,)).expect("8 ids"),
            layers: (0..2).map(|_| Block::new(rng)).collect(),
            head: Linear::new(&Cpu, rng),
            vocab: (0..100).map(|i| format!("tok{i}")).collect(),
        }
    }

    fn forward(&self, tokens: Tensor<(Dyn,), i64>) -> Tensor<(Dyn, C<4>)> {
        let mut x: Tensor<(Dyn, C<16>)> = &self.embed.forward(tokens) * &self.scale;
        for block in &self.layers {
            x = block.forward(x);
        }
        self.head.forward(x)
    }
}

/// `#[derive(Sequential)]` writes `forward` from the declared shapes and
/// checks every step when the program is built.
#[derive(Module, Sequential)]
#[sequential(input = [B, 16], output = [B, 4])]
struct Mlp {
    fc1: Linear<16, 32>,
    act: Relu,
    fc2: Linear<32, 4>,
    // With `fc2: Linear<64, 4>` the build fails, on this field, with:
    //   error: layer `fc2` (Linear) takes 64 input features, but receives [B, 32] (32 features) from `act`
}

fn main() {
    let mut rng = Rng::seed_from(0);
    let enc = Encoder::new(&mut rng);

    // `repr()` prints like PyTorch's `print(model)`.
    println!("{}\n", enc.repr());

    // PyTorch's names and shapes, persistent buffers included.
    let sd = enc.state_dict();
    println!("state_dict ({} tensors):", sd.len());
    for (key, t) in sd.iter() {
        println!("  {key:<36} {:?} {}", t.dims(), t.dtype());
    }
    let buffers: Vec<String> = enc.named_buffers().into_iter().map(|(k, _)| k).collect();
    println!("buffers: {buffers:?} (position_ids is not persistent: not in the state_dict)");
    println!(
        "{} trainable parameters; the skipped vocab has {} entries\n",
        enc.num_parameters(),
        enc.vocab.len()
    );

    let tokens = Tensor::<(Dyn,), i64>::from_vec(vec![5, 17, 42], (Dyn(3),)).expect("3 tokens");
    let logits = enc.forward(tokens);
    println!("3 tokens -> logits {:?}\n", logits.dims());

    // A checkpoint whose key is misspelt: the load is refused as a whole,
    // every bad key listed, with the nearest real key as a hint.
    let renamed = sd.clone().remap(|k| Some(k.replace("head.", "heads.")));
    let mut other = Encoder::new(&mut Rng::seed_from(1));
    let before = other.state_dict();
    match other.load_state_dict(&renamed) {
        Ok(_) => unreachable!("a renamed key does not load strictly"),
        Err(e) => println!("{e}"),
    }
    let untouched = other
        .state_dict()
        .iter()
        .all(|(k, t)| before.get(k).is_some_and(|b| b.bytes() == t.bytes()));
    println!("the failed load changed nothing: {untouched}");
    // The right keys load; the copy computes the same function.
    other.load_state_dict(&sd).expect("same architecture");
    println!("loaded with the right keys: {} tensors\n", sd.len());

    let mlp = Mlp {
        fc1: Linear::new(&Cpu, &mut rng),
        act: Relu,
        fc2: Linear::new(&Cpu, &mut rng),
    };
    println!("{}", mlp.repr());
    let y: Tensor<(Dyn, C<4>)> = mlp.forward(Tensor::zeros_with((Dyn(2), C)));
    println!("Mlp on a batch of 2 -> {:?}", y.dims());
}
