//! SVG plots of a report (`--plot FILE.svg`): bandwidth against message size
//! on a log2 axis, and the latency distribution as a percentile plot.
//!
//! Drawn with `plotters`' SVG backend only: no fonts or system libraries are
//! needed (text is left to the SVG viewer). Each data series is one
//! `<polyline class="series">` element (axes and ticks are plain polylines,
//! points are circles, legend marks rectangles), so tools can find the series.

use std::path::Path;

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;

use super::error::ReportError;
use super::figures::{BwRow, LatRow};
use super::json::Report;

/// Width and height of one panel, in pixels.
const PANEL: (u32, u32) = (640, 480);

/// Plots `report` as an SVG document: a bandwidth panel when it has
/// bandwidth rows, a latency panel when it has latency rows, side by side
/// when it has both. Fails when it has neither.
///
/// ```
/// use std::time::Duration;
/// use ntbdk_apps::report::{BwRow, Report, render_svg};
///
/// let mut report = Report::new("ntb-perf");
/// for shift in 1..=10 {
///     report.bandwidth.push(BwRow::new(1 << shift, 1000, Duration::from_micros(100)));
/// }
/// let svg = render_svg(&report).unwrap();
/// assert!(svg.starts_with("<svg"));
/// assert_eq!(svg.matches(r#"<polyline class="series""#).count(), 1);
/// ```
pub fn render_svg(report: &Report) -> Result<String, ReportError> {
    let panels =
        usize::from(!report.bandwidth.is_empty()) + usize::from(!report.latency.is_empty());
    if panels == 0 {
        return Err(ReportError::Plot("the report has no rows to plot".into()));
    }
    let mut svg = String::new();
    {
        let size = (PANEL.0 * panels as u32, PANEL.1);
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let areas = root.split_evenly((1, panels));
        let mut areas = areas.iter();
        if !report.bandwidth.is_empty() {
            let area = areas.next().expect("one area per panel");
            draw_bandwidth(area, &report.tool, &report.bandwidth)?;
        }
        if !report.latency.is_empty() {
            let area = areas.next().expect("one area per panel");
            draw_latency(area, &report.tool, &report.latency)?;
        }
        root.present().map_err(plot_err)?;
    }
    Ok(mark_series(&svg))
}

/// Stroke width of data series; everything else is drawn 1 pixel wide, which
/// is how [`mark_series`] tells them apart.
const SERIES_STROKE: u32 = 2;

/// Adds `class="series"` to the polylines drawn [`SERIES_STROKE`] wide.
fn mark_series(svg: &str) -> String {
    let wide = format!("stroke-width=\"{SERIES_STROKE}\"");
    let mut out = String::with_capacity(svg.len() + 1024);
    for line in svg.split_inclusive('\n') {
        match line.strip_prefix("<polyline ") {
            Some(rest) if rest.contains(&wide) => {
                out.push_str("<polyline class=\"series\" ");
                out.push_str(rest);
            }
            _ => out.push_str(line),
        }
    }
    out
}

/// Writes [`render_svg`]'s document to `path`.
pub fn write_svg(report: &Report, path: &Path) -> Result<(), ReportError> {
    let svg = render_svg(report)?;
    std::fs::write(path, svg).map_err(|source| ReportError::Io {
        action: "write",
        path: path.to_path_buf(),
        source,
    })
}

fn plot_err(e: impl std::fmt::Display) -> ReportError {
    ReportError::Plot(e.to_string())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Bandwidth (GB/s) against log2 of the message size.
fn draw_bandwidth(area: &Area<'_>, tool: &str, rows: &[BwRow]) -> Result<(), ReportError> {
    let xs: Vec<f64> = rows
        .iter()
        .map(|r| (r.bytes.max(1) as f64).log2())
        .collect();
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min).floor();
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max).ceil();
    let span = (hi - lo).max(1.0);
    let step = (span / 12.0).ceil().max(1.0);
    let keys: Vec<f64> = (0..)
        .map(|i| lo + step * f64::from(i))
        .take_while(|&k| k <= hi)
        .collect();
    let y_max = nice_max(rows.iter().map(|r| r.gb_per_s));

    let mut chart = ChartBuilder::on(area)
        .caption(format!("{tool}: bandwidth"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(
            KeyAxis::new((lo - 0.5)..(lo + span + 0.5), keys),
            0f64..y_max,
        )
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("message size [bytes]")
        .y_desc("BW average [GB/s]")
        .x_label_formatter(&|v| size_label(*v))
        .draw()
        .map_err(plot_err)?;

    let color = Palette99::pick(0).to_rgba();
    let points: Vec<(f64, f64)> = xs.iter().zip(rows).map(|(&x, r)| (x, r.gb_per_s)).collect();
    chart
        .draw_series(LineSeries::new(
            points.iter().copied(),
            color.stroke_width(SERIES_STROKE),
        ))
        .map_err(plot_err)?;
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
        .map_err(plot_err)?;
    Ok(())
}

/// Latency (µs, log axis) against the percentile, on HdrHistogram's usual
/// axis where 90 %, 99 %, 99.9 % … are evenly spaced; one series per message
/// size.
fn draw_latency(area: &Area<'_>, tool: &str, rows: &[LatRow]) -> Result<(), ReportError> {
    // x = -log10(1 - q): 0 at the minimum, 1 at 90 %, 2 at 99 %, … The last
    // step (q = 1, the maximum) is drawn half a decade past the sample count.
    let tail = |r: &LatRow| (r.iterations.max(1) as f64).log10() + 0.5;
    let x_of = |q: f64, r: &LatRow| {
        if q >= 1.0 {
            tail(r)
        } else {
            (-(1.0 - q).log10()).min(tail(r))
        }
    };
    let x_max = rows.iter().map(tail).fold(1.0, f64::max);
    let keys: Vec<f64> = (0..=x_max as u32).map(f64::from).collect();
    // Latency on a log axis: sizes far apart and long tails stay readable.
    let values = || {
        rows.iter()
            .flat_map(|r| r.distribution.iter().map(|p| p.usec))
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    let y_min = values().fold(f64::INFINITY, f64::min);
    let y_min = if y_min.is_finite() {
        y_min / 1.25
    } else {
        1e-3
    };
    let y_max = values().fold(0.0, f64::max).max(y_min * 10.0) * 1.25;

    let mut chart = ChartBuilder::on(area)
        .caption(format!("{tool}: latency distribution"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(KeyAxis::new(0f64..x_max, keys), (y_min..y_max).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency [usec]")
        .x_label_formatter(&|v| percentile_label(*v))
        .draw()
        .map_err(plot_err)?;

    for (i, row) in rows.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = row
            .distribution
            .iter()
            .map(|p| (x_of(p.quantile, row), p.usec.max(y_min)))
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(SERIES_STROKE)))
            .map_err(plot_err)?
            .label(format!("{} B", row.bytes))
            .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 16, y + 4)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    Ok(())
}

/// A linear `f64` axis whose labels and grid lines sit at chosen points only
/// (the integer exponents of a log axis), thinned to what fits.
struct KeyAxis {
    range: Range<f64>,
    keys: Vec<f64>,
}

impl KeyAxis {
    fn new(range: Range<f64>, keys: Vec<f64>) -> Self {
        Self { range, keys }
    }
}

impl Ranged for KeyAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let t = (value - self.range.start) / span;
        limit.0 + (t * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        let max = hint.max_num_points();
        if max == 0 || self.keys.is_empty() {
            return Vec::new();
        }
        let every = self.keys.len().div_ceil(max);
        self.keys.iter().copied().step_by(every).collect()
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

/// A round upper bound for an axis showing `values` (at least 1e-3, with
/// 10 % headroom).
fn nice_max(values: impl Iterator<Item = f64>) -> f64 {
    let m = values.filter(|v| v.is_finite()).fold(0.0, f64::max);
    (m * 1.1).max(1e-3)
}

/// `2^v` bytes as `2`, `64`, `4K`, `1M`, `8M` (binary units).
fn size_label(v: f64) -> String {
    let bytes = 2f64.powf(v).round() as u64;
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// The percentile at `x = -log10(1 - q)`: `0%`, `90%`, `99%`, `99.9%`, …
fn percentile_label(x: f64) -> String {
    let decades = x.round() as i32;
    if decades <= 0 {
        return "0%".into();
    }
    let q = 100.0 * (1.0 - 10f64.powi(-decades));
    format!("{q:.prec$}%", prec = (decades - 2).max(0) as usize)
}
