//! 05: checkpoints both ways — load weights PyTorch saved, check the
//! outputs agree, save from Forma for PyTorch to load.
//!
//! Run with `cargo run --release -p forma-examples --example 05-checkpoints-pytorch`.
//!
//! `tools/gen_example_fixtures.py` (run with real PyTorch) defined this
//! model in `torch.nn`, trained its BatchNorm statistics for a few batches,
//! and saved `model.state_dict()` with `safetensors.torch.save_file`, plus an
//! input and the model's output on it in eval mode. The Forma struct below
//! has the same fields, so it has the same keys and shapes: loading is one
//! call.

use forma::nn::layers::{BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, Relu};
use forma::nn::state::load_file;
use forma::prelude::*;
use std::path::Path;

/// ```python
/// class SmallCnn(nn.Module):
///     def __init__(self):
///         super().__init__()
///         self.conv = nn.Conv2d(1, 4, 3, padding=1)
///         self.bn = nn.BatchNorm2d(4)
///         self.pool = nn.MaxPool2d(2)
///         self.fc = nn.Linear(4 * 8 * 8, 10)
///     def forward(self, x):
///         x = self.pool(torch.relu(self.bn(self.conv(x))))
///         return self.fc(torch.flatten(x, 1))
/// ```
#[derive(Module, Sequential)]
#[sequential(input = [B, 1, 16, 16], output = [B, 10])]
struct SmallCnn {
    conv: Conv2d<1, 4, 3, 1, 1>,
    bn: BatchNorm2d<4>,
    act: Relu, // `torch.relu` and `torch.flatten` hold no weights: no keys either
    pool: MaxPool2d<2>,
    flatten: Flatten,
    fc: Linear<256, 10>,
}

impl SmallCnn {
    fn new(rng: &mut Rng) -> Self {
        SmallCnn {
            conv: Conv2d::new(&Cpu, rng),
            bn: BatchNorm2d::new(&Cpu),
            act: Relu,
            pool: MaxPool2d,
            flatten: Flatten,
            fc: Linear::new(&Cpu, rng),
        }
    }
}

type Batch = Tensor<(Dyn, C<1>, C<16>, C<16>)>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/fixtures/examples");
    let weights = dir.join("small_cnn.safetensors");

    // One call: memory-mapped, strict (every key present, none extra, every
    // shape right), and all-or-nothing.
    let mut net = SmallCnn::new(&mut Rng::seed_from(0));
    net.load_safetensors(&weights)?;
    net.eval(); // BatchNorm uses its running statistics, as after `model.eval()`
    println!("loaded {}\n{}\n", weights.display(), net.repr());
    // Running statistics are optional, as in PyTorch (`track_running_stats`).
    if let (Some(mean), Some(seen)) = (&net.bn.running_mean, &net.bn.num_batches_tracked) {
        println!(
            "bn.running_mean {:.4?} after {} batches in PyTorch",
            mean.to_vec(),
            seen.item()
        );
    }

    // The input PyTorch ran and what it got.
    let io = load_file(dir.join("small_cnn_io.safetensors"))?;
    println!(
        "written by torch {}",
        io.metadata.get("torch").map_or("?", String::as_str)
    );
    let get = |k: &str| io.tensors.get(k).ok_or(format!("no `{k}` in the io file"));
    let x = Batch::try_from_data(get("input")?, &Cpu)?;
    let expected = Tensor::<(Dyn, C<10>)>::try_from_data(get("output")?, &Cpu)?;

    let y = {
        let _no_grad = forma::core::tape::no_grad();
        net.forward(x)
    };
    let max_diff = y
        .to_vec()
        .iter()
        .zip(expected.to_vec())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!(
        "Forma's output vs PyTorch's: max |difference| = {max_diff:.2e} over {:?}",
        y.dims()
    );
    if max_diff > 1e-5 {
        return Err(format!("outputs differ by {max_diff}").into());
    }
    println!("predicted classes: {:?}\n", y.argmax::<1>().to_vec());

    // The other way: save from Forma (atomically: temporary file, fsync,
    // rename), with PyTorch's keys.
    let out = std::env::temp_dir().join("forma_small_cnn.safetensors");
    net.save_safetensors(&out)?;
    println!("saved {}; in Python:\n", out.display());
    println!("    import safetensors.torch");
    println!("    model = SmallCnn()");
    println!(
        "    model.load_state_dict(safetensors.torch.load_file({:?}))  # strict=True\n",
        out.display().to_string()
    );

    // Round trip in Rust: a fresh model loads the file and agrees exactly.
    let mut copy = SmallCnn::new(&mut Rng::seed_from(1));
    copy.load_safetensors(&out)?;
    copy.eval();
    println!(
        "reloaded in Forma: same state_dict: {}",
        copy.state_dict().iter().all(|(k, t)| net
            .state_dict()
            .get(k)
            .is_some_and(|n| n.bytes() == t.bytes()))
    );
    // Whole training runs save more than weights: `forma::nn::state::TrainingState`
    // holds the model, optimizer, scheduler and data-loader position in one
    // safetensors file, and a resumed run continues bit for bit (the `train`
    // example's `--resume` uses it).
    Ok(())
}
