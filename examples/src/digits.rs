//! A built-in, deterministic stand-in for MNIST: handwriting-like 28x28
//! grayscale digits drawn by a small stroke renderer, so the training example
//! runs on a fresh machine with no download.
//!
//! Each digit 0-9 is a few strokes (lines and elliptic arcs) in a unit box,
//! with a couple of styles for some digits (a 7 with or without a bar, an
//! open or closed 4, ...). Every image draws its own variation from its own
//! random stream:
//!
//! - the stroke geometry is jittered (end points, arc centres and radii), so
//!   no two images share a template;
//! - an affine jitter: scale, aspect, slant, rotation and shift;
//! - the pen: stroke thickness and ink intensity;
//! - the paper: blur, Gaussian noise, speckles and a stray stroke.
//!
//! The result is hard enough that a linear classifier (multinomial logistic
//! regression on the pixels) falls clearly behind a small CNN, as on MNIST.
//!
//! Image `i` of a set depends only on the set's seed and `i`, so a set is the
//! same whatever its size or the order of generation, and the train and
//! held-out sets (different seeds) never share an image stream.
//!
//! ```
//! use forma_examples::digits::{DigitSet, PIXELS};
//!
//! let a = DigitSet::generate(20, 7);
//! let b = DigitSet::generate(20, 7);
//! assert_eq!(a.pixels(3), b.pixels(3));            // same seed, same images
//! assert_eq!(a.pixels(3).unwrap().len(), PIXELS);  // 28 x 28 bytes
//! assert_eq!(a.labels()[..4], [0, 1, 2, 3]);       // labels cycle through 0..10
//! ```

use forma::nn::data::{DataError, Dataset, Mnist};
use forma::prelude::*;

/// Rows and columns of an image.
pub const SIDE: usize = 28;
/// Pixels per image.
pub const PIXELS: usize = SIDE * SIDE;
/// Number of classes.
pub const CLASSES: usize = 10;

/// A point: `(x, y)` with `y` pointing down, in the unit glyph box while a
/// glyph is built, in pixels once placed.
type Pt = (f32, f32);

/// Where one image's randomness comes from: a generator seeded from the
/// set's seed and the image index (SplitMix-style mixing), so images can be
/// made in any order.
fn image_rng(seed: u64, index: u64) -> Rng {
    let mut z = seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    Rng::seed_from(z ^ (z >> 29))
}

/// Draws the random choices of one image.
struct Draw<'a> {
    rng: &'a mut Rng,
    /// Standard deviation of the geometry jitter, in glyph-box units.
    wobble: f32,
}

impl Draw<'_> {
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.rng.uniform() as f32
    }

    fn normal(&mut self) -> f32 {
        self.rng.normal() as f32
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.uniform() < p
    }

    /// `v` moved by the geometry jitter.
    fn j(&mut self, v: f32) -> f32 {
        v + self.wobble * self.normal()
    }

    /// A jittered point.
    fn p(&mut self, x: f32, y: f32) -> Pt {
        (self.j(x), self.j(y))
    }

    /// A jittered elliptic arc from `from` to `to` degrees (0 is right, 90
    /// down, as `y` points down), as a polyline.
    fn arc(&mut self, cx: f32, cy: f32, rx: f32, ry: f32, from: f32, to: f32) -> Vec<Pt> {
        let (cx, cy) = (self.j(cx), self.j(cy));
        let rx = rx * (1.0 + 2.0 * self.wobble * self.normal());
        let ry = ry * (1.0 + 2.0 * self.wobble * self.normal());
        let (from, to) = (from + 40.0 * self.wobble * self.normal(), to);
        let steps = ((to - from).abs() / 12.0).ceil().max(2.0) as usize;
        (0..=steps)
            .map(|k| {
                let t = (from + (to - from) * k as f32 / steps as f32).to_radians();
                (cx + rx * t.cos(), cy + ry * t.sin())
            })
            .collect()
    }
}

/// The strokes of `digit` in the unit box, with this image's style and
/// geometry jitter.
fn glyph(digit: u8, d: &mut Draw<'_>) -> Vec<Vec<Pt>> {
    match digit {
        0 => {
            let slim = d.uniform(0.22, 0.36);
            vec![d.arc(0.5, 0.5, slim, 0.45, 0.0, 360.0)]
        }
        1 => {
            let mut s = vec![vec![d.p(0.55, 0.05), d.p(0.5, 0.95)]];
            if d.chance(0.6) {
                s.push(vec![d.p(0.32, 0.25), d.p(0.55, 0.05)]);
            }
            if d.chance(0.3) {
                s.push(vec![d.p(0.3, 0.95), d.p(0.72, 0.95)]);
            }
            s
        }
        2 => {
            let mut top = d.arc(0.5, 0.3, 0.3, 0.24, 190.0, 395.0);
            top.push(d.p(0.18, 0.95));
            top.push(d.p(0.84, 0.95));
            vec![top]
        }
        3 => {
            let mut s = d.arc(0.5, 0.28, 0.28, 0.22, 200.0, 450.0);
            s.extend(d.arc(0.5, 0.72, 0.31, 0.23, 270.0, 520.0));
            vec![s]
        }
        4 => {
            if d.chance(0.5) {
                vec![vec![
                    d.p(0.62, 0.95),
                    d.p(0.62, 0.05),
                    d.p(0.12, 0.65),
                    d.p(0.86, 0.65),
                ]]
            } else {
                vec![
                    vec![d.p(0.28, 0.05), d.p(0.2, 0.6), d.p(0.86, 0.6)],
                    vec![d.p(0.66, 0.3), d.p(0.66, 0.95)],
                ]
            }
        }
        5 => {
            let mut s = vec![d.p(0.78, 0.05), d.p(0.3, 0.05), d.p(0.28, 0.45)];
            s.extend(d.arc(0.48, 0.68, 0.3, 0.26, 235.0, 510.0));
            vec![s]
        }
        6 => {
            let mut s = d.arc(0.62, 0.55, 0.4, 0.47, 290.0, 160.0);
            s.extend(d.arc(0.5, 0.7, 0.26, 0.24, 180.0, 540.0));
            vec![s]
        }
        7 => {
            let mut s = vec![vec![d.p(0.16, 0.06), d.p(0.84, 0.06), d.p(0.42, 0.95)]];
            if d.chance(0.35) {
                s.push(vec![d.p(0.4, 0.5), d.p(0.8, 0.5)]);
            }
            s
        }
        8 => vec![
            d.arc(0.5, 0.27, 0.24, 0.22, 0.0, 360.0),
            d.arc(0.5, 0.72, 0.29, 0.24, 0.0, 360.0),
        ],
        _ => {
            let loop_ = d.arc(0.5, 0.3, 0.27, 0.24, 0.0, 360.0);
            let tail = if d.chance(0.5) {
                d.arc(0.35, 0.3, 0.42, 0.65, 0.0, 75.0)
            } else {
                vec![d.p(0.77, 0.3), d.p(0.74, 0.95)]
            };
            vec![loop_, tail]
        }
    }
}

/// Distance from `p` to the segment `a`-`b`.
fn segment_distance(p: Pt, a: Pt, b: Pt) -> f32 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let len2 = dx * dx + dy * dy;
    let t = if len2 > 0.0 {
        (((p.0 - a.0) * dx + (p.1 - a.1) * dy) / len2).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let (ex, ey) = (a.0 + t * dx - p.0, a.1 + t * dy - p.1);
    (ex * ex + ey * ey).sqrt()
}

/// Inks polylines (in pixels) of the given thickness into `canvas` with an
/// anti-aliased edge, keeping the brightest value per pixel.
fn ink(canvas: &mut [f32; PIXELS], strokes: &[Vec<Pt>], thickness: f32, intensity: f32) {
    let reach = thickness / 2.0 + 0.5;
    let mut dist = [f32::INFINITY; PIXELS];
    for line in strokes {
        for seg in line.windows(2) {
            let (a, b) = (seg[0], seg[1]);
            let x0 = (a.0.min(b.0) - reach).floor().max(0.0) as usize;
            let x1 = (a.0.max(b.0) + reach).ceil().min(SIDE as f32) as usize;
            let y0 = (a.1.min(b.1) - reach).floor().max(0.0) as usize;
            let y1 = (a.1.max(b.1) + reach).ceil().min(SIDE as f32) as usize;
            for y in y0..y1 {
                for x in x0..x1 {
                    let d = segment_distance((x as f32 + 0.5, y as f32 + 0.5), a, b);
                    let slot = &mut dist[y * SIDE + x];
                    *slot = slot.min(d);
                }
            }
        }
    }
    for (c, d) in canvas.iter_mut().zip(dist) {
        let v = (reach - d).clamp(0.0, 1.0) * intensity;
        *c = c.max(v);
    }
}

/// A 3x3 blur with centre weight `1 - 8w` and neighbour weight `w`.
fn blur(canvas: &mut [f32; PIXELS], w: f32) {
    let src = *canvas;
    for y in 0..SIDE {
        for x in 0..SIDE {
            let mut acc = 0.0;
            for (dy, dx) in (-1i32..=1).flat_map(|dy| (-1i32..=1).map(move |dx| (dy, dx))) {
                let (yy, xx) = (y as i32 + dy, x as i32 + dx);
                let v = if (0..SIDE as i32).contains(&yy) && (0..SIDE as i32).contains(&xx) {
                    src[yy as usize * SIDE + xx as usize]
                } else {
                    0.0
                };
                acc += v * if dy == 0 && dx == 0 { 1.0 - 8.0 * w } else { w };
            }
            canvas[y * SIDE + x] = acc;
        }
    }
}

/// Renders one image of `digit`, its variation drawn from `rng`, as bytes
/// (0 background, 255 full ink), row after row.
pub fn render(digit: u8, rng: &mut Rng) -> [u8; PIXELS] {
    let mut d = Draw { rng, wobble: 0.0 };
    d.wobble = d.uniform(0.01, 0.035);
    let strokes = glyph(digit % 10, &mut d);

    // Place the unit box: slant, scale (the digit's height is 15-22 px, as
    // MNIST's fit a 20x20 box), rotate, shift.
    let height = d.uniform(15.0, 22.0);
    let width = height * d.uniform(0.7, 1.1);
    let slant = d.uniform(-0.3, 0.3);
    let angle = d.uniform(-15.0, 15.0).to_radians();
    let (sin, cos) = angle.sin_cos();
    let (tx, ty) = (d.uniform(-3.5, 3.5), d.uniform(-3.0, 3.0));
    let centre = SIDE as f32 / 2.0;
    let place = |(u, v): Pt| {
        let (x, y) = (u - 0.5, v - 0.5);
        let (x, y) = ((x - slant * y) * width, y * height);
        (
            centre + tx + cos * x - sin * y,
            centre + ty + sin * x + cos * y,
        )
    };
    let placed: Vec<Vec<Pt>> = strokes
        .iter()
        .map(|line| line.iter().copied().map(place).collect())
        .collect();

    let mut canvas = [0.0f32; PIXELS];
    let thickness = d.uniform(1.3, 3.6);
    let intensity = d.uniform(0.65, 1.0);
    ink(&mut canvas, &placed, thickness, intensity);

    // A stray stroke somewhere (a neighbour's digit, a pen slip).
    if d.chance(0.5) {
        let a = (d.uniform(0.0, SIDE as f32), d.uniform(0.0, SIDE as f32));
        let len = d.uniform(4.0, 10.0);
        let dir = d.uniform(0.0, std::f32::consts::TAU);
        let b = (a.0 + len * dir.cos(), a.1 + len * dir.sin());
        let (t, i) = (d.uniform(1.0, 2.2), d.uniform(0.3, 0.8));
        ink(&mut canvas, &[vec![a, b]], t, i);
    }
    if d.chance(0.5) {
        let w = d.uniform(0.03, 0.09);
        blur(&mut canvas, w);
    }
    let sigma = d.uniform(0.0, 0.15);
    for c in canvas.iter_mut() {
        *c += sigma * d.normal();
    }
    // Speckles: a few dust pixels.
    let dust = d.rng.below(8) as usize;
    for _ in 0..dust {
        let i = d.rng.below(PIXELS as u64) as usize;
        canvas[i] = canvas[i].max(d.uniform(0.3, 1.0));
    }
    let mut out = [0u8; PIXELS];
    for (o, c) in out.iter_mut().zip(canvas) {
        *o = (c.clamp(0.0, 1.0) * 255.0).round() as u8;
    }
    out
}

/// 28x28 grayscale images with labels, held as bytes, yielded as
/// `(Tensor<(C<1>, C<28>, C<28>)>, i64)` items normalised like
/// `ToTensor()` then `Normalize(mean, std)`: the same items as
/// [`Mnist`] yields, so the same model and loop train on either.
#[derive(Clone)]
pub struct DigitSet {
    pixels: Vec<u8>,
    labels: Vec<u8>,
    mean: f32,
    std: f32,
}

impl std::fmt::Debug for DigitSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DigitSet")
            .field("len", &self.labels.len())
            .field("mean", &self.mean)
            .field("std", &self.std)
            .finish_non_exhaustive()
    }
}

impl DigitSet {
    /// `n` rendered digits: image `i` shows digit `i % 10`, its variation
    /// drawn from `seed` and `i` alone. Not normalised (mean 0, std 1).
    pub fn generate(n: usize, seed: u64) -> Self {
        let mut pixels = vec![0u8; n * PIXELS];
        let labels: Vec<u8> = (0..n).map(|i| (i % CLASSES) as u8).collect();
        // Images are independent: split the work over the cores.
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        let per = n.div_ceil(threads.max(1)).max(1);
        std::thread::scope(|scope| {
            for (chunk_index, chunk) in pixels.chunks_mut(per * PIXELS).enumerate() {
                let labels = &labels;
                scope.spawn(move || {
                    for (k, image) in chunk.chunks_mut(PIXELS).enumerate() {
                        let i = chunk_index * per + k;
                        let mut rng = image_rng(seed, i as u64);
                        image.copy_from_slice(&render(labels[i], &mut rng));
                    }
                });
            }
        });
        DigitSet {
            pixels,
            labels,
            mean: 0.0,
            std: 1.0,
        }
    }

    /// The images and labels of an MNIST-format dataset, as bytes.
    pub fn from_mnist<S: Shape>(mnist: &Mnist<S>) -> Self {
        let pixels = (0..mnist.len())
            .flat_map(|i| mnist.pixels(i).unwrap_or_default().iter().copied())
            .collect();
        DigitSet {
            pixels,
            labels: mnist.labels().to_vec(),
            mean: 0.0,
            std: 1.0,
        }
    }

    /// Items become `(pixel / 255 - mean) / std`.
    pub fn normalize(mut self, mean: f32, std: f32) -> Self {
        self.mean = mean;
        self.std = std;
        self
    }

    /// The mean and standard deviation of the pixel values (`pixel / 255`)
    /// over every image: what to normalise with.
    pub fn pixel_stats(&self) -> (f32, f32) {
        let n = self.pixels.len().max(1) as f64;
        let (mut sum, mut sq) = (0.0f64, 0.0f64);
        for &p in &self.pixels {
            let v = p as f64 / 255.0;
            sum += v;
            sq += v * v;
        }
        let mean = sum / n;
        let var = (sq / n - mean * mean).max(0.0);
        (mean as f32, var.sqrt().max(1e-6) as f32)
    }

    /// The first `n` images (all of them when there are fewer).
    pub fn truncated(mut self, n: usize) -> Self {
        let n = n.min(self.labels.len());
        self.labels.truncate(n);
        self.pixels.truncate(n * PIXELS);
        self
    }

    /// Every label, in order.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// The bytes of image `index`, row after row.
    pub fn pixels(&self, index: usize) -> Option<&[u8]> {
        (index < self.labels.len()).then(|| &self.pixels[index * PIXELS..(index + 1) * PIXELS])
    }
}

impl Dataset for DigitSet {
    type Item = (Tensor<(C<1>, C<28>, C<28>)>, i64);

    fn len(&self) -> usize {
        self.labels.len()
    }

    fn get(&self, index: usize) -> Result<Self::Item, DataError> {
        let pixels = self.pixels(index).ok_or(DataError::IndexOutOfRange {
            index,
            len: self.labels.len(),
        })?;
        let (mean, std) = (self.mean, self.std);
        let values = pixels
            .iter()
            .map(|&p| (p as f32 / 255.0 - mean) / std)
            .collect();
        let image = Tensor::from_vec(values, (C, C, C))?;
        Ok((image, self.labels[index] as i64))
    }
}
