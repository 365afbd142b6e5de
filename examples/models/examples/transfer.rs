//! Transfer learning, as PyTorch's tutorial does it: a torchvision ResNet-18
//! fine-tuned on an image folder.
//!
//! ```sh
//! cargo run --release -p forma-models --example transfer      # generated images, ~16 s on 2 cores
//! cargo run --release -p forma-models --example transfer -- --help
//! # A real torchvision resnet18 (ImageNet weights) on the tutorial's ants and bees:
//! #   python -c "import torchvision, safetensors.torch as st; st.save_file(
//! #     torchvision.models.resnet18(weights='DEFAULT').state_dict(), 'resnet18.safetensors')"
//! cargo run --release -p forma-models --example transfer -- \
//!     --weights resnet18.safetensors --width 64 --data hymenoptera_data --size 224
//! ```
//!
//! 1. **Data**: without `--data`, a two-class image folder is drawn and
//!    written first (`runs/transfer/data/{train,val}/{bar,disc}/*.{png,jpg}`:
//!    a bright bar or disc of random colour, size and place on a noisy
//!    background). [`folder::ImageFolder`] reads it as torchvision's
//!    `ImageFolder` does (classes numbered in sorted order), decoding with
//!    the `image` crate, resizing to `--size`, normalising with ImageNet's
//!    mean and std, flipping at random (seeded) for the training split
//!    only; `DataLoader`s batch it on 4 worker threads, the training split
//!    shuffled.
//! 2. **Model**: `ResNet18<2>` loaded from a torchvision checkpoint
//!    (safetensors), strictly but for the replaced 2-class `fc`, whose
//!    dropped keys are printed. By default the width-8 ResNet-18 that
//!    `tools/gen_resnet_fixtures.py` writes in torchvision's layout (random
//!    torchvision initialisation, not ImageNet weights: it shows the
//!    mechanics, and learns the generated task anyway).
//! 3. **Loop**: AdamW (lr 3e-4) on every weight, a line per epoch (train
//!    loss and accuracy, val loss and accuracy), evaluation in `eval()`
//!    mode under `no_grad`, `train()` again after; the best weights by val
//!    accuracy saved as `runs/transfer/best.safetensors`, which
//!    `torchvision.models.resnet18(num_classes=2)` loads strictly.
//! 4. **Check**: the best checkpoint is read back into a fresh network and
//!    evaluated again; the run fails unless it scores the same.
//!
//! The data and the loop are in `transfer/folder.rs` and `transfer/fit.rs`,
//! which `tests/transfer.rs` runs too.

#[path = "transfer/fit.rs"]
mod fit;
#[path = "transfer/folder.rs"]
mod folder;

use fit::{same_score, Config};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
Fine-tunes a torchvision ResNet-18 on an image folder (PyTorch's transfer-learning tutorial).

usage: transfer [options]
  --data DIR             an image folder with train/<class>/ and val/<class>/ (2 classes);
                         default: generate one into OUT/data
  --out DIR              where the generated data and best.safetensors go [runs/transfer]
  --weights PATH         a torchvision resnet18 state_dict as safetensors
                         [tools/fixtures/models/resnet18_w8.safetensors]
  --width N              the width the weights must have [8; 64 with --weights]
  --size N               images are resized to N x N [64]
  --epochs N             [6]
  --batch-size N         [16]
  --lr X                 AdamW's learning rate [0.0003]
  --workers N            loader threads per split [4]
  --train-per-class N    generated training images per class [300]
  --val-per-class N      generated validation images per class [100]
  --seed N               data, head, shuffling and flips [0]
  --help
";

/// The configuration the command line asks for, or `None` for `--help`.
fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Config>, String> {
    let mut config = Config::default();
    let mut width = None;
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Ok(None);
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value (see --help)"))?;
        let number = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag}: `{v}` is not a whole number"))
        };
        match flag.as_str() {
            "--data" => config.data = Some(PathBuf::from(value)),
            "--out" => config.out = PathBuf::from(value),
            "--weights" => {
                config.weights = PathBuf::from(value);
                config.width = 64;
            }
            "--width" => width = Some(number(&value)?),
            "--size" => config.size = number(&value)?,
            "--epochs" => config.epochs = number(&value)?,
            "--batch-size" => config.batch_size = number(&value)?,
            "--lr" => {
                config.lr = value
                    .parse()
                    .map_err(|_| format!("--lr: `{value}` is not a number"))?;
            }
            "--workers" => config.workers = number(&value)?,
            "--train-per-class" => config.counts.train = number(&value)?,
            "--val-per-class" => config.counts.val = number(&value)?,
            "--seed" => config.seed = number(&value)? as u64,
            _ => return Err(format!("unknown option {flag} (see --help)")),
        }
    }
    if let Some(w) = width {
        config.width = w;
    }
    Ok(Some(config))
}

fn main() -> ExitCode {
    let config = match parse(std::env::args().skip(1)) {
        Ok(Some(config)) => config,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match fit::run(&config) {
        Ok(summary) => {
            let best = summary.best().map(|e| e.val);
            println!("done in {:.1} s", summary.seconds);
            if best.is_some_and(|b| same_score(summary.reloaded, b)) {
                ExitCode::SUCCESS
            } else {
                eprintln!("error: the checkpoint read back does not score as it did when saved");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
