//! The transfer example's pieces (`examples/transfer/`), run here on small
//! sizes:
//!
//! - the image folder numbers its classes in sorted order and lists the
//!   files in torchvision's `ImageFolder` order, skipping what is not an
//!   image, and refuses a class without images, naming it;
//! - a decoded image is the file's pixels, channel by channel, scaled to
//!   `[0, 1]` and normalised with ImageNet's mean and std; resizing keeps a
//!   flat colour; a JPEG decodes close to what was written;
//! - the random flip mirrors exactly the flipped items, only in the
//!   training split, reproducibly and whatever the number of workers;
//! - the generator writes the same folder from the same seed and does not
//!   overwrite a folder it did not write;
//! - fine-tuning the width-8 ResNet-18 fixture on a small generated folder
//!   reaches a high validation accuracy, and the best checkpoint, read
//!   back, scores the same.

#[path = "../examples/transfer/fit.rs"]
mod fit;
#[path = "../examples/transfer/folder.rs"]
mod folder;

use fit::{run, same_score, Config};
use folder::{generate, load_image, save, Counts, ImageFolder, Images, Labels, MEAN, STD};
use forma::nn::data::{DataLoader, Dataset};
use image::{Rgb, RgbImage};
use std::path::{Path, PathBuf};

/// A fresh folder under the system's temporary one, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("forma-transfer-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn touch(path: &Path) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("folders");
    std::fs::write(path, b"").expect("a file");
}

#[test]
fn classes_and_files_in_image_folder_order() {
    let tmp = TempDir::new("order");
    let root = &tmp.0;
    for f in [
        "zebra/z1.png",
        "ant/b.PNG",
        "ant/a.jpg",
        "ant/notes.txt",
        "ant/a/x.png",
        "ant/sub/c.png",
        "Bee/x.jpeg",
        "readme.txt",
    ] {
        touch(&root.join(f));
    }
    let folder = ImageFolder::new(root, 8).expect("a folder of three classes");
    // Sorted as Python sorts strings: upper case first.
    assert_eq!(folder.classes(), ["Bee", "ant", "zebra"]);
    let got: Vec<(String, i64)> = folder
        .samples()
        .iter()
        .map(|(p, l)| {
            let rel = p.strip_prefix(root).expect("below the root");
            (rel.to_string_lossy().replace('\\', "/"), *l)
        })
        .collect();
    // `sorted(os.walk(ant))`: `ant`'s own files first, then `ant/a`'s,
    // then `ant/sub`'s; `notes.txt` is not an image.
    let want = [
        ("Bee/x.jpeg", 0),
        ("ant/a.jpg", 1),
        ("ant/b.PNG", 1),
        ("ant/a/x.png", 1),
        ("ant/sub/c.png", 1),
        ("zebra/z1.png", 2),
    ]
    .map(|(p, l)| (p.to_string(), l));
    assert_eq!(got, want);
    assert_eq!(folder.len(), 6);
}

#[test]
fn a_class_without_images_is_named() {
    let tmp = TempDir::new("empty");
    touch(&tmp.0.join("cats/a.png"));
    touch(&tmp.0.join("dogs/readme.txt"));
    let err = ImageFolder::new(&tmp.0, 8).expect_err("dogs has no image");
    let msg = err.to_string();
    assert!(msg.contains("no valid file for the classes dogs"), "{msg}");
    let none = TempDir::new("none");
    touch(&none.0.join("a.png"));
    let err = ImageFolder::new(&none.0, 8).expect_err("no class folder");
    assert!(err.to_string().contains("no class folder"), "{err}");
    assert!(ImageFolder::new(tmp.0.join("missing"), 8).is_err());
    let err = ImageFolder::new(&tmp.0, 0).expect_err("size 0");
    assert!(err.to_string().contains("image size 0"), "{err}");
}

/// A 4x4 image whose pixel `(x, y)` is `(40x + 7, 60y + 3, 250 - 50x - 10y)`.
fn gradient() -> RgbImage {
    RgbImage::from_fn(4, 4, |x, y| {
        Rgb([
            (40 * x + 7) as u8,
            (60 * y + 3) as u8,
            (250 - 50 * x - 10 * y) as u8,
        ])
    })
}

/// The value the dataset should give for byte `v` of channel `c`.
fn normalised(v: u8, c: usize) -> f32 {
    (f32::from(v) / 255.0 - MEAN[c]) / STD[c]
}

#[test]
fn pixels_are_scaled_and_normalised_channel_by_channel() {
    let tmp = TempDir::new("pixels");
    let path = tmp.0.join("g.png");
    let img = gradient();
    save(&img, &path).expect("a PNG");
    for flip in [false, true] {
        let t = load_image(&path, 4, flip).expect("decodes");
        assert_eq!(t.dims()[..], [3, 4, 4]);
        let v = t.to_vec();
        for c in 0..3 {
            for y in 0..4u32 {
                for x in 0..4u32 {
                    let src = if flip { 3 - x } else { x };
                    let want = normalised(img.get_pixel(src, y)[c], c);
                    let got = v[c * 16 + (y * 4 + x) as usize];
                    assert!(
                        (got - want).abs() < 1e-6,
                        "flip {flip}, channel {c}, ({x}, {y}): {got} vs {want}"
                    );
                }
            }
        }
    }
    // Pixel (0, 0) in numbers: (7/255 - 0.485) / 0.229 = -1.9980.
    let first = load_image(&path, 4, false).expect("decodes").to_vec()[0];
    assert!((first - -1.998_03).abs() < 1e-4, "{first}");
}

#[test]
fn resizing_keeps_a_flat_colour_and_jpeg_decodes_close() {
    let tmp = TempDir::new("resize");
    let colour = [200u8, 100, 50];
    let img = RgbImage::from_pixel(20, 12, Rgb(colour));
    for (name, tolerance) in [("flat.png", 0u8), ("flat.jpg", 3)] {
        let path = tmp.0.join(name);
        save(&img, &path).expect("written");
        let t = load_image(&path, 8, false).expect("decodes");
        assert_eq!(t.dims()[..], [3, 8, 8]);
        let v = t.to_vec();
        for (c, &want) in colour.iter().enumerate() {
            let bound = f32::from(tolerance) / 255.0 / STD[c] + 1e-6;
            for &got in &v[c * 64..(c + 1) * 64] {
                assert!(
                    (got - normalised(want, c)).abs() <= bound,
                    "{name}, channel {c}: {got} vs {}",
                    normalised(want, c)
                );
            }
        }
    }
    // Not an image, though named like one: an error naming the file.
    let fake = tmp.0.join("fake.png");
    std::fs::write(&fake, b"not a png").expect("a file");
    let err = load_image(&fake, 8, false).expect_err("undecodable");
    assert!(err.to_string().contains("fake.png"), "{err}");
}

#[test]
fn the_generator_is_seeded_and_keeps_away_from_other_folders() {
    let tmp = TempDir::new("generate");
    let counts = Counts { train: 4, val: 2 };
    let (a, b) = (tmp.0.join("a"), tmp.0.join("b"));
    generate(&a, counts, 3).expect("written");
    generate(&b, counts, 3).expect("written");
    let train = ImageFolder::new(a.join("train"), 16).expect("a folder");
    assert_eq!(train.classes(), ["bar", "disc"]);
    let labels: Vec<i64> = train.samples().iter().map(|s| s.1).collect();
    assert_eq!(labels, [0, 0, 0, 0, 1, 1, 1, 1]);
    let jpegs = train
        .samples()
        .iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "jpg"))
        .count();
    assert_eq!(jpegs, 2, "every third image of a class is a JPEG");
    assert_eq!(ImageFolder::new(a.join("val"), 16).expect("val").len(), 4);
    for (p, _) in train.samples() {
        let twin = b.join(p.strip_prefix(&a).expect("below a"));
        assert_eq!(
            std::fs::read(p).expect("read"),
            std::fs::read(&twin).expect("read"),
            "{}",
            p.display()
        );
    }
    // Its own folder is replaced; another is left alone.
    generate(&a, Counts { train: 1, val: 1 }, 4).expect("rewritten");
    assert_eq!(
        ImageFolder::new(a.join("train"), 16).expect("train").len(),
        2
    );
    let other = tmp.0.join("other");
    touch(&other.join("keep.txt"));
    let err = generate(&other, counts, 3).expect_err("not ours");
    assert!(
        err.to_string().contains("not written by this example"),
        "{err}"
    );
    assert!(other.join("keep.txt").is_file());
}

/// Every batch of an epoch of `folder`'s loader with `workers` threads.
fn epoch(folder: ImageFolder, workers: usize) -> Vec<(Vec<f32>, Vec<i64>)> {
    let mut loader = DataLoader::new(folder, 3)
        .expect("a loader")
        .shuffle(5)
        .num_workers(workers);
    loader.dataset().set_epoch(1);
    loader
        .iter()
        .map(|b| {
            let (x, y): (Images, Labels) = b.expect("a batch");
            (x.to_vec(), y.to_vec())
        })
        .collect()
}

#[test]
fn the_random_flip_is_the_training_splits_alone_and_reproducible() {
    let tmp = TempDir::new("flip");
    let root = tmp.0.join("data");
    generate(&root, Counts { train: 8, val: 4 }, 1).expect("written");
    let size = 16;
    let train = ImageFolder::new(root.join("train"), size)
        .expect("train")
        .random_flip(9);
    let mirrored = |t: &[f32]| -> Vec<f32> {
        t.chunks(size)
            .flat_map(|row| row.iter().rev().copied())
            .collect()
    };
    let mut flips = Vec::new();
    for i in 0..train.len() {
        let (item, label) = train.get(i).expect("an item");
        let (path, want) = &train.samples()[i];
        assert_eq!(label, *want);
        let plain = load_image(path, size as u32, false)
            .expect("decodes")
            .to_vec();
        let flipped = train.flipped(i);
        let expected = if flipped { mirrored(&plain) } else { plain };
        assert_eq!(item.to_vec(), expected, "item {i} (flipped: {flipped})");
        flips.push(flipped);
    }
    let n = flips.iter().filter(|&&f| f).count();
    assert!(0 < n && n < flips.len(), "{n} of {} flipped", flips.len());
    // Another epoch, other coins; the same epoch, the same ones.
    train.set_epoch(1);
    let next: Vec<bool> = (0..train.len()).map(|i| train.flipped(i)).collect();
    assert_ne!(next, flips);
    train.set_epoch(0);
    assert_eq!(
        (0..train.len())
            .map(|i| train.flipped(i))
            .collect::<Vec<_>>(),
        flips
    );

    // The validation split is never flipped.
    let val = ImageFolder::new(root.join("val"), size).expect("val");
    for i in 0..val.len() {
        assert!(!val.flipped(i));
        let (item, _) = val.get(i).expect("an item");
        let plain = load_image(&val.samples()[i].0, size as u32, false).expect("decodes");
        assert_eq!(item.to_vec(), plain.to_vec());
    }

    // The batches do not depend on the number of workers.
    let folder = || {
        ImageFolder::new(root.join("train"), size)
            .expect("train")
            .random_flip(9)
    };
    let inline = epoch(folder(), 0);
    assert_eq!(inline.len(), 6);
    assert_eq!(inline, epoch(folder(), 4));
}

#[test]
fn fine_tuning_learns_the_generated_task() {
    let tmp = TempDir::new("learn");
    let config = Config {
        out: tmp.0.clone(),
        // Smaller images and a higher learning rate than the example's
        // defaults (64, 3e-4), to learn within seconds of a debug build.
        size: 32,
        lr: 1e-3,
        epochs: 4,
        counts: Counts {
            train: 150,
            val: 50,
        },
        workers: 2,
        ..Config::default()
    };
    let summary = run(&config).expect("the run");
    assert_eq!(summary.classes, ["bar", "disc"]);
    assert_eq!(summary.dropped, ["fc.bias", "fc.weight"]);
    let best = summary.best().expect("a best epoch").val;
    println!(
        "before {:.1}%, best {:.1}% (epoch {}), {:.1} s",
        100.0 * summary.before.acc,
        100.0 * best.acc,
        summary.best_epoch,
        summary.seconds
    );
    assert!(best.acc >= 0.9, "best val accuracy {:.3}", best.acc);
    assert!(
        same_score(summary.reloaded, best),
        "{:?} vs {best:?}",
        summary.reloaded
    );
    // The checkpoint is torchvision's resnet18(num_classes=2) at width 8.
    let sd = forma::nn::state::load_file(&summary.best_path)
        .expect("the checkpoint")
        .tensors;
    assert_eq!(sd.len(), 122);
    assert_eq!(sd.get("fc.weight").expect("fc.weight").dims(), [2, 64]);
}
