//! The report module: table layout, latency figures from a known histogram,
//! JSON round trip, SVG well-formedness and progress lines.

use std::time::Duration;

use ntbdk_apps::report::{
    BwRow, BwUnit, LatRow, Progress, RULE, Report, bw_header, bw_line, bw_table, lat_header,
    lat_line, lat_table, new_histogram, progress_line, render_svg, write_svg,
};

/// 1..=1000 ns, once each: every figure is known exactly (values below 2048
/// are exact at three significant digits).
fn known_latency(bytes: u64) -> LatRow {
    let mut hist = new_histogram();
    for ns in 1..=1000 {
        hist.record(ns).unwrap();
    }
    LatRow::from_histogram(bytes, &hist)
}

fn sweep() -> Vec<BwRow> {
    (1..=23)
        .map(|shift| BwRow::new(1 << shift, 1000, Duration::from_micros(50 + shift)))
        .collect()
}

/// perftest's own output for these figures, as its printf formats
/// (`REPORT_FMT`, `REPORT_FMT_EXT`, `REPORT_FMT_LAT` of
/// perftest_parameters.h) print them: the golden lines our tables must
/// equal byte for byte.
const PERFTEST_BW_LINE: &str =
    " 65536      5000             0.00               12500.00\t\t     0.200000";
const PERFTEST_BW_LINE_GBITS_EXT: &str =
    " 2          5000           0.000000            0.080000            5.000000";
const PERFTEST_LAT_LINE: &str = " 64      1000          0.00           1.00         0.50     \t       0.50        \t0.29   \t\t0.99    \t\t1.00   ";
const PERFTEST_BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
const PERFTEST_LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

#[test]
fn bandwidth_table_is_perftests_byte_for_byte() {
    let rows = vec![
        BwRow::new(2, 5000, Duration::from_millis(1)),
        BwRow::new(65536, 5000, Duration::from_millis(25)),
        BwRow::new(8 << 20, 5000, Duration::from_secs(4)).with_peak(12.0),
    ];
    let text = bw_table(&rows, BwUnit::MBps);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert_eq!(lines[0], RULE);
    assert_eq!(lines[0].len(), 87);
    assert_eq!(lines[5], RULE);
    assert_eq!(lines[1], PERFTEST_BW_HEADER);
    assert_eq!(lines[3], PERFTEST_BW_LINE);
    // perftest's columns: $1 size, $2 iterations, $3 peak, $4 average, $5 Mpps.
    // 8 MiB × 5000 in 4 s = 10000 MB/sec (2^20 B/s); peak 12 GB/s = 11444.09.
    assert_eq!(
        lines[4].split_whitespace().collect::<Vec<_>>(),
        ["8388608", "5000", "11444.09", "10000.00", "0.001250"]
    );
    // Gb/sec with --report_gbits; below 0.1 perftest prints six decimals.
    let gbits = bw_table(&rows[..1], BwUnit::Gbps);
    let g: Vec<&str> = gbits.lines().collect();
    assert_eq!(
        g[1],
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    );
    assert_eq!(g[2], PERFTEST_BW_LINE_GBITS_EXT);
}

#[test]
fn latency_table_is_perftests_byte_for_byte() {
    let text = lat_table(&[known_latency(64), known_latency(8 << 20)]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert_eq!(lines[1], PERFTEST_LAT_HEADER);
    assert_eq!(lines[2], PERFTEST_LAT_LINE);
    // perftest's columns: $3 t_min, $4 t_max, $5 t_typical, $6 t_avg,
    // $7 t_stdev, $8 99%, $9 99.9%.
    assert_eq!(
        lines[3].split_whitespace().collect::<Vec<_>>(),
        [
            "8388608", "1000", "0.00", "1.00", "0.50", "0.50", "0.29", "0.99", "1.00"
        ]
    );
}

#[test]
fn streamed_lines_match_the_whole_table() {
    let rows = sweep();
    let mut streamed = format!("{RULE}\n{}\n", bw_header(BwUnit::MBps));
    for r in &rows {
        streamed.push_str(&bw_line(r, BwUnit::MBps));
        streamed.push('\n');
    }
    streamed.push_str(RULE);
    streamed.push('\n');
    assert_eq!(streamed, bw_table(&rows, BwUnit::MBps));
    let mut streamed = format!("{RULE}\n{}\n", lat_header());
    streamed.push_str(&lat_line(&known_latency(2)));
    streamed.push('\n');
    streamed.push_str(RULE);
    streamed.push('\n');
    assert_eq!(streamed, lat_table(&[known_latency(2)]));
}

#[test]
fn latency_figures_of_a_known_histogram() {
    let row = known_latency(64);
    assert_eq!(row.bytes, 64);
    assert_eq!(row.iterations, 1000);
    assert_eq!(row.t_min_us, 0.001);
    assert_eq!(row.t_typical_us, 0.5);
    assert!((row.t_avg_us - 0.5005).abs() < 1e-9, "{}", row.t_avg_us);
    assert_eq!(row.p99_us, 0.99);
    assert_eq!(row.p99_9_us, 0.999);
    assert_eq!(row.t_max_us, 1.0);
    // Uniform 1..=1000: stdev = sqrt((n² - 1) / 12) ns.
    let stdev_ns = ((1000.0f64 * 1000.0 - 1.0) / 12.0).sqrt();
    assert!((row.t_stdev_us * 1000.0 - stdev_ns).abs() < 0.01);

    // The distribution climbs from the minimum to the maximum, quantiles
    // and latencies both non-decreasing.
    let d = &row.distribution;
    assert!(d.len() > 10, "{d:?}");
    assert_eq!(d.first().unwrap().usec, 0.001);
    assert_eq!(d.last().unwrap().usec, 1.0);
    assert_eq!(d.last().unwrap().quantile, 1.0);
    for w in d.windows(2) {
        assert!(
            w[0].quantile <= w[1].quantile && w[0].usec <= w[1].usec,
            "{w:?}"
        );
    }
    // Each point agrees with the histogram's own quantile: at quantile q,
    // ceil(q * 1000) samples lie at or below the latency.
    for p in d {
        let ns = (p.usec * 1000.0).round();
        assert!(ns >= (p.quantile * 1000.0).floor(), "{p:?}");
    }
}

#[test]
fn skewed_histogram_tail() {
    // 990 fast samples at 1 µs, 9 at 50 µs, 1 at 2 ms.
    let mut hist = new_histogram();
    hist.record_n(1000, 990).unwrap();
    hist.record_n(50_000, 9).unwrap();
    hist.record(2_000_000).unwrap();
    let row = LatRow::from_histogram(64, &hist);
    assert_eq!(row.t_typical_us, 1.0);
    assert_eq!(row.p99_us, 1.0);
    // 3 significant digits: 50 µs is reported as the top of its bucket.
    assert!((row.p99_9_us - 50.0).abs() <= 0.05, "{}", row.p99_9_us);
    assert!((row.t_max_us - 2000.0).abs() <= 2.0, "{}", row.t_max_us);
    let avg = (990.0 * 1.0 + 9.0 * 50.0 + 2000.0) / 1000.0;
    assert!((row.t_avg_us - avg).abs() < 0.01, "{}", row.t_avg_us);
}

#[test]
fn empty_histogram_gives_zeros() {
    let row = LatRow::from_histogram(64, &new_histogram());
    assert_eq!(row.iterations, 0);
    assert_eq!(row.t_max_us, 0.0);
    assert!(row.distribution.is_empty());
}

#[test]
fn bandwidth_figures() {
    let row = BwRow::new(1 << 20, 1000, Duration::from_millis(100));
    assert!((row.gb_per_s - 10.48576).abs() < 1e-9);
    assert!((row.mpps - 0.01).abs() < 1e-12);
    assert_eq!(row.seconds, 0.1);
    let zero = BwRow::new(64, 10, Duration::ZERO);
    assert_eq!((zero.gb_per_s, zero.mpps), (0.0, 0.0));
}

fn full_report() -> Report {
    let mut report = Report::new("ntb-perf");
    report
        .param("test", "bw")
        .param("op", "write")
        .param("burst", 32);
    report.bandwidth = sweep();
    report.latency = vec![known_latency(2), known_latency(64), known_latency(4096)];
    report
}

#[test]
fn json_round_trip_keeps_every_figure() {
    let report = full_report();
    let text = report.to_json().unwrap();
    let back = Report::from_json(&text).unwrap();
    assert_eq!(back, report);

    // The figures are there by name, for other tools to read.
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["tool"], "ntb-perf");
    assert_eq!(v["params"]["burst"], 32, "numbers stay numbers");
    assert_eq!(v["schema"], ntbdk_apps::report::SCHEMA_VERSION);
    assert_eq!(v["ntbdk_version"], env!("CARGO_PKG_VERSION"));
    assert!(v["command_line"][0].is_string(), "{v:#}");
    for (field, unit) in ntbdk_apps::report::UNITS {
        assert_eq!(v["units"][field], *unit);
    }
    assert_eq!(v["bandwidth"].as_array().unwrap().len(), 23);
    assert_eq!(v["bandwidth"][15]["bytes"], 65536);
    assert_eq!(v["latency"][1]["p99_us"], 0.99);
    assert_eq!(v["latency"][1]["t_typical_us"], 0.5);
    assert!(v["latency"][1]["distribution"].as_array().unwrap().len() > 10);

    // And through a file.
    let dir = TempDir::new("json");
    let path = dir.0.join("report.json");
    report.write_json(&path).unwrap();
    assert_eq!(Report::read_json(&path).unwrap(), report);
}

#[test]
fn json_errors_say_what_failed() {
    let err = Report::from_json("{\"tool\": 3}").unwrap_err();
    assert!(err.to_string().contains("invalid report JSON"), "{err}");
    let err = Report::read_json(std::path::Path::new("/nonexistent/ntbdk/report.json"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot read /nonexistent/ntbdk/report.json"),
        "{err}"
    );
}

/// Parses `svg` as XML and returns how many data series (polylines of class
/// `series`) it holds.
fn series_in(svg: &str) -> usize {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert!(root.attribute("width").is_some() && root.attribute("height").is_some());
    root.descendants()
        .filter(|n| n.tag_name().name() == "polyline" && n.attribute("class") == Some("series"))
        .count()
}

/// The elements of class `class` (`series` polylines, `band` polygons).
fn count_class(svg: &str, tag: &str, class: &str) -> usize {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
    doc.descendants()
        .filter(|n| n.tag_name().name() == tag && n.attribute("class") == Some(class))
        .count()
}

/// Every text of the document, trimmed.
fn texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
    doc.descendants()
        .filter(|n| n.tag_name().name() == "text")
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect()
}

#[test]
fn sweep_plots_bandwidth_rate_and_latency_against_size() {
    let mut report = full_report();
    report.param("post_list", 1).param("tx_depth", 128);
    let svg = render_svg(&report).unwrap();
    // Bandwidth, message rate, and latency's median, 99% and 99.9% lines,
    // with a band between each pair.
    assert_eq!(series_in(&svg), 1 + 1 + 3);
    assert_eq!(count_class(&svg, "polygon", "band"), 2);
    let t = texts(&svg);
    let has = |s: &str| t.iter().any(|x| x == s);
    for title in [
        "ntb-perf: write bw",
        "bandwidth vs message size",
        "message rate vs message size",
        "latency vs message size",
        "BW average [GB/s]",
        "MsgRate [Mpps]",
        "latency [usec]",
        "median (t_typical)",
        "99% percentile",
        "99.9% percentile",
    ] {
        assert!(has(title), "no text {title:?} in {t:?}");
    }
    // Log axes: size labels by powers of two, value labels by decades.
    assert!(has("1K") && has("4M"), "size labels: {t:?}");
    assert!(has("0.1") && has("1") && has("10"), "decade labels: {t:?}");
    // The run's parameters, typed numbers included, in the subtitle.
    let subtitle = t
        .iter()
        .find(|x| x.contains("op=write"))
        .expect("a subtitle");
    assert!(subtitle.contains("post_list=1"), "{subtitle}");
    assert!(t.iter().any(|x| x.contains("tx_depth=128")), "{t:?}");
    // No percentile plot for a sweep.
    assert!(
        !t.iter().any(|x| x.starts_with("latency distribution")),
        "{t:?}"
    );

    // A size without samples is not drawn, and is named.
    let mut gap = report.clone();
    gap.latency[1] = LatRow::from_histogram(64, &new_histogram());
    let svg = render_svg(&gap).unwrap();
    assert_eq!(series_in(&svg), 5);
    assert!(
        texts(&svg)
            .iter()
            .any(|x| x == "no samples (not drawn): 64 B"),
        "{:?}",
        texts(&svg)
    );

    let dir = TempDir::new("svg");
    let path = dir.0.join("plot.svg");
    write_svg(&report, &path).unwrap();
    assert_eq!(series_in(&std::fs::read_to_string(&path).unwrap()), 5);
}

#[test]
fn one_size_gets_the_percentile_plot() {
    let mut report = full_report();
    report.bandwidth.clear();
    report.latency.truncate(1);
    let svg = render_svg(&report).unwrap();
    assert_eq!(series_in(&svg), 1);
    assert_eq!(count_class(&svg, "polygon", "band"), 0);
    let t = texts(&svg);
    assert!(t.iter().any(|x| x == "latency distribution, 2 B"), "{t:?}");
    assert!(t.iter().any(|x| x == "99.9%"), "percentile axis: {t:?}");

    // Bandwidth alone: its two panels.
    let mut bw_only = full_report();
    bw_only.latency.clear();
    assert_eq!(series_in(&render_svg(&bw_only).unwrap()), 2);

    // One size of each: bandwidth, rate (one-point curves), percentiles.
    let mut one = full_report();
    one.bandwidth.truncate(1);
    one.latency.truncate(1);
    assert_eq!(series_in(&render_svg(&one).unwrap()), 3);
}

#[test]
fn svg_of_nothing_is_an_error() {
    let mut report = full_report();
    report.bandwidth.clear();
    report.latency.clear();
    let err = render_svg(&report).unwrap_err();
    assert!(err.to_string().contains("no rows"), "{err}");
}

#[test]
fn progress_draws_and_clears_its_line() {
    let mut p = Progress::with_writer("write bw", 12, Vec::new(), Duration::ZERO);
    p.step("2 B");
    p.step("4 B");
    let out = String::from_utf8(p.finish().unwrap()).unwrap();
    assert!(out.contains("write bw [ 1/12] 2 B ("), "{out:?}");
    assert!(out.contains("write bw [ 2/12] 4 B ("), "{out:?}");
    assert!(out.ends_with("\r\x1b[K"), "cleared at the end: {out:?}");

    // Cleared before a row is printed, drawn again at the next step; a
    // clear with nothing drawn writes nothing.
    let mut p = Progress::with_writer("lat", 2, Vec::new(), Duration::ZERO);
    p.step("2 B");
    p.clear();
    p.clear();
    p.step("4 B");
    let out = String::from_utf8(p.finish().unwrap()).unwrap();
    assert_eq!(out.matches("\r\x1b[K").count(), 4, "{out:?}");
    assert!(out.contains(" s)\r\x1b[K\r\x1b[Klat [2/2]"), "{out:?}");

    // Before its delay it draws nothing at all.
    let mut quiet = Progress::with_writer("lat", 3, Vec::new(), Duration::from_secs(3600));
    quiet.step("64 B");
    assert!(quiet.finish().unwrap().is_empty());

    assert_eq!(
        progress_line("lat", 3, 23, "4096 B", Duration::from_millis(2500)),
        "lat [ 3/23] 4096 B (2.5 s)"
    );
}

/// A directory removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("ntbdk-report-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_peak_below_the_average_is_raised_to_it() {
    // 1 MB in 1 ms is 1 GB/s; a window-measured peak of 0.9 cannot be right.
    let row = BwRow::new(1000, 1000, Duration::from_millis(1)).with_peak(0.9);
    assert!((row.gb_per_s - 1.0).abs() < 1e-9, "{row:?}");
    assert_eq!(row.peak_gb_per_s, row.gb_per_s);
    let row = BwRow::new(1000, 1000, Duration::from_millis(1)).with_peak(1.5);
    assert_eq!(row.peak_gb_per_s, 1.5);
}
