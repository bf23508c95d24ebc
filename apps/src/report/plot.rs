//! SVG plots of a report (`--plot FILE.svg`).
//!
//! A header names the tool and gives the run's parameters (and the machine)
//! as a subtitle; then, side by side:
//! - bandwidth (GB/s) and message rate (Mpps) against message size, both on
//!   log axes, when the report has bandwidth rows;
//! - for latency of several sizes, latency against size on log axes: the
//!   median, the 99th and 99.9th percentiles, with shaded bands between
//!   them;
//! - for latency of one size, its whole distribution as a percentile plot.
//!
//! Drawn with `plotters`' SVG backend only: no fonts or system libraries are
//! needed (text is left to the SVG viewer). Each data series is one
//! `<polyline class="series">` element and each band one `<polygon
//! class="band">` (axes and ticks are plain polylines, points are circles,
//! legend marks rectangles), so tools can find the series.

use std::path::Path;

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;

use super::error::ReportError;
use super::figures::{BwRow, LatRow};
use super::json::Report;

/// Width and height of one panel, in pixels.
const PANEL: (u32, u32) = (600, 460);
/// Height of one header line, in pixels.
const LINE: u32 = 18;

/// Colours of the series: distinct, and readable on white.
const BLUE: RGBColor = RGBColor(31, 119, 180);
const ORANGE: RGBColor = RGBColor(230, 120, 20);
const GREEN: RGBColor = RGBColor(44, 160, 44);
const RED: RGBColor = RGBColor(214, 39, 40);
const GREY: RGBColor = RGBColor(90, 90, 90);

/// The panels a report gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Panel {
    Bandwidth,
    Rate,
    LatencyBySize,
    Percentiles,
}

fn panels(report: &Report) -> Vec<Panel> {
    let mut p = Vec::new();
    if !report.bandwidth.is_empty() {
        p.extend([Panel::Bandwidth, Panel::Rate]);
    }
    match report.latency.len() {
        0 => {}
        1 => p.push(Panel::Percentiles),
        _ => p.push(Panel::LatencyBySize),
    }
    p
}

/// Plots `report` as an SVG document: a header with the run's parameters,
/// then a panel for each of bandwidth and message rate when it has
/// bandwidth rows, and one for latency when it has latency rows (against
/// size for several sizes, a percentile plot for one). Fails when it has
/// no rows.
///
/// ```
/// use std::time::Duration;
/// use ntbdk_apps::report::{BwRow, Report, render_svg};
///
/// let mut report = Report::new("ntb-perf");
/// report.param("op", "write");
/// for shift in 1..=10 {
///     report.bandwidth.push(BwRow::new(1 << shift, 1000, Duration::from_micros(100)));
/// }
/// let svg = render_svg(&report).unwrap();
/// assert!(svg.starts_with("<svg"));
/// // Bandwidth and message rate.
/// assert_eq!(svg.matches(r#"<polyline class="series""#).count(), 2);
/// assert!(svg.contains("op=write"));
/// ```
pub fn render_svg(report: &Report) -> Result<String, ReportError> {
    // Sizes that got no sample (a time budget too short for them) have no
    // figure to draw: they are left out and named in the subtitle.
    let mut empty: Vec<u64> = Vec::new();
    let mut drawn = report.clone();
    drawn
        .bandwidth
        .retain(|r| r.iterations > 0 || !push(&mut empty, r.bytes));
    drawn
        .latency
        .retain(|r| r.iterations > 0 || !push(&mut empty, r.bytes));
    empty.sort_unstable();
    empty.dedup();
    let report = &drawn;
    let panels = panels(report);
    if panels.is_empty() {
        return Err(ReportError::Plot("the report has no rows to plot".into()));
    }
    let width = PANEL.0 * panels.len() as u32;
    // About 7 pixels a character at 13 px.
    let mut subtitle = subtitle_lines(report, (width as usize - 24) / 7);
    if !empty.is_empty() {
        let sizes: Vec<String> = empty
            .iter()
            .map(|&b| size_label((b as f64).log2()))
            .collect();
        subtitle.push(format!("no samples (not drawn): {} B", sizes.join(", ")));
    }
    let header = LINE * (2 + subtitle.len() as u32);
    let mut svg = String::new();
    {
        let size = (width, PANEL.1 + header);
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let (top, body) = root.split_vertically(header);
        top.draw(&Text::new(
            title(report),
            (12, 8),
            ("sans-serif", 18).into_font().color(&BLACK),
        ))
        .map_err(plot_err)?;
        for (i, line) in subtitle.iter().enumerate() {
            top.draw(&Text::new(
                line.clone(),
                (12, 8 + (LINE * (i as u32 + 1)) as i32 + 4),
                ("sans-serif", 13).into_font().color(&GREY),
            ))
            .map_err(plot_err)?;
        }
        let areas = body.split_evenly((1, panels.len()));
        for (area, panel) in areas.iter().zip(&panels) {
            match panel {
                Panel::Bandwidth => draw_by_size(
                    area,
                    "bandwidth",
                    "BW average [GB/s]",
                    &report.bandwidth,
                    |r| r.gb_per_s,
                    BLUE,
                )?,
                Panel::Rate => draw_by_size(
                    area,
                    "message rate",
                    "MsgRate [Mpps]",
                    &report.bandwidth,
                    |r| r.mpps,
                    GREEN,
                )?,
                Panel::LatencyBySize => draw_latency_by_size(area, &report.latency)?,
                Panel::Percentiles => draw_latency(area, &report.latency)?,
            }
        }
        root.present().map_err(plot_err)?;
    }
    Ok(mark_series(&svg))
}

/// Pushes `b` onto `v`; true (for `retain` closures that keep nothing they
/// push).
fn push(v: &mut Vec<u64>, b: u64) -> bool {
    v.push(b);
    true
}

/// The header's title: the tool and, when known, the operation and test.
fn title(report: &Report) -> String {
    let word = |k: &str| report.params.get(k).and_then(|v| v.as_str());
    match (word("op"), word("test")) {
        (Some(op), Some(test)) => format!("{}: {op} {test}", report.tool),
        (Some(op), None) => format!("{}: {op}", report.tool),
        _ => report.tool.clone(),
    }
}

/// The run's parameters as `key=value` words, then the machine, wrapped to
/// `width` characters (at most five lines; the rest is cut with `…`).
fn subtitle_lines(report: &Report, width: usize) -> Vec<String> {
    let mut words: Vec<String> = report
        .params
        .iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => format!("{k}={s}"),
            v => format!("{k}={v}"),
        })
        .collect();
    if let Some(last) = words.last_mut() {
        last.push(';');
    }
    words.extend(report.machine.split(' ').map(String::from));
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for w in words {
        if !line.is_empty() && line.chars().count() + 1 + w.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&w);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    if lines.len() > 5 {
        lines.truncate(5);
        lines[4].push_str(" …");
    }
    lines
}

/// Stroke width of data series; everything else is drawn 1 pixel wide, which
/// is how [`mark_series`] tells them apart.
const SERIES_STROKE: u32 = 2;

/// Adds `class="series"` to the polylines drawn [`SERIES_STROKE`] wide and
/// `class="band"` to the polygons (only bands are drawn as polygons).
fn mark_series(svg: &str) -> String {
    let wide = format!("stroke-width=\"{SERIES_STROKE}\"");
    let mut out = String::with_capacity(svg.len() + 1024);
    for line in svg.split_inclusive('\n') {
        if let Some(rest) = line.strip_prefix("<polyline ")
            && rest.contains(&wide)
        {
            out.push_str("<polyline class=\"series\" ");
            out.push_str(rest);
        } else if let Some(rest) = line.strip_prefix("<polygon ") {
            out.push_str("<polygon class=\"band\" ");
            out.push_str(rest);
        } else {
            out.push_str(line);
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

/// The x axis of a plot against message size: log2 of the size, with a
/// label at every power of two that fits.
fn size_axis(sizes: impl Iterator<Item = u64>) -> (Vec<f64>, KeyAxis) {
    let xs: Vec<f64> = sizes.map(|b| (b.max(1) as f64).log2()).collect();
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min).floor();
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max).ceil();
    let span = (hi - lo).max(1.0);
    let step = (span / 10.0).ceil().max(1.0);
    let keys: Vec<f64> = (0..)
        .map(|i| lo + step * f64::from(i))
        .take_while(|&k| k <= hi)
        .collect();
    (xs, KeyAxis::new((lo - 0.5)..(lo + span + 0.5), keys))
}

/// A log axis range holding every positive value of `values` (a decade when
/// there is none), with some room above and below, and with `legend` the
/// top quarter of the axis left empty for the legend.
fn log_range(values: impl Iterator<Item = f64>, legend: bool) -> Range<f64> {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        return 1e-3..1e-2;
    }
    let lo = lo / 1.5;
    let hi = (hi * 1.5).max(lo * 10.0);
    if legend {
        // The data then fills the lower three quarters of the log axis.
        lo..hi * (hi / lo).powf(1.0 / 3.0)
    } else {
        lo..hi
    }
}

/// One figure of the bandwidth rows (`y`) against message size, log-log.
fn draw_by_size(
    area: &Area<'_>,
    what: &str,
    y_desc: &str,
    rows: &[BwRow],
    y: impl Fn(&BwRow) -> f64,
    color: RGBColor,
) -> Result<(), ReportError> {
    let (xs, x_axis) = size_axis(rows.iter().map(|r| r.bytes));
    let y_range = log_range(rows.iter().map(&y), false);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{what} vs message size"), ("sans-serif", 17))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x_axis, y_range.clone().log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("message size [bytes]")
        .y_desc(y_desc)
        .x_label_formatter(&|v| size_label(*v))
        .y_label_formatter(&|v| number_label(*v))
        .draw()
        .map_err(plot_err)?;
    let points: Vec<(f64, f64)> = xs
        .iter()
        .zip(rows)
        .map(|(&x, r)| (x, y(r).max(y_range.start)))
        .collect();
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

/// Latency against message size, log-log: the median, the 99th and 99.9th
/// percentiles as lines, the bands between them shaded.
fn draw_latency_by_size(area: &Area<'_>, rows: &[LatRow]) -> Result<(), ReportError> {
    let (xs, x_axis) = size_axis(rows.iter().map(|r| r.bytes));
    let y_range = log_range(
        rows.iter()
            .flat_map(|r| [r.t_typical_us, r.p99_us, r.p99_9_us]),
        true,
    );
    let mut chart = ChartBuilder::on(area)
        .caption("latency vs message size", ("sans-serif", 17))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x_axis, y_range.clone().log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("message size [bytes]")
        .y_desc("latency [usec]")
        .x_label_formatter(&|v| size_label(*v))
        .y_label_formatter(&|v| number_label(*v))
        .draw()
        .map_err(plot_err)?;
    let line = |f: fn(&LatRow) -> f64| -> Vec<(f64, f64)> {
        xs.iter()
            .zip(rows)
            .map(|(&x, r)| (x, f(r).max(y_range.start)))
            .collect()
    };
    let median = line(|r| r.t_typical_us);
    let p99 = line(|r| r.p99_us);
    let p999 = line(|r| r.p99_9_us);
    // Bands first, so the lines are drawn over them.
    for (low, high, color) in [(&median, &p99, ORANGE), (&p99, &p999, RED)] {
        let outline: Vec<(f64, f64)> = low.iter().chain(high.iter().rev()).copied().collect();
        chart
            .draw_series(std::iter::once(Polygon::new(
                outline,
                color.mix(0.18).filled(),
            )))
            .map_err(plot_err)?;
    }
    for (points, color, label) in [
        (&median, BLUE, "median (t_typical)"),
        (&p99, ORANGE, "99% percentile"),
        (&p999, RED, "99.9% percentile"),
    ] {
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(SERIES_STROKE),
            ))
            .map_err(plot_err)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 16, y + 4)], color.filled()));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 2, color.filled())))
            .map_err(plot_err)?;
    }
    legend(&mut chart)
}

/// The legend, in the upper left corner (where latency that grows with
/// size leaves room), on a white box.
fn legend<'a, X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
) -> Result<(), ReportError> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .margin(10)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)
}

/// Latency (µs, log axis) against the percentile, on HdrHistogram's usual
/// axis where 90 %, 99 %, 99.9 % … are evenly spaced; one series per message
/// size.
fn draw_latency(area: &Area<'_>, rows: &[LatRow]) -> Result<(), ReportError> {
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
    // Latency on a log axis: long tails stay readable.
    let y_range = log_range(
        rows.iter()
            .flat_map(|r| r.distribution.iter().map(|p| p.usec)),
        true,
    );
    let (y_min, y_max) = (y_range.start, y_range.end);

    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("latency distribution, {} B", rows[0].bytes),
            ("sans-serif", 17),
        )
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(KeyAxis::new(0f64..x_max, keys), (y_min..y_max).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency [usec]")
        .x_label_formatter(&|v| percentile_label(*v))
        .y_label_formatter(&|v| number_label(*v))
        .draw()
        .map_err(plot_err)?;

    for (i, row) in rows.iter().enumerate() {
        let color = [BLUE, ORANGE, GREEN, RED][i % 4];
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
    legend(&mut chart)
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

/// A tick value of a log axis, short: `0.01`, `0.5`, `20`, `3000`, `1e5`.
fn number_label(v: f64) -> String {
    if !(1e-3..1e5).contains(&v.abs()) {
        return format!("{v:.0e}");
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
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
