//! The training example's pipeline on a tiny configuration (a few batches
//! per epoch), and the digit renderer it trains on.

use forma::core::tape::no_grad;
use forma::nn::data::Dataset;
use forma::nn::state::TrainingState;
use forma::prelude::*;
use forma_examples::digits::{DigitSet, CLASSES, PIXELS};
use forma_examples::train::{
    parse_args, report, run, Args, Cnn, Command, DeviceArg, Images, Logits, ModelKind, OutFiles,
    TrainError, DATA_SEED,
};
use std::path::PathBuf;

/// A fresh, empty directory for one test's output.
fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("forma-train-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

const TRAIN: usize = 512;
const TEST: usize = 64;

/// A run of 16 batches of 32 per epoch.
fn tiny(out: &std::path::Path, epochs: usize) -> Args {
    Args {
        out: out.to_path_buf(),
        epochs: Some(epochs),
        batch_size: Some(32),
        lr: Some(5e-3),
        seed: Some(3),
        train_size: Some(TRAIN),
        test_size: Some(TEST),
        progress: false,
        ..Args::default()
    }
}

#[test]
fn renderer_is_deterministic_and_draws_distinct_classes() {
    let a = DigitSet::generate(200, 11);
    let b = DigitSet::generate(200, 11);
    let c = DigitSet::generate(200, 12);
    let small = DigitSet::generate(30, 11);
    for i in 0..200 {
        assert_eq!(
            a.pixels(i),
            b.pixels(i),
            "image {i}: same seed, other pixels"
        );
        assert_ne!(
            a.pixels(i),
            c.pixels(i),
            "image {i}: another seed, same pixels"
        );
    }
    // An image depends on the seed and its index, not on the set's size.
    assert_eq!(small.pixels(29), a.pixels(29));
    assert_eq!(a.labels()[..12], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]);

    // Each image has ink, but is mostly background.
    for i in 0..200 {
        let inked = a.pixels(i).unwrap().iter().filter(|&&p| p > 96).count();
        assert!(
            (12..450).contains(&inked),
            "image {i} (a {}) has {inked} inked pixels",
            a.labels()[i]
        );
    }
    // Every class looks different: the mean images of two classes are far
    // apart compared with the jitter within a class.
    let mut means = vec![[0f64; PIXELS]; CLASSES];
    for i in 0..200 {
        let m = &mut means[a.labels()[i] as usize];
        for (s, &p) in m.iter_mut().zip(a.pixels(i).unwrap()) {
            *s += p as f64 / 255.0 / 20.0;
        }
    }
    for p in 0..CLASSES {
        for q in p + 1..CLASSES {
            let d: f64 = means[p]
                .iter()
                .zip(&means[q])
                .map(|(x, y)| (x - y) * (x - y))
                .sum::<f64>()
                .sqrt();
            assert!(d > 1.5, "classes {p} and {q} look alike: distance {d:.2}");
        }
    }
    // Items come out normalised as `(pixel / 255 - mean) / std`.
    let (mean, std) = a.pixel_stats();
    assert!(mean > 0.02 && mean < 0.5 && std > 0.05, "{mean} {std}");
    let norm = a.clone().normalize(mean, std);
    let (x, y): (Tensor<(C<1>, C<28>, C<28>)>, i64) = norm.get(7).unwrap();
    assert_eq!(y, 7);
    let raw = a.pixels(7).unwrap();
    for (v, &p) in x.to_vec().iter().zip(raw) {
        assert_eq!(*v, (p as f32 / 255.0 - mean) / std);
    }
}

#[test]
fn trains_evaluates_and_writes_every_file() {
    let dir = out_dir("files");
    let summary = run(&Args {
        export_onnx: true,
        ..tiny(&dir, 2)
    })
    .unwrap();
    let m = &summary.metrics;
    assert_eq!(m.len(), 2);
    assert_eq!((m[0].epoch, m[1].epoch), (1, 2));
    assert!(
        m[1].train_loss < m[0].train_loss - 0.1 && m[1].test_loss < m[0].test_loss,
        "the loss did not go down: {m:?}"
    );
    assert!(m[1].test_acc > 0.3, "{m:?}");
    assert!(m
        .iter()
        .all(|r| (0.0..=1.0).contains(&r.test_acc) && r.seconds > 0.0));

    let files = OutFiles::in_dir(&dir);
    for f in [
        &files.best,
        &files.state,
        &files.csv,
        &files.plot,
        &files.samples,
        &files.onnx,
    ] {
        assert!(f.is_file(), "{} is missing", f.display());
    }
    // `--export-onnx`: the best model's weights and a few hundred bytes of
    // graph (the graph itself is checked in forma-onnx's tests).
    let onnx = std::fs::metadata(&files.onnx).unwrap().len() as usize;
    let weights = 4 * Cnn::new(&mut Rng::seed_from(0)).num_parameters();
    assert!(
        onnx > weights && onnx < weights + 8192,
        "{onnx} bytes for {weights}"
    );
    for png in [&files.plot, &files.samples] {
        let bytes = std::fs::read(png).unwrap();
        assert_eq!(bytes[..8], *b"\x89PNG\r\n\x1a\n", "{}", png.display());
        assert!(bytes.len() > 1000, "{} is nearly empty", png.display());
    }
    let plot = png::Decoder::new(std::io::Cursor::new(std::fs::read(&files.plot).unwrap()))
        .read_info()
        .unwrap();
    let info = plot.info();
    assert_eq!((info.width, info.height), report::PLOT_SIZE);
    // No temporary file is left behind.
    let stray: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");

    let csv = std::fs::read_to_string(&files.csv).unwrap();
    assert_eq!(csv.lines().next(), Some(report::CSV_HEADER));
    let rows = report::from_csv(&csv).unwrap();
    assert_eq!(rows.len(), 2);
    assert!((rows[1].test_acc - m[1].test_acc).abs() < 1e-6);

    // The best checkpoint loads into a fresh model and scores the best
    // accuracy on the held-out set.
    let mut model = Cnn::new(&mut Rng::seed_from(99));
    model.load_safetensors(&files.best).unwrap();
    model.eval();
    let (mean, std) = DigitSet::generate(TRAIN, DATA_SEED).pixel_stats();
    let test = DigitSet::generate(TEST, DATA_SEED + 1).normalize(mean, std);
    let items: Vec<_> = (0..TEST).map(|i| test.get(i).unwrap().0).collect();
    let x: Images = stack::<0, _, _>(&items);
    let _no_grad = no_grad();
    let logits: Logits = model.forward(x);
    let hits = logits
        .argmax::<1>()
        .to_vec()
        .iter()
        .zip(test.labels())
        .filter(|(p, t)| **p == **t as i64)
        .count();
    assert_eq!(hits as f64 / TEST as f64, summary.best_test_acc);

    let state = TrainingState::load(&files.state).unwrap();
    assert_eq!(state.model.len(), 8);
    assert_eq!(state.extra["model"], "cnn");
    assert_eq!(state.loader.unwrap().epoch, 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resume_continues_exactly_and_checks_its_settings() {
    let (straight, resumed) = (out_dir("straight"), out_dir("resumed"));
    let a = run(&tiny(&straight, 2)).unwrap();
    run(&tiny(&resumed, 1)).unwrap();
    // Resuming needs no flag but the epochs: the rest is saved.
    let b = run(&Args {
        resume: true,
        epochs: Some(2),
        progress: false,
        out: resumed.clone(),
        ..Args::default()
    })
    .unwrap();

    let same = |x: &[report::EpochMetrics], y: &[report::EpochMetrics]| {
        x.len() == y.len()
            && x.iter().zip(y).all(|(p, q)| {
                (p.epoch, p.train_loss, p.train_acc, p.test_loss, p.test_acc)
                    == (q.epoch, q.train_loss, q.train_acc, q.test_loss, q.test_acc)
            })
    };
    // Everything but the timings, to the bit.
    assert!(same(&a.metrics, &b.metrics), "{a:?}\n{b:?}");
    let (sa, sb) = (
        TrainingState::load(OutFiles::in_dir(&straight).state).unwrap(),
        TrainingState::load(OutFiles::in_dir(&resumed).state).unwrap(),
    );
    assert_eq!(sa.model, sb.model, "the weights differ after resuming");
    assert_eq!(sa.optimizer, sb.optimizer);
    assert_eq!(sa.scheduler, sb.scheduler);
    assert_eq!(sa.loader, sb.loader);

    // Nothing left to do: the run is at epoch 2 already.
    let again = run(&Args {
        resume: true,
        epochs: Some(2),
        progress: false,
        out: resumed.clone(),
        ..Args::default()
    })
    .unwrap();
    assert_eq!(again.metrics.len(), 2);

    // A flag that contradicts the saved run is refused, naming it.
    let err = run(&Args {
        resume: true,
        lr: Some(0.1),
        model: Some(ModelKind::Cnn),
        out: resumed.clone(),
        progress: false,
        ..Args::default()
    })
    .unwrap_err();
    assert!(
        matches!(&err, TrainError::Resume(m) if m.contains("--lr")),
        "{err}"
    );
    // So is resuming from nothing.
    let empty = out_dir("empty");
    let err = run(&Args {
        resume: true,
        out: empty,
        progress: false,
        ..Args::default()
    })
    .unwrap_err();
    assert!(
        matches!(&err, TrainError::Resume(m) if m.contains("no saved run")),
        "{err}"
    );

    std::fs::remove_dir_all(&straight).unwrap();
    std::fs::remove_dir_all(&resumed).unwrap();
}

/// Writes `set` as MNIST's two IDX files (`<prefix>-images-idx3-ubyte`,
/// `<prefix>-labels-idx1-ubyte`) in `dir`.
fn write_idx(dir: &std::path::Path, prefix: &str, set: &DigitSet) {
    let n = set.len() as u32;
    let mut images = vec![0, 0, 8, 3];
    for d in [n, 28, 28] {
        images.extend(d.to_be_bytes());
    }
    for i in 0..set.len() {
        images.extend(set.pixels(i).unwrap());
    }
    let mut labels = vec![0, 0, 8, 1];
    labels.extend(n.to_be_bytes());
    labels.extend(set.labels());
    std::fs::write(dir.join(format!("{prefix}-images-idx3-ubyte")), images).unwrap();
    std::fs::write(dir.join(format!("{prefix}-labels-idx1-ubyte")), labels).unwrap();
}

#[test]
fn trains_on_mnist_format_files() {
    let dir = out_dir("idx");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    write_idx(&data, "train", &DigitSet::generate(TRAIN, 5));
    write_idx(&data, "t10k", &DigitSet::generate(TEST, 6));
    let out = dir.join("run");
    let summary = run(&Args {
        data: Some(data.clone()),
        train_size: None,
        test_size: None,
        ..tiny(&out, 2)
    })
    .unwrap();
    assert_eq!(summary.metrics.len(), 2);
    assert!(summary.metrics[1].train_loss < summary.metrics[0].train_loss);
    let state = TrainingState::load(OutFiles::in_dir(&out).state).unwrap();
    assert_eq!(state.extra["data"], data.display().to_string());
    assert_eq!(state.extra["train_size"], "all");
    // Resuming finds the data directory in the saved state.
    let more = run(&Args {
        resume: true,
        epochs: Some(3),
        out: out.clone(),
        progress: false,
        ..Args::default()
    })
    .unwrap();
    assert_eq!(more.metrics.len(), 3);
    assert_eq!(more.metrics[..2], summary.metrics[..2]);

    // A truncated labels file is an error naming it, not a crash.
    let labels = data.join("t10k-labels-idx1-ubyte");
    let bytes = std::fs::read(&labels).unwrap();
    std::fs::write(&labels, &bytes[..bytes.len() - 3]).unwrap();
    let err = run(&Args {
        data: Some(data),
        ..tiny(&dir.join("bad"), 1)
    })
    .unwrap_err();
    assert!(matches!(err, TrainError::Data(_)), "{err}");
    assert!(err.to_string().contains("t10k-labels-idx1-ubyte"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn command_line() {
    let Command::Train(args) = parse_args([
        "--data",
        "/d",
        "--out=o",
        "--resume",
        "--epochs",
        "3",
        "--batch-size=16",
        "--lr",
        "0.01",
        "--seed",
        "9",
        "--model",
        "linear",
        "--train-size",
        "100",
        "--test-size",
        "50",
        "--workers",
        "2",
        "--no-progress",
        "--export-onnx",
    ])
    .unwrap() else {
        panic!("not a training command")
    };
    assert_eq!(
        args,
        Args {
            data: Some("/d".into()),
            out: "o".into(),
            resume: true,
            epochs: Some(3),
            batch_size: Some(16),
            lr: Some(0.01),
            seed: Some(9),
            model: Some(ModelKind::Linear),
            train_size: Some(100),
            test_size: Some(50),
            workers: 2,
            progress: false,
            export_onnx: true,
            ..Args::default()
        }
    );
    let Command::Train(args) = parse_args([
        "--download",
        "--mirror",
        "http://127.0.0.1:8000/mnist/",
        "--cache=c",
        "--device",
        "cuda:2",
    ])
    .unwrap() else {
        panic!("not a training command")
    };
    assert!(args.download);
    assert_eq!(args.mirror, "http://127.0.0.1:8000/mnist/");
    assert_eq!(args.cache, PathBuf::from("c"));
    assert_eq!(args.device, DeviceArg::Cuda(2));
    assert_eq!(args.data, None);
    assert_eq!(Args::default().device, DeviceArg::Cpu);
    assert!(!Args::default().download);
    assert_eq!(
        Args::default().mirror,
        forma_examples::download::DEFAULT_MIRROR
    );
    assert_eq!(
        parse_args(Vec::<String>::new()).unwrap(),
        Command::Train(Args::default())
    );
    assert_eq!(Args::default().out, PathBuf::from("runs/train"));
    assert_eq!(parse_args(["-h"]).unwrap(), Command::Help);
    assert_eq!(parse_args(["--help"]).unwrap(), Command::Help);
    // clap's messages, each naming the flag.
    for (bad, says) in [
        (vec!["--epochs"], "a value is required for '--epochs <N>'"),
        (vec!["--epochs", "0"], "'--epochs <N>': must be at least 1"),
        (
            vec!["--batch-size", "x"],
            "'--batch-size <N>': not a whole number",
        ),
        (vec!["--lr", "-1"], "'--lr <X>': must be positive, not -1"),
        (vec!["--lr", "inf"], "must be positive, not inf"),
        (vec!["--seed", "x"], "invalid value 'x' for '--seed <N>'"),
        (vec!["--model", "mlp"], "[possible values: cnn, linear]"),
        (
            vec!["--resume=yes"],
            "unexpected value 'yes' for '--resume'",
        ),
        (vec!["--frobnicate"], "unexpected argument '--frobnicate'"),
        (vec!["--device", "tpu"], "not a device"),
        (vec!["--device", "cuda:x"], "not a device"),
        (
            vec!["--download=1"],
            "unexpected value '1' for '--download'",
        ),
        (
            vec!["--download", "--data", "d"],
            "'--download' cannot be used with '--data <DIR>'",
        ),
        // A near miss gets a suggestion.
        (
            vec!["--epoch", "3"],
            "a similar argument exists: '--epochs'",
        ),
        (vec!["--model", "lin"], "a similar value exists: 'linear'"),
    ] {
        let err = parse_args(bad.clone()).unwrap_err();
        assert!(err.contains(says), "{bad:?}: {err}");
        // The caller prints `error: ` before it.
        assert!(!err.starts_with("error"), "{bad:?}: {err}");
    }
}

/// `--amp bf16` beside an f32 run in the same directory: its own suffixed
/// files (the f32 run's untouched), the precision saved for `--resume`,
/// a loss that autocast changed but only by bf16 roundings, and one plot.
#[test]
fn an_amp_run_trains_beside_the_f32_run_with_its_own_files() {
    use forma_examples::train::Amp;
    let dir = out_dir("amp");
    let plain = run(&tiny(&dir, 2)).unwrap();
    let f32_files = OutFiles::in_dir(&dir);
    let best = std::fs::read(&f32_files.best).unwrap();
    let amp = run(&Args {
        amp: Some(Amp::Bf16),
        ..tiny(&dir, 2)
    })
    .unwrap();
    let files = OutFiles::for_run(&dir, Some(Amp::Bf16));
    assert!(files.best.ends_with("best-amp-bf16.safetensors"));
    for f in [&files.best, &files.state, &files.csv, &files.plot] {
        assert!(f.exists(), "{} is missing", f.display());
    }
    assert_eq!(
        std::fs::read(&f32_files.best).unwrap(),
        best,
        "the f32 model was overwritten"
    );
    let state = TrainingState::load(&files.state).unwrap();
    assert_eq!(state.extra.get("amp").map(String::as_str), Some("bf16"));
    // Autocast ran (the losses differ) and stayed close to f32.
    let (a, b) = (plain.metrics[0].train_loss, amp.metrics[0].train_loss);
    assert_ne!(a, b, "the bf16 run computed exactly the f32 losses");
    assert!((a - b).abs() <= 0.05 * a, "f32 loss {a}, bf16 loss {b}");
    // The f32 run resumes from its own files, not the amp run's.
    let resumed = run(&Args {
        resume: true,
        ..tiny(&dir, 3)
    })
    .unwrap();
    assert_eq!(resumed.metrics[..2], plain.metrics[..2]);
    let _ = std::fs::remove_dir_all(&dir);
}
