//! The transfer example's job, PyTorch's "fine-tune a torchvision ResNet-18
//! on an image folder" ([`run`]): the folder read by [`ImageFolder`]s and
//! batched by `DataLoader`s with worker threads, the ResNet-18 loaded from a
//! torchvision checkpoint under a fresh 2-class head, fine-tuned whole with
//! AdamW, evaluated each epoch in eval mode under `no_grad`, the best
//! weights (by validation accuracy) saved as safetensors, then read back
//! and evaluated again.

use crate::folder::{generate, Counts, ImageFolder, Images, Labels};
use forma::core::tape::no_grad;
use forma::nn::data::{DataError, DataLoader, Dataset};
use forma::nn::loss::{try_cross_entropy, LossError, Mean, Sum};
use forma::nn::optim::{AdamW, AdamWOptions, OptimError};
use forma::nn::state::CheckpointError;
use forma::prelude::*;
use forma_models::resnet::ResNet18;
use forma_models::ModelError;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Classes of the fine-tuned head (the generated folder's two, or a
/// folder such as the tutorial's `hymenoptera_data`: ants and bees).
pub const CLASSES: usize = 2;
/// The network: torchvision's `resnet18()` with a 2-class `fc`.
pub type Net = ResNet18<CLASSES>;

/// The weights used without `--weights`: `tools/gen_resnet_fixtures.py`'s
/// ResNet-18 at width 8 (torchvision's layout and initialisation, BatchNorm
/// statistics calibrated on random batches; 10 classes).
pub const DEFAULT_WEIGHTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tools/fixtures/models/resnet18_w8.safetensors"
);

/// What a run does. [`Config::default`] is the example's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// An image folder with `train/<class>/` and `val/<class>/`; `None`:
    /// generate one into `out/data`.
    pub data: Option<PathBuf>,
    /// Where the generated data and `best.safetensors` go.
    pub out: PathBuf,
    /// A torchvision ResNet-18 `state_dict` saved as safetensors.
    pub weights: PathBuf,
    /// The width the weights must have (64 for torchvision's).
    pub width: usize,
    /// Images are resized to `size x size`.
    pub size: usize,
    /// Passes over the training split.
    pub epochs: usize,
    /// Images per batch.
    pub batch_size: usize,
    /// AdamW's learning rate.
    pub lr: f64,
    /// Loader threads per split.
    pub workers: usize,
    /// Images per class and split when generating.
    pub counts: Counts,
    /// Seeds the generated images, the new head, the shuffling and the flips.
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data: None,
            out: PathBuf::from("runs/transfer"),
            weights: PathBuf::from(DEFAULT_WEIGHTS),
            width: 8,
            size: 64,
            epochs: 6,
            batch_size: 16,
            lr: 3e-4,
            workers: 4,
            counts: Counts {
                train: 300,
                val: 100,
            },
            seed: 0,
        }
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// Reading or writing images failed.
    #[error("data: {0}")]
    Data(#[from] DataError),
    /// The weights could not be loaded.
    #[error("weights: {0}")]
    Model(#[from] ModelError),
    /// The best checkpoint could not be written.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// The optimizer refused a setting.
    #[error("optimizer: {0}")]
    Optim(#[from] OptimError),
    /// The loss refused a label.
    #[error("loss: {0}")]
    Loss(#[from] LossError),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] forma::Error),
    /// The settings, the folder or the weights do not fit the job.
    #[error("{0}")]
    Setup(String),
}

/// Loss and accuracy over a split.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Score {
    /// Mean cross-entropy.
    pub loss: f64,
    /// Fraction classified right.
    pub acc: f64,
}

/// One epoch's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Epoch {
    /// Counting from 1.
    pub epoch: usize,
    /// On the training split, as it trained (training mode, augmented).
    pub train: Score,
    /// On the validation split afterwards (eval mode).
    pub val: Score,
    /// Seconds for training and evaluation.
    pub seconds: f64,
}

/// What a run did.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// The class names, in label order.
    pub classes: Vec<String>,
    /// The checkpoint keys set aside for the new head.
    pub dropped: Vec<String>,
    /// The validation score with the new head before any training.
    pub before: Score,
    /// Every epoch.
    pub epochs: Vec<Epoch>,
    /// The epoch whose weights were kept (0: none improved on nothing).
    pub best_epoch: usize,
    /// Where they were saved.
    pub best_path: PathBuf,
    /// The validation score of the weights read back from `best_path`.
    pub reloaded: Score,
    /// Seconds for the whole run, data generation included.
    pub seconds: f64,
}

impl Summary {
    /// The best epoch's figures.
    pub fn best(&self) -> Option<&Epoch> {
        self.epochs.iter().find(|e| e.epoch == self.best_epoch)
    }
}

/// Right answers among `logits` for `labels`.
fn correct(logits: &Tensor<(Dyn, C<CLASSES>)>, labels: &Labels) -> usize {
    let pred = logits.argmax::<1>().to_vec();
    pred.iter()
        .zip(labels.to_vec())
        .filter(|(p, t)| **p == *t)
        .count()
}

/// `model`'s score on `loader`'s images, in eval mode without recording a
/// graph (`model.eval()` and `torch.no_grad()`); back in training mode
/// afterwards.
pub fn evaluate(
    model: &mut Net,
    loader: &mut DataLoader<ImageFolder>,
) -> Result<Score, TransferError> {
    model.eval();
    let score = {
        let _no_grad = no_grad();
        score(model, loader)
    };
    model.train();
    score
}

fn score(model: &Net, loader: &mut DataLoader<ImageFolder>) -> Result<Score, TransferError> {
    let (mut loss, mut hits, mut seen) = (0.0f64, 0usize, 0usize);
    for batch in loader.iter() {
        let (x, y): (Images, Labels) = batch?;
        let logits = model.try_forward(x)?;
        loss += f64::from(try_cross_entropy(&logits, &y, Sum)?.item());
        hits += correct(&logits, &y);
        seen += y.size(0);
    }
    let n = seen.max(1) as f64;
    Ok(Score {
        loss: loss / n,
        acc: hits as f64 / n,
    })
}

/// The weights at `path` under a fresh 2-class head, in training mode,
/// checked to be a network of `width`; the keys set aside are returned too.
fn load_backbone(
    path: &Path,
    width: usize,
    rng: &mut Rng,
) -> Result<(Net, Vec<String>), TransferError> {
    let loaded = Net::from_safetensors_new_head(path, &Cpu, rng)?;
    let mut model = loaded.model;
    let found = model.config().width;
    if found != width {
        return Err(TransferError::Setup(format!(
            "{}: a ResNet of width {found}, but --width is {width} (64 for torchvision's)",
            path.display()
        )));
    }
    model.train();
    Ok((model, loaded.report.dropped))
}

/// The split `split` of `root` as a loader: shuffled and randomly flipped
/// for `train`, in order and as is for `val`.
fn loader(
    root: &Path,
    split: &str,
    config: &Config,
) -> Result<DataLoader<ImageFolder>, TransferError> {
    let train = split == "train";
    let mut folder = ImageFolder::new(root.join(split), config.size)?;
    if folder.classes().len() != CLASSES {
        return Err(TransferError::Setup(format!(
            "{}: {} classes ({}), but the head has {CLASSES}",
            root.join(split).display(),
            folder.classes().len(),
            folder.classes().join(", ")
        )));
    }
    if train {
        folder = folder.random_flip(config.seed);
    }
    let loader = DataLoader::new(folder, config.batch_size)?.num_workers(config.workers);
    // Training drops a last batch smaller than the others: a batch of one
    // image would give BatchNorm a single value per channel.
    Ok(if train {
        loader.shuffle(config.seed).drop_last(true)
    } else {
        loader
    })
}

/// The whole job; prints a line per step and per epoch.
///
/// # Errors
/// A [`TransferError`] saying which step failed.
pub fn run(config: &Config) -> Result<Summary, TransferError> {
    let started = Instant::now();
    let root = match &config.data {
        Some(dir) => dir.clone(),
        None => {
            let dir = config.out.join("data");
            generate(&dir, config.counts, config.seed)?;
            println!(
                "data: generated {} training and {} validation images per class in {} ({:.1} s)",
                config.counts.train,
                config.counts.val,
                dir.display(),
                started.elapsed().as_secs_f64()
            );
            dir
        }
    };
    let mut train = loader(&root, "train", config)?;
    let mut val = loader(&root, "val", config)?;
    let classes = train.dataset().classes().to_vec();
    if val.dataset().classes() != classes {
        return Err(TransferError::Setup(format!(
            "{}: the val classes ({}) differ from the train classes ({})",
            root.display(),
            val.dataset().classes().join(", "),
            classes.join(", ")
        )));
    }
    let jpegs = [&train, &val]
        .iter()
        .flat_map(|l| l.dataset().samples())
        .filter(|(p, _)| {
            p.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("jpg") || e.eq_ignore_ascii_case("jpeg"))
        })
        .count();
    println!(
        "data: {} training / {} validation images ({jpegs} of them JPEG) of classes {classes:?}, \
         resized to {}x{}, batches of {} from {} workers",
        train.dataset().len(),
        val.dataset().len(),
        config.size,
        config.size,
        config.batch_size,
        config.workers
    );

    let mut rng = Rng::seed_from(config.seed);
    let (mut model, dropped) = load_backbone(&config.weights, config.width, &mut rng)?;
    println!(
        "model: ResNet-18 (width {}, {} parameters) from {}; new {CLASSES}-class fc, \
         dropped from the file: {dropped:?}",
        model.config().width,
        model.num_parameters(),
        // Without the `..` of the default's path.
        std::fs::canonicalize(&config.weights)
            .unwrap_or_else(|_| config.weights.clone())
            .display()
    );
    let before = evaluate(&mut model, &mut val)?;
    println!(
        "before fine-tuning: val loss {:.4} acc {:.2}%",
        before.loss,
        100.0 * before.acc
    );

    std::fs::create_dir_all(&config.out).map_err(|source| DataError::Io {
        path: config.out.clone(),
        source,
    })?;
    let best_path = config.out.join("best.safetensors");
    let mut opt: AdamW = AdamW::try_new(AdamWOptions::default().lr(config.lr))?;
    let mut epochs = Vec::with_capacity(config.epochs);
    let (mut best_epoch, mut best_acc) = (0, f64::NEG_INFINITY);
    for epoch in 1..=config.epochs {
        let t0 = Instant::now();
        train.dataset().set_epoch(train.state().epoch);
        let (mut loss_sum, mut hits, mut seen) = (0.0f64, 0usize, 0usize);
        for batch in train.iter() {
            let (x, y): (Images, Labels) = batch?;
            opt.zero_grad(&model);
            let logits = model.try_forward(x)?;
            let loss = try_cross_entropy(&logits, &y, Mean)?;
            loss.try_backward()?;
            opt.try_step(&model)?;
            let n = y.size(0);
            loss_sum += f64::from(loss.item()) * n as f64;
            hits += correct(&logits.detach(), &y);
            seen += n;
        }
        let val_score = evaluate(&mut model, &mut val)?;
        let n = seen.max(1) as f64;
        let row = Epoch {
            epoch,
            train: Score {
                loss: loss_sum / n,
                acc: hits as f64 / n,
            },
            val: val_score,
            seconds: t0.elapsed().as_secs_f64(),
        };
        let improved = val_score.acc > best_acc;
        if improved {
            (best_epoch, best_acc) = (epoch, val_score.acc);
            model.save_safetensors(&best_path)?;
        }
        println!(
            "epoch {epoch}/{}  train loss {:.4} acc {:.2}%  val loss {:.4} acc {:.2}%  {:.1} s{}",
            config.epochs,
            row.train.loss,
            100.0 * row.train.acc,
            row.val.loss,
            100.0 * row.val.acc,
            row.seconds,
            if improved { "  (best: saved)" } else { "" }
        );
        epochs.push(row);
    }
    if best_epoch == 0 {
        return Err(TransferError::Setup("no epoch ran: --epochs is 0".into()));
    }

    // Read back as a fresh network: strict, the 2-class head included.
    let mut reread = Net::from_safetensors(&best_path, &Cpu)?.model;
    let reloaded = evaluate(&mut reread, &mut val)?;
    let best = epochs[best_epoch - 1].val;
    println!(
        "best: epoch {best_epoch}, val acc {:.2}%, saved to {}; read back: val loss {:.4} acc {:.2}% ({})",
        100.0 * best.acc,
        best_path.display(),
        reloaded.loss,
        100.0 * reloaded.acc,
        if same_score(reloaded, best) {
            "the same"
        } else {
            "DIFFERENT"
        }
    );
    Ok(Summary {
        classes,
        dropped,
        before,
        epochs,
        best_epoch,
        best_path,
        reloaded,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Whether two evaluations of the same weights agree: the same accuracy,
/// and losses within float32 rounding (the GEMM may sum in another order).
pub fn same_score(a: Score, b: Score) -> bool {
    a.acc == b.acc && (a.loss - b.loss).abs() <= 1e-5 * a.loss.abs().max(1.0)
}
