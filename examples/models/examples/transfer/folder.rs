//! The transfer example's data: torchvision's `ImageFolder` as a Forma
//! [`Dataset`] ([`ImageFolder`]), and a small two-class folder of that layout
//! drawn and written by the example itself ([`generate`]), so that it runs
//! offline.
//!
//! An image folder is `root/<class>/**/<image>`: the classes are the
//! sub-folders of `root`, numbered in sorted order, and every PNG or JPEG
//! file below a class folder is an example of it, as torchvision's
//! `datasets.ImageFolder(root, transform)` reads it (with its `Resize`,
//! `RandomHorizontalFlip`, `ToTensor` and ImageNet `Normalize` as the
//! transform).

use forma::nn::data::{DataError, Dataset};
use forma::prelude::*;
use image::codecs::jpeg::JpegEncoder;
use image::imageops::{self, FilterType};
use image::{ImageReader, Rgb, RgbImage};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// ImageNet's per-channel mean (RGB), which torchvision's pretrained
/// networks expect subtracted from pixels scaled to `[0, 1]`.
pub const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet's per-channel standard deviation (RGB).
pub const STD: [f32; 3] = [0.229, 0.224, 0.225];
/// The file extensions read (lower case; matched case-insensitively). The
/// rest of torchvision's `IMG_EXTENSIONS` would need more `image` features.
pub const EXTENSIONS: [&str; 3] = ["jpeg", "jpg", "png"];

/// One image as the dataset yields it: `[3, size, size]`, normalised.
pub type Image = Tensor<(C<3>, Dyn, Dyn)>;
/// A batch of images: `[batch, 3, size, size]`.
pub type Images = Tensor<(Dyn, C<3>, Dyn, Dyn)>;
/// A batch of class indices.
pub type Labels = Tensor<(Dyn,), i64>;

/// A file that `image` could not read or write.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct ImageFileError {
    /// The file.
    pub path: PathBuf,
    /// What `image` reported.
    pub source: image::ImageError,
}

fn image_error(path: &Path, source: image::ImageError) -> DataError {
    DataError::other(ImageFileError {
        path: path.to_path_buf(),
        source,
    })
}

fn io_error(path: &Path, source: std::io::Error) -> DataError {
    DataError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// torchvision's `ImageFolder`: the images below `root/<class>/`, labelled
/// by the class folder's index in sorted order, each decoded, resized to
/// `size x size`, optionally flipped left to right at random (the training
/// split's augmentation), and normalised with [`MEAN`] and [`STD`].
///
/// A random flip is drawn from the seed, the epoch ([`ImageFolder::set_epoch`])
/// and the item's index alone, so it does not depend on which worker
/// thread loads the item or in which order: a run is reproducible with
/// any `num_workers`.
#[derive(Debug)]
pub struct ImageFolder {
    classes: Vec<String>,
    samples: Vec<(PathBuf, i64)>,
    size: u32,
    flip_seed: Option<u64>,
    epoch: AtomicU64,
}

impl ImageFolder {
    /// Scans `root` like torchvision's `find_classes` and
    /// `make_dataset`: the class folders sorted by name (code point order,
    /// as Python sorts strings), and within each, every file with one of
    /// [`EXTENSIONS`], sub-folders included, in `sorted(os.walk(..))`
    /// order. Nothing is decoded yet.
    ///
    /// # Errors
    /// [`DataError::Io`] when a folder cannot be read, [`DataError::Invalid`]
    /// when `root` has no class folder, a class has no image (named, as
    /// torchvision does), or `size` is 0.
    pub fn new(root: impl AsRef<Path>, size: usize) -> Result<Self, DataError> {
        let root = root.as_ref();
        let size =
            u32::try_from(size)
                .ok()
                .filter(|&s| s > 0)
                .ok_or_else(|| DataError::Invalid {
                    what: "ImageFolder",
                    reason: format!("image size {size} must be between 1 and {}", u32::MAX),
                })?;
        let mut classes = Vec::new();
        for entry in std::fs::read_dir(root).map_err(|e| io_error(root, e))? {
            let entry = entry.map_err(|e| io_error(root, e))?;
            // `is_dir` follows links, as `os.scandir`'s `entry.is_dir()` does.
            if entry.path().is_dir() {
                classes.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        classes.sort();
        if classes.is_empty() {
            return Err(DataError::Invalid {
                what: "ImageFolder",
                reason: format!("no class folder in {}", root.display()),
            });
        }
        let mut samples = Vec::new();
        let mut empty = Vec::new();
        for (label, class) in classes.iter().enumerate() {
            let mut dirs = Vec::new();
            walk(&root.join(class), &mut dirs)?;
            // `sorted(os.walk(class_dir))`: folder by folder in the sorted
            // order of their paths, each folder's files sorted by name.
            dirs.sort_by(|a, b| a.0.to_string_lossy().cmp(&b.0.to_string_lossy()));
            let before = samples.len();
            for (_, mut files) in dirs {
                files.sort();
                samples.extend(files.into_iter().map(|f| (f, label as i64)));
            }
            if samples.len() == before {
                empty.push(class.as_str());
            }
        }
        if !empty.is_empty() {
            return Err(DataError::Invalid {
                what: "ImageFolder",
                reason: format!(
                    "found no valid file for the classes {} in {}; supported extensions are {}",
                    empty.join(", "),
                    root.display(),
                    EXTENSIONS.map(|e| format!(".{e}")).join(", ")
                ),
            });
        }
        Ok(ImageFolder {
            classes,
            samples,
            size,
            flip_seed: None,
            epoch: AtomicU64::new(0),
        })
    }

    /// Flips each image left to right with probability 1/2, like
    /// `transforms.RandomHorizontalFlip()`, the coin drawn from `seed`, the
    /// epoch and the index.
    pub fn random_flip(mut self, seed: u64) -> Self {
        self.flip_seed = Some(seed);
        self
    }

    /// Sets the epoch the random flips are drawn for (like a sampler's
    /// `set_epoch`): call it before each epoch, or every epoch flips alike.
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    /// The class names, in label order (torchvision's `classes`).
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Every image file and its label, in index order (torchvision's
    /// `samples`).
    pub fn samples(&self) -> &[(PathBuf, i64)] {
        &self.samples
    }

    /// Whether item `index` is flipped in the current epoch.
    pub fn flipped(&self, index: usize) -> bool {
        self.flip_seed.is_some_and(|seed| {
            let epoch = self.epoch.load(Ordering::Relaxed);
            // Odd multipliers are bijections: distinct epochs and indices
            // give distinct seeds (up to the XOR of the two).
            let key = seed
                ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
            Rng::seed_from(key).next_u64() >> 63 == 1
        })
    }
}

/// Every folder from `dir` down (following links, as torchvision's
/// `os.walk(followlinks=True)` does) with its image files, unsorted.
fn walk(dir: &Path, out: &mut Vec<(PathBuf, Vec<PathBuf>)>) -> Result<(), DataError> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let path = entry.map_err(|e| io_error(dir, e))?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|e| {
            EXTENSIONS
                .iter()
                .any(|x| e.to_string_lossy().eq_ignore_ascii_case(x))
        }) {
            files.push(path);
        }
    }
    out.push((dir.to_path_buf(), files));
    Ok(())
}

/// Reads the image at `path` as `[3, size, size]`: decoded (PNG or JPEG,
/// recognised by content), converted to RGB, resized with a triangle
/// (bilinear, antialiased when shrinking) filter unless it is that size
/// already, flipped left to right when `flip`, scaled to `[0, 1]` and
/// normalised with [`MEAN`] and [`STD`] per channel.
///
/// # Errors
/// [`DataError::Io`] when the file cannot be opened, and a
/// [`DataError::Other`] holding an [`ImageFileError`] when it cannot be
/// decoded.
pub fn load_image(path: &Path, size: u32, flip: bool) -> Result<Image, DataError> {
    let decoded = ImageReader::open(path)
        .map_err(|e| io_error(path, e))?
        .with_guessed_format()
        .map_err(|e| io_error(path, e))?
        .decode()
        .map_err(|e| image_error(path, e))?;
    let mut rgb = decoded.into_rgb8();
    if rgb.dimensions() != (size, size) {
        rgb = imageops::resize(&rgb, size, size, FilterType::Triangle);
    }
    if flip {
        imageops::flip_horizontal_in_place(&mut rgb);
    }
    let side = size as usize;
    let plane = side * side;
    let mut chw = vec![0f32; 3 * plane];
    for (i, px) in rgb.pixels().enumerate() {
        for c in 0..3 {
            chw[c * plane + i] = (f32::from(px[c]) / 255.0 - MEAN[c]) / STD[c];
        }
    }
    Ok(Tensor::from_vec(chw, (C, Dyn(side), Dyn(side)))?)
}

impl Dataset for ImageFolder {
    type Item = (Image, i64);

    fn len(&self) -> usize {
        self.samples.len()
    }

    fn get(&self, index: usize) -> Result<(Image, i64), DataError> {
        let (path, label) =
            self.samples
                .as_slice()
                .get(index)
                .ok_or(DataError::IndexOutOfRange {
                    index,
                    len: self.samples.len(),
                })?;
        Ok((load_image(path, self.size, self.flipped(index))?, *label))
    }
}

// ------------------------------------------------------------------ generator

/// The generated folder's classes, in label order.
pub const GENERATED_CLASSES: [&str; 2] = ["bar", "disc"];
/// The file that marks a folder as [`generate`]'s, so that it may replace it.
pub const MARKER: &str = ".forma-generated";

/// How many images [`generate`] writes per class and split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Training images per class.
    pub train: usize,
    /// Validation images per class.
    pub val: usize,
}

/// Writes a two-class image folder to `root`: `train/<class>/` and
/// `val/<class>/` with `counts` images each, for the classes
/// [`GENERATED_CLASSES`]: a bright bar (a rotated rectangle) or a bright
/// disc, of a random colour, size and place, on a dark noisy background of
/// another random tint, each image between 72 and 112 pixels a side (not
/// square, so they are resized as real photos are). Every third image is a
/// JPEG, the others PNGs. The same `seed` writes the same files.
///
/// A `root` that exists is replaced only if an earlier call wrote it (it
/// holds [`MARKER`]); otherwise nothing is written.
///
/// # Errors
/// [`DataError::Invalid`] for a `root` this did not write, and
/// [`DataError::Io`] or an [`ImageFileError`] naming the file that could
/// not be written.
pub fn generate(root: &Path, counts: Counts, seed: u64) -> Result<(), DataError> {
    if root.exists() {
        if !root.join(MARKER).is_file() {
            return Err(DataError::Invalid {
                what: "generate",
                reason: format!(
                    "{} exists and was not written by this example: give another folder",
                    root.display()
                ),
            });
        }
        std::fs::remove_dir_all(root).map_err(|e| io_error(root, e))?;
    }
    std::fs::create_dir_all(root).map_err(|e| io_error(root, e))?;
    let marker = root.join(MARKER);
    std::fs::write(&marker, b"written by forma-models' transfer example\n")
        .map_err(|e| io_error(&marker, e))?;
    let mut rng = Rng::seed_from(seed);
    for (split, n) in [("train", counts.train), ("val", counts.val)] {
        for (label, class) in GENERATED_CLASSES.iter().enumerate() {
            let dir = root.join(split).join(class);
            std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
            for i in 0..n {
                let img = draw(label == 1, &mut rng);
                let ext = if i % 3 == 2 { "jpg" } else { "png" };
                save(&img, &dir.join(format!("{class}_{i:04}.{ext}")))?;
            }
        }
    }
    Ok(())
}

/// Writes `img` as PNG or, for a `.jpg` path, as a JPEG of quality 90.
pub fn save(img: &RgbImage, path: &Path) -> Result<(), DataError> {
    if path.extension().is_some_and(|e| e == "jpg") {
        let file = File::create(path).map_err(|e| io_error(path, e))?;
        let mut out = BufWriter::new(file);
        JpegEncoder::new_with_quality(&mut out, 90)
            .encode_image(img)
            .map_err(|e| image_error(path, e))?;
        out.flush().map_err(|e| io_error(path, e))
    } else {
        img.save(path).map_err(|e| image_error(path, e))
    }
}

/// One image: a disc (`disc`) or a bar, drawn with antialiased edges.
fn draw(disc: bool, rng: &mut Rng) -> RgbImage {
    let mut between = |lo: f64, hi: f64| lo + (hi - lo) * rng.uniform();
    let (w, h) = (between(72.0, 113.0) as u32, between(72.0, 113.0) as u32);
    let side = f64::from(w.min(h));
    let background = [0; 3].map(|_| between(0.0, 70.0));
    let colour = [0; 3].map(|_| between(140.0, 255.0));
    // A disc of radius r, or a bar of half-length a and half-thickness b
    // at angle t: of comparable areas (about 0.13 and 0.08 of side^2), so
    // the shape, more than the amount of light, tells them apart.
    let (r, a, b) = (
        between(0.15, 0.25) * side,
        between(0.34, 0.46) * side,
        between(0.04, 0.06) * side,
    );
    let t = between(0.0, std::f64::consts::PI);
    let reach = if disc { r } else { a };
    let cx = between(reach, f64::from(w) - reach);
    let cy = between(reach, f64::from(h) - reach);
    let (sin, cos) = t.sin_cos();
    let mut img = RgbImage::new(w, h);
    for (x, y, px) in img.enumerate_pixels_mut() {
        let (dx, dy) = (f64::from(x) + 0.5 - cx, f64::from(y) + 0.5 - cy);
        // Signed distance to the shape's edge, negative inside.
        let dist = if disc {
            dx.hypot(dy) - r
        } else {
            let (u, v) = (dx * cos + dy * sin, dy * cos - dx * sin);
            (u.abs() - a).max(v.abs() - b)
        };
        let cover = (0.5 - dist).clamp(0.0, 1.0);
        *px = Rgb([0, 1, 2].map(|c| {
            let noise = 12.0 * rng.normal();
            let v = background[c] + cover * (colour[c] - background[c]) + noise;
            v.round().clamp(0.0, 255.0) as u8
        }));
    }
    img
}
