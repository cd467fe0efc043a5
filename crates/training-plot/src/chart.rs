//! The chart of a run's [`Curves`]: bits per byte against steps done (each step's training
//! batch, the held-out bytes under the model and its EMA teacher), the compressors' baselines as
//! dashed lines, the learning rate on a second axis. Lines differ in width and dash as well as
//! colour, so the chart reads in grey too.

use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::log::Curves;

/// Pixels of the chart, in both formats.
pub const WIDTH: u32 = 1000;
pub const HEIGHT: u32 = 600;

/// The typeface text is drawn in: shipped with the crate (with its licence beside it), so a
/// PNG renders the same on a machine with no fonts installed.
const FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

/// The legend's names of the series, in the order they are drawn.
pub const TRAIN_LABEL: &str = "training batch";
pub const HELD_OUT_LABEL: &str = "held-out (model)";
pub const TEACHER_LABEL: &str = "held-out (EMA teacher)";
pub const LEARNING_RATE_LABEL: &str = "learning rate (right axis)";
pub const STEPS_AXIS: &str = "steps";
pub const BITS_AXIS: &str = "bits per byte";
pub const LEARNING_RATE_AXIS: &str = "learning rate";

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("the chart could not be drawn: {0}")]
    Draw(String),
    #[error("the chart's PNG could not be encoded: {0}")]
    Png(#[from] png::EncodingError),
    #[error("the chart's typeface could not be loaded")]
    Font,
}

/// The chart as an SVG document.
pub fn svg(curves: &Curves) -> Result<String, PlotError> {
    register_font()?;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        draw(&root, curves)?;
        root.present().map_err(draw_error)?;
    }
    Ok(out)
}

/// The chart as a PNG file's bytes.
pub fn png(curves: &Curves) -> Result<Vec<u8>, PlotError> {
    register_font()?;
    let mut pixels = vec![0u8; WIDTH as usize * HEIGHT as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (WIDTH, HEIGHT)).into_drawing_area();
        draw(&root, curves)?;
        root.present().map_err(draw_error)?;
    }
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, WIDTH, HEIGHT);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header()?.write_image_data(&pixels)?;
    Ok(out)
}

fn register_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    ok.then_some(()).ok_or(PlotError::Font)
}

fn draw_error(e: impl std::fmt::Display) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// The ranges the axes cover: every point drawn, from 0.
struct Ranges {
    steps: u64,
    bits: f64,
    learning_rate: f64,
}

fn ranges(c: &Curves) -> Ranges {
    let max = |points: &[(u64, f64)]| points.iter().map(|p| p.1).fold(0.0f64, f64::max);
    let baselines = c
        .baselines
        .map_or(0.0, |b| b.gzip_9.max(b.xz_9).max(b.zstd_19));
    let bits = max(&c.train)
        .max(max(&c.held_out))
        .max(max(&c.teacher))
        .max(baselines);
    let steps = c.train.iter().chain(&c.held_out).map(|p| p.0).max();
    Ranges {
        steps: steps.unwrap_or(1).max(1),
        bits: finite_or(bits * 1.05, 1.0),
        learning_rate: finite_or(max(&c.learning_rate) * 1.1, 1.0),
    }
}

/// `x` when it is a usable axis end, else `fallback` (an all-zero or non-finite series).
fn finite_or(x: f64, fallback: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        fallback
    }
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &Curves) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(draw_error)?;
    let r = ranges(c);
    let mut chart = ChartBuilder::on(root)
        .caption("dormouse training: bits per byte", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .right_y_label_area_size(72)
        .build_cartesian_2d(0u64..r.steps, 0f64..r.bits)
        .map_err(draw_error)?
        .set_secondary_coord(0u64..r.steps, 0f64..r.learning_rate);
    chart
        .configure_mesh()
        .x_desc(STEPS_AXIS)
        .y_desc(BITS_AXIS)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(draw_error)?;
    chart
        .configure_secondary_axes()
        .y_desc(LEARNING_RATE_AXIS)
        .y_label_formatter(&|v| format!("{v:.1e}"))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(draw_error)?;

    let train = RGBColor(150, 150, 150);
    let model = RGBColor(31, 119, 180);
    let teacher = RGBColor(214, 39, 40);
    let lr = RGBColor(44, 160, 44);
    chart
        .draw_series(LineSeries::new(
            c.train.iter().copied(),
            train.stroke_width(1),
        ))
        .map_err(draw_error)?
        .label(TRAIN_LABEL)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], train.stroke_width(1)));
    chart
        .draw_series(LineSeries::new(
            c.held_out.iter().copied(),
            model.stroke_width(3),
        ))
        .map_err(draw_error)?
        .label(HELD_OUT_LABEL)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], model.stroke_width(3)));
    chart
        .draw_series(LineSeries::new(
            c.teacher.iter().copied(),
            teacher.stroke_width(2),
        ))
        .map_err(draw_error)?
        .label(TEACHER_LABEL)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], teacher.stroke_width(2)));
    if let Some(b) = c.baselines {
        for (name, bits) in [
            ("gzip -9", b.gzip_9),
            ("xz -9", b.xz_9),
            ("zstd -19", b.zstd_19),
        ] {
            let line = [(0, bits), (r.steps, bits)];
            chart
                .draw_series(DashedLineSeries::new(line, 8, 5, BLACK.stroke_width(1)))
                .map_err(draw_error)?
                .label(baseline_label(name, bits))
                .legend(|(x, y)| {
                    DashedPathElement::new([(x, y), (x + 20, y)], 8, 5, BLACK.stroke_width(1))
                });
        }
    }
    chart
        .draw_secondary_series(DashedLineSeries::new(
            c.learning_rate.iter().copied(),
            2,
            3,
            lr.stroke_width(2),
        ))
        .map_err(draw_error)?
        .label(LEARNING_RATE_LABEL)
        .legend(move |(x, y)| {
            DashedPathElement::new([(x, y), (x + 20, y)], 2, 3, lr.stroke_width(2))
        });
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(draw_error)?;
    Ok(())
}

/// A baseline's name in the legend, with its figure.
pub fn baseline_label(name: &str, bits: f64) -> String {
    format!("{name}: {bits:.3} bits per byte")
}
