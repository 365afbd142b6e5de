//! What a run leaves on disk besides checkpoints: the metrics as CSV, a
//! loss/accuracy plot and a grid of sample images as PNG, each written
//! atomically.
//!
//! The plot is drawn with `plotters` into memory and encoded with `png`.
//! Plotters' text needs a font backend (`ttf` links the system's fontconfig
//! and freetype, `ab_glyph` needs a font file to ship), so its text features
//! stay off and the few labels are drawn by the tiny bitmap font below: the
//! example builds on a machine with nothing but Rust.

use super::TrainError;
use plotters::prelude::*;
use std::io::Write;
use std::path::Path;

/// One epoch's figures, a row of `metrics.csv`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochMetrics {
    /// The epoch, counting from 1.
    pub epoch: usize,
    /// Mean cross-entropy over the epoch's training batches.
    pub train_loss: f64,
    /// Fraction of training samples classified right (while training).
    pub train_acc: f64,
    /// Mean cross-entropy over the held-out split, in eval mode.
    pub test_loss: f64,
    /// Fraction of held-out samples classified right.
    pub test_acc: f64,
    /// Wall time of the epoch (training and evaluation), in seconds.
    pub seconds: f64,
}

/// The header of `metrics.csv`.
pub const CSV_HEADER: &str = "epoch,train_loss,train_acc,test_loss,test_acc,seconds";

/// The metrics as CSV text, header first, rounded for reading (6
/// decimals, seconds to the millisecond): `metrics.csv`.
pub fn to_csv(rows: &[EpochMetrics]) -> String {
    let mut s = format!("{CSV_HEADER}\n");
    for r in rows {
        s += &format!(
            "{},{:.6},{:.6},{:.6},{:.6},{:.3}\n",
            r.epoch, r.train_loss, r.train_acc, r.test_loss, r.test_acc, r.seconds
        );
    }
    s
}

/// [`to_csv`] with every number in the shortest text that reads back to the
/// same `f64`: how the training state keeps the metrics, so a resumed run
/// reports exactly what the uninterrupted one would.
pub fn to_csv_exact(rows: &[EpochMetrics]) -> String {
    let mut s = format!("{CSV_HEADER}\n");
    for r in rows {
        s += &format!(
            "{},{:?},{:?},{:?},{:?},{:?}\n",
            r.epoch, r.train_loss, r.train_acc, r.test_loss, r.test_acc, r.seconds
        );
    }
    s
}

/// Reads CSV text written by [`to_csv`] or [`to_csv_exact`].
///
/// # Errors
/// [`TrainError::Resume`] for another header or a malformed row.
pub fn from_csv(text: &str) -> Result<Vec<EpochMetrics>, TrainError> {
    let mut lines = text.lines();
    if lines.next() != Some(CSV_HEADER) {
        return Err(TrainError::Resume(format!(
            "the saved metrics do not start with `{CSV_HEADER}`"
        )));
    }
    lines
        .filter(|l| !l.is_empty())
        .map(|line| {
            let bad = || TrainError::Resume(format!("a malformed metrics row: `{line}`"));
            let f: Vec<&str> = line.split(',').collect();
            if f.len() != 6 {
                return Err(bad());
            }
            let num = |i: usize| f[i].parse::<f64>().map_err(|_| bad());
            Ok(EpochMetrics {
                epoch: f[0].parse().map_err(|_| bad())?,
                train_loss: num(1)?,
                train_acc: num(2)?,
                test_loss: num(3)?,
                test_acc: num(4)?,
                seconds: num(5)?,
            })
        })
        .collect()
}

/// Writes `bytes` to `path` so that readers see the old file or the new one,
/// never a part: a temporary file in the same directory, flushed to disk,
/// then renamed over `path`.
///
/// # Errors
/// [`TrainError::Io`] naming the file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    let io = |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// PNG bytes of an 8-bit image, `channels` 1 (gray) or 3 (RGB).
fn encode_png(width: u32, height: u32, channels: u8, data: &[u8]) -> Result<Vec<u8>, TrainError> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(if channels == 1 {
        png::ColorType::Grayscale
    } else {
        png::ColorType::Rgb
    });
    encoder.set_depth(png::BitDepth::Eight);
    let png_err = |e: png::EncodingError| TrainError::Plot(format!("PNG encoding: {e}"));
    let mut writer = encoder.write_header().map_err(png_err)?;
    writer.write_image_data(data).map_err(png_err)?;
    writer.finish().map_err(png_err)?;
    Ok(out)
}

/// Saves 28x28 grayscale images (bytes, row after row) as a PNG grid of
/// `cols` columns, each image scaled up `zoom` times with a 2-pixel gutter.
///
/// # Errors
/// [`TrainError::Io`] or [`TrainError::Plot`].
pub fn save_image_grid(
    path: &Path,
    images: &[&[u8]],
    cols: usize,
    zoom: usize,
) -> Result<(), TrainError> {
    const SIDE: usize = crate::digits::SIDE;
    let cols = cols.max(1);
    let rows = images.len().div_ceil(cols).max(1);
    let cell = SIDE * zoom + 2;
    let (w, h) = (cols * cell + 2, rows * cell + 2);
    let mut data = vec![96u8; w * h];
    for (k, img) in images.iter().enumerate() {
        let (r, c) = (k / cols, k % cols);
        for y in 0..SIDE * zoom {
            for x in 0..SIDE * zoom {
                let v = img.get((y / zoom) * SIDE + x / zoom).copied().unwrap_or(0);
                data[(2 + r * cell + y) * w + 2 + c * cell + x] = v;
            }
        }
    }
    let png = encode_png(w as u32, h as u32, 1, &data)?;
    write_atomic(path, &png)
}

/// The glyphs of the bitmap font: 5 columns by 7 rows, one byte per row, the
/// leftmost column in bit 4. Characters without a glyph draw as blanks.
fn glyph(c: char) -> [u8; 7] {
    match c {
        '0' => [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E],
        '1' => [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E],
        '2' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F],
        '3' => [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E],
        '4' => [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02],
        '5' => [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E],
        '6' => [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E],
        '7' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E],
        '9' => [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C],
        '.' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '-' => [0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        'a' => [0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F],
        'c' => [0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E],
        'd' => [0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F],
        'e' => [0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E],
        'h' => [0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11],
        'i' => [0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E],
        'l' => [0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E],
        'n' => [0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11],
        'o' => [0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E],
        'p' => [0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10],
        'r' => [0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10],
        's' => [0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E],
        't' => [0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06],
        'u' => [0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D],
        'y' => [0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E],
        _ => [0; 7],
    }
}

/// Width in pixels of `text` in the bitmap font at `scale`.
fn text_width(text: &str, scale: i32) -> i32 {
    text.chars().count() as i32 * 6 * scale - scale
}

/// Draws `text` with its top-left corner at `(x, y)`.
fn draw_text<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    text: &str,
    (x, y): (i32, i32),
    scale: i32,
    color: RGBColor,
) -> Result<(), TrainError> {
    for (k, c) in text.chars().enumerate() {
        let x0 = x + k as i32 * 6 * scale;
        for (row, bits) in glyph(c).iter().enumerate() {
            for col in 0..5 {
                if bits & (0x10 >> col) != 0 {
                    let (px, py) = (x0 + col * scale, y + row as i32 * scale);
                    for (dx, dy) in (0..scale).flat_map(|dx| (0..scale).map(move |dy| (dx, dy))) {
                        area.draw_pixel((px + dx, py + dy), &color)
                            .map_err(plot_err)?;
                    }
                }
            }
        }
    }
    Ok(())
}

fn plot_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> TrainError {
    TrainError::Plot(e.to_string())
}

/// A short label for an axis value.
fn fmt_value(v: f64) -> String {
    if v.abs() >= 10.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

const TRAIN_COLOR: RGBColor = RGBColor(31, 119, 180);
const TEST_COLOR: RGBColor = RGBColor(255, 127, 14);
const INK: RGBColor = RGBColor(40, 40, 40);
const GRID: RGBColor = RGBColor(225, 225, 225);

/// One panel: two series (train, test) over the epochs, with a title,
/// the value range at the left and the epochs below.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    rows: &[EpochMetrics],
    value: impl Fn(&EpochMetrics) -> (f64, f64),
) -> Result<(), TrainError> {
    let last = rows.last().map_or(1, |r| r.epoch).max(1);
    let first = rows.first().map_or(1, |r| r.epoch).min(last);
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for r in rows {
        let (a, b) = value(r);
        for v in [a, b].into_iter().filter(|v| v.is_finite()) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.08).max(1e-3);
    let (lo, hi) = (lo - pad, hi + pad);
    // A single epoch still gets an x range to draw in.
    let (x0, x1) = (first as f64 - 0.25, last as f64 + 0.25);

    let chart = ChartBuilder::on(area)
        .margin(12)
        .margin_top(34)
        .x_label_area_size(22)
        .y_label_area_size(44)
        .build_cartesian_2d(x0..x1, lo..hi)
        .map_err(plot_err)?;
    let plot = chart.plotting_area();
    // Pixel coordinates of a data point, relative to `area`.
    let origin = area.get_base_pixel();
    let at = |p: (f64, f64)| {
        let (x, y) = chart.backend_coord(&p);
        (x - origin.0, y - origin.1)
    };
    // Grid: every epoch (at most 10 lines), 5 value levels.
    let step = (last - first).div_ceil(10).max(1);
    for e in (first..=last).step_by(step) {
        plot.draw(&PathElement::new(
            vec![(e as f64, lo), (e as f64, hi)],
            GRID,
        ))
        .map_err(plot_err)?;
        let (px, py) = at((e as f64, lo));
        let label = e.to_string();
        draw_text(
            area,
            &label,
            (px - text_width(&label, 1) / 2, py + 6),
            1,
            INK,
        )?;
    }
    for k in 0..=4 {
        let v = lo + (hi - lo) * k as f64 / 4.0;
        plot.draw(&PathElement::new(vec![(x0, v), (x1, v)], GRID))
            .map_err(plot_err)?;
        let (px, py) = at((x0, v));
        let label = fmt_value(v);
        draw_text(
            area,
            &label,
            (px - 4 - text_width(&label, 1), py - 3),
            1,
            INK,
        )?;
    }
    // The frame.
    plot.draw(&PathElement::new(
        vec![(x0, lo), (x0, hi), (x1, hi), (x1, lo), (x0, lo)],
        INK,
    ))
    .map_err(plot_err)?;

    for (k, color) in [(0, TRAIN_COLOR), (1, TEST_COLOR)] {
        let points: Vec<(f64, f64)> = rows
            .iter()
            .map(|r| {
                let (a, b) = value(r);
                (r.epoch as f64, if k == 0 { a } else { b })
            })
            .collect();
        plot.draw(&PathElement::new(points.clone(), color.stroke_width(2)))
            .map_err(plot_err)?;
        for p in points {
            plot.draw(&Circle::new(p, 3, color.filled()))
                .map_err(plot_err)?;
        }
    }

    // Title and legend above the plot.
    let (left, top) = at((x0, hi));
    let (right, _) = at((x1, hi));
    draw_text(area, title, (left, top - 24), 2, INK)?;
    let mut x = right;
    for (name, color) in [("held-out", TEST_COLOR), ("train", TRAIN_COLOR)] {
        x -= text_width(name, 1);
        draw_text(area, name, (x, top - 18), 1, INK)?;
        x -= 20;
        area.draw(&Rectangle::new(
            [(x, top - 16), (x + 14, top - 14)],
            color.filled(),
        ))
        .map_err(plot_err)?;
        x -= 14;
    }
    Ok(())
}

/// Saves the loss and accuracy curves (train and held-out, per epoch) as a
/// PNG.
///
/// # Errors
/// [`TrainError::Io`] or [`TrainError::Plot`].
pub fn save_plot(path: &Path, rows: &[EpochMetrics]) -> Result<(), TrainError> {
    let (w, h) = (960u32, 380u32);
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let (left, right) = root.split_horizontally(w / 2);
        panel(&left, "loss", rows, |r| (r.train_loss, r.test_loss))?;
        panel(&right, "accuracy (%)", rows, |r| {
            (100.0 * r.train_acc, 100.0 * r.test_acc)
        })?;
        root.present().map_err(plot_err)?;
    }
    let png = encode_png(w, h, 3, &rgb)?;
    write_atomic(path, &png)
}
