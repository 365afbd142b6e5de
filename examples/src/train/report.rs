//! What a run leaves on disk besides checkpoints: the metrics as CSV, a
//! loss/accuracy plot and a grid of sample images as PNG, each written
//! atomically.
//!
//! The plot is drawn with `plotters` into memory and encoded with `png`.
//! Its text uses DejaVu Sans compiled into the program
//! (`examples/assets/fonts/`, ASCII only, 14 KB) through `ab_glyph`: no
//! system font, fontconfig or freetype, so the example builds and draws on
//! a machine with nothing but Rust.

use super::TrainError;
use ab_glyph::{Font, FontRef, ScaleFont};
use plotters::prelude::*;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{BackendColor, BackendCoord, BackendTextStyle, DrawingErrorKind};
use std::io::Write;
use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

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

/// DejaVu Sans, cut down to the characters a plot prints; its licence and
/// how it was cut are beside it.
const FONT_BYTES: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-subset.ttf");
/// The family [`FONT_BYTES`] is registered as: plotters' default for text.
const FONT: &str = "sans-serif";

/// [`FONT_BYTES`], parsed, and registered with plotters (which measures
/// text with it), once per process.
fn font() -> Result<&'static FontRef<'static>, TrainError> {
    static FONT_REF: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    FONT_REF
        .get_or_init(|| {
            plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES).ok()?;
            FontRef::try_from_slice(FONT_BYTES).ok()
        })
        .as_ref()
        .ok_or_else(|| TrainError::Plot("the bundled font does not parse".into()))
}

/// A [`BitMapBackend`] that draws text itself. Plotters 0.3.7's `ab_glyph`
/// text drops each glyph's left side bearing, so letters drift by a pixel
/// or two ("h eld-out", "ep och"), and puts the baseline at half the font
/// size; here each glyph sits at its pen position, and capitals are
/// centred in the box plotters measured (so tick labels centre on their
/// grid line). Everything else goes to the bitmap as it is.
struct Canvas<'a> {
    bitmap: BitMapBackend<'a>,
    font: &'static FontRef<'static>,
}

impl<'a> DrawingBackend for Canvas<'a> {
    type ErrorType = <BitMapBackend<'a> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.bitmap.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.bitmap.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.bitmap.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.bitmap.draw_pixel(point, color)
    }

    fn draw_line<S: plotters_backend::BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.bitmap.draw_line(from, to, style)
    }

    fn draw_rect<S: plotters_backend::BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.bitmap.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.bitmap.blit_bitmap(pos, size, src)
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        // Plotters' box for the text (its width is the advances and
        // kerning, as below), anchored at `pos` as plotters would.
        let ((x0, y0), (x1, y1)) = style
            .layout_box(text)
            .map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (width, height) = (x1 - x0, y1 - y0);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Center => -width / 2,
            HPos::Right => -width,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let font = self.font.as_scaled(style.size() as f32);
        let cap_height = font
            .outline_glyph(font.scaled_glyph('H'))
            .map_or(0.0, |h| h.px_bounds().height());
        let baseline = (height as f32 + cap_height) / 2.0;
        let transform = style.transform();
        let mut pen = 0.0f32;
        let mut previous = None;
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = previous {
                pen += font.kern(p, id);
            }
            previous = Some(id);
            let glyph = id.with_scale_and_position(font.scale(), ab_glyph::point(pen, baseline));
            pen += font.h_advance(id);
            let Some(outline) = font.outline_glyph(glyph) else {
                continue;
            };
            let bounds = outline.px_bounds();
            let mut result = Ok(());
            outline.draw(|x, y, coverage| {
                if result.is_err() || coverage <= 0.0 {
                    return;
                }
                let (x, y) = transform.transform(
                    bounds.min.x as i32 + x as i32 + dx,
                    bounds.min.y as i32 + y as i32 + dy,
                );
                let shade = BackendColor {
                    alpha: color.alpha * f64::from(coverage.min(1.0)),
                    rgb: color.rgb,
                };
                result = self.bitmap.draw_pixel((pos.0 + x, pos.1 + y), shade);
            });
            result?;
        }
        Ok(())
    }
}

fn plot_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> TrainError {
    TrainError::Plot(e.to_string())
}

/// The loss axis: from 0 (a loss is never negative) to 5% above the
/// highest finite value, so the top point does not touch the frame.
fn loss_range(values: impl IntoIterator<Item = f64>) -> Range<f64> {
    let max = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    0.0..if max > 0.0 { 1.05 * max } else { 1.0 }
}

/// The accuracy axis, in percent: the values with a margin of 8% of their
/// spread (at least one point), kept inside 0..100.
fn accuracy_range(values: impl IntoIterator<Item = f64>) -> Range<f64> {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo > hi {
        return 0.0..100.0;
    }
    let pad = ((hi - lo) * 0.08).max(1.0);
    (lo - pad).clamp(0.0, 99.0)..(hi + pad).clamp(1.0, 100.0)
}

/// Decimals for the labels of an axis spanning `span` with at most `ticks`
/// of them: those of the finest step plotters may choose (a 1, 2 or 5
/// times a power of ten, with no more than `ticks` labels, so at least
/// `span / (ticks + 2)` whatever the labels' alignment).
fn decimals(span: f64, ticks: usize) -> usize {
    let least = span / (ticks + 2) as f64;
    if !(least > 0.0 && least.is_finite()) {
        return 0;
    }
    let decade = 10f64.powf(least.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * decade)
        .find(|&s| s >= least * (1.0 - 1e-9))
        .unwrap_or(10.0 * decade);
    (-step.log10().floor()).clamp(0.0, 6.0) as usize
}

const TRAIN_COLOR: RGBColor = RGBColor(31, 119, 180);
const TEST_COLOR: RGBColor = RGBColor(255, 127, 14);
const INK: RGBColor = RGBColor(40, 40, 40);
const GRID: RGBColor = RGBColor(225, 225, 225);
/// The most labels an axis gets.
const TICKS: usize = 6;

/// One panel: two series (train, held-out) per run over the epochs, with a
/// title, both axes labelled and a legend at `legend`. The first run is
/// drawn in full colour; the others (another precision) in lighter, thinner
/// lines with their label in the legend.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    y_desc: &str,
    y_range: Range<f64>,
    legend: SeriesLabelPosition,
    runs: &[Run],
    value: impl Fn(&EpochMetrics) -> (f64, f64),
) -> Result<(), TrainError> {
    let all = || runs.iter().flat_map(|(_, rows)| rows.iter());
    let last = all().map(|r| r.epoch).max().unwrap_or(1).max(1);
    let first = all().map(|r| r.epoch).min().unwrap_or(1).min(last);
    // A margin either side, so that a single epoch still gets an x range
    // and the first and last markers clear the frame.
    let pad = (0.03 * (last - first) as f64).max(0.25);
    let (x0, x1) = (first as f64 - pad, last as f64 + pad);
    let y_decimals = decimals(y_range.end - y_range.start, TICKS);

    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 20).into_font().color(&INK))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(62)
        .build_cartesian_2d(x0..x1, y_range)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(INK)
        // At most one label per epoch, whole epochs only.
        .x_labels((last - first + 1).min(10))
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{x:.0}")
            } else {
                String::new()
            }
        })
        .y_labels(TICKS)
        .y_label_formatter(&|y| format!("{y:.y_decimals$}"))
        .x_desc("epoch")
        .y_desc(y_desc)
        .label_style((FONT, 13).into_font().color(&INK))
        .axis_desc_style((FONT, 15).into_font().color(&INK))
        .draw()
        .map_err(plot_err)?;

    for (i, (run, rows)) in runs.iter().enumerate() {
        for (name, base, pick_test) in [
            ("train", TRAIN_COLOR, false),
            ("held-out", TEST_COLOR, true),
        ] {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .map(|r| {
                    let (train, test) = value(r);
                    (r.epoch as f64, if pick_test { test } else { train })
                })
                .filter(|(_, v)| v.is_finite())
                .collect();
            let (style, dot, label) = if i == 0 {
                let label = match runs.len() {
                    1 => name.to_string(),
                    _ => format!("{name}, {run}"),
                };
                (base.stroke_width(2), base.filled(), label)
            } else {
                let light = base.mix(0.45);
                (
                    light.stroke_width(1),
                    light.filled(),
                    format!("{name}, {run}"),
                )
            };
            chart
                .draw_series(LineSeries::new(points.clone(), style))
                .map_err(plot_err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            chart
                .draw_series(points.into_iter().map(|p| Circle::new(p, 3, dot)))
                .map_err(plot_err)?;
        }
    }
    chart
        .configure_series_labels()
        .position(legend)
        .margin(10)
        .label_font((FONT, 13).into_font().color(&INK))
        .background_style(WHITE.mix(0.9))
        .border_style(GRID)
        .draw()
        .map_err(plot_err)?;
    Ok(())
}

/// The size of `metrics.png`, in pixels.
pub const PLOT_SIZE: (u32, u32) = (960, 400);

/// One run's metrics with its label in the plot (`f32`, `bf16 autocast`).
pub type Run = (String, Vec<EpochMetrics>);

/// The loss and accuracy curves (train and held-out, per epoch) as PNG
/// bytes of [`PLOT_SIZE`].
///
/// # Errors
/// [`TrainError::Plot`].
pub fn plot_png(rows: &[EpochMetrics]) -> Result<Vec<u8>, TrainError> {
    plot_runs_png(&[(String::new(), rows.to_vec())])
}

/// [`plot_png`] for several runs of the same job (f32 and mixed
/// precision): every run's curves in the same two panels, the first in
/// full colour.
///
/// # Errors
/// [`TrainError::Plot`].
pub fn plot_runs_png(runs: &[Run]) -> Result<Vec<u8>, TrainError> {
    let rows: Vec<&EpochMetrics> = runs.iter().flat_map(|(_, r)| r.iter()).collect();
    let font = font()?;
    let (w, h) = PLOT_SIZE;
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    {
        let root = Canvas {
            bitmap: BitMapBackend::with_buffer(&mut rgb, (w, h)),
            font,
        }
        .into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let (left, right) = root.split_horizontally(w / 2);
        panel(
            &left,
            "loss",
            "cross-entropy",
            loss_range(rows.iter().flat_map(|r| [r.train_loss, r.test_loss])),
            SeriesLabelPosition::UpperRight,
            runs,
            |r| (r.train_loss, r.test_loss),
        )?;
        panel(
            &right,
            "accuracy",
            "correct (%)",
            accuracy_range(
                rows.iter()
                    .flat_map(|r| [100.0 * r.train_acc, 100.0 * r.test_acc]),
            ),
            SeriesLabelPosition::LowerRight,
            runs,
            |r| (100.0 * r.train_acc, 100.0 * r.test_acc),
        )?;
        root.present().map_err(plot_err)?;
    }
    encode_png(w, h, 3, &rgb)
}

/// Saves [`plot_runs_png`]'s image at `path`.
///
/// # Errors
/// [`TrainError::Io`] or [`TrainError::Plot`].
pub fn save_plot(path: &Path, runs: &[Run]) -> Result<(), TrainError> {
    write_atomic(path, &plot_runs_png(runs)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(epoch: usize, loss: (f64, f64), acc: (f64, f64)) -> EpochMetrics {
        EpochMetrics {
            epoch,
            train_loss: loss.0,
            train_acc: acc.0,
            test_loss: loss.1,
            test_acc: acc.1,
            seconds: 1.0,
        }
    }

    #[test]
    fn the_loss_axis_starts_at_zero() {
        assert_eq!(loss_range([0.9, 0.2, 0.03, 0.5]), 0.0..0.9 * 1.05);
        // A diverged run's NaN or infinite loss does not blow up the axis.
        assert_eq!(loss_range([f64::NAN, 2.0, f64::INFINITY]), 0.0..2.0 * 1.05);
        assert_eq!(loss_range([]), 0.0..1.0);
        assert_eq!(loss_range([0.0]), 0.0..1.0);
    }

    #[test]
    fn the_accuracy_axis_stays_within_0_and_100() {
        // Near the top: the margin stops at 100 (it used to reach 101).
        assert_eq!(accuracy_range([95.0, 99.5, 100.0]), 94.0..100.0);
        assert_eq!(accuracy_range([50.0, 100.0]), 46.0..100.0);
        // Near the bottom: it stops at 0.
        assert_eq!(accuracy_range([0.0, 10.0, 50.0]), 0.0..54.0);
        // One value: a point either side, still inside 0..100.
        assert_eq!(accuracy_range([100.0]), 99.0..100.0);
        assert_eq!(accuracy_range([0.0]), 0.0..1.0);
        assert_eq!(accuracy_range([f64::NAN]), 0.0..100.0);
    }

    #[test]
    fn axis_labels_get_enough_decimals() {
        // 0..100 in steps of 20; 0..2.5 in steps of 0.5.
        assert_eq!(decimals(100.0, 6), 0);
        assert_eq!(decimals(2.5, 6), 1);
        // 0..0.47: steps of 0.1, so "0.1", not "0.10".
        assert_eq!(decimals(0.47, 6), 1);
        // 0..0.35: steps of 0.05 are possible.
        assert_eq!(decimals(0.35, 6), 2);
        assert_eq!(decimals(0.0, 6), 0);
        assert_eq!(decimals(f64::NAN, 6), 0);
    }

    /// Decodes PNG bytes into (width, height, RGB pixels).
    fn decode(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    #[test]
    fn the_plot_decodes_and_has_text_and_both_curves() {
        let rows: Vec<_> = (1..=5)
            .map(|e| {
                let k = e as f64;
                row(e, (1.0 / k, 1.2 / k), (1.0 - 0.1 / k, 0.98 - 0.1 / k))
            })
            .collect();
        let (w, h, rgb) = decode(&plot_png(&rows).unwrap());
        assert_eq!((w, h), PLOT_SIZE);
        let count = |c: RGBColor| {
            rgb.chunks(3)
                .filter(|p| (p[0], p[1], p[2]) == (c.0, c.1, c.2))
                .count()
        };
        // Both series are drawn, in each panel (lines, markers, legend).
        assert!(count(TRAIN_COLOR) > 500, "{}", count(TRAIN_COLOR));
        assert!(count(TEST_COLOR) > 500, "{}", count(TEST_COLOR));
        // The font draws antialiased text: grey levels between the ink and
        // white, which the bitmap font never had.
        let greys = rgb
            .chunks(3)
            .filter(|p| p[0] == p[1] && p[1] == p[2] && p[0] > 60 && p[0] < 200)
            .count();
        assert!(greys > 300, "{greys} grey pixels: no text?");
        // No epochs yet still draws (empty axes).
        let (w, h, _) = decode(&plot_png(&[]).unwrap());
        assert_eq!((w, h), PLOT_SIZE);
    }

    #[test]
    fn a_second_run_is_drawn_in_lighter_lines_beside_the_first() {
        let rows: Vec<_> = (1..=5)
            .map(|e| {
                let k = e as f64;
                row(e, (1.0 / k, 1.2 / k), (1.0 - 0.1 / k, 0.98 - 0.1 / k))
            })
            .collect();
        let other: Vec<_> = rows
            .iter()
            .map(|r| EpochMetrics {
                train_loss: 1.1 * r.train_loss,
                test_acc: r.test_acc - 0.01,
                ..*r
            })
            .collect();
        // The lighter colour: 45% of the series colour over white.
        let light = |c: RGBColor| [c.0, c.1, c.2].map(|v| 0.45 * f64::from(v) + 0.55 * 255.0);
        let near = |rgb: &[u8], want: [f64; 3]| {
            rgb.chunks(3)
                .filter(|p| (0..3).all(|i| (f64::from(p[i]) - want[i]).abs() <= 3.0))
                .count()
        };
        let (_, _, one) = decode(&plot_runs_png(&[("f32".into(), rows.clone())]).unwrap());
        let two = [("f32".into(), rows), ("bf16 autocast".into(), other)];
        let (_, _, two) = decode(&plot_runs_png(&two).unwrap());
        for c in [TRAIN_COLOR, TEST_COLOR] {
            let (a, b) = (near(&one, light(c)), near(&two, light(c)));
            assert!(b > a + 100, "light pixels: {a} with one run, {b} with two");
        }
    }
}
