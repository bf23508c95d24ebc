//! What the apps print and save: perftest-style tables, JSON, SVG plots and a
//! progress line.
//!
//! A run collects [`BwRow`]s (messages of a size moved in a time) and
//! [`LatRow`]s (summaries of an HDR histogram of nanoseconds) into a
//! [`Report`]; [`bw_table`] and [`lat_table`] print them as `ib_write_bw`
//! and `ib_write_lat` do, column for column, [`Report::write_json`] saves every figure
//! (`--json FILE`) and [`write_svg`] draws them (`--plot FILE.svg`).
//!
//! ```
//! use std::time::Duration;
//! use ntbdk_apps::report::{BwRow, BwUnit, LatRow, Report, bw_table, lat_table, new_histogram};
//!
//! let mut report = Report::new("ntb-perf");
//! report.bandwidth.push(BwRow::new(65536, 1000, Duration::from_millis(10)));
//! let mut hist = new_histogram();
//! for ns in [900, 1000, 1100] {
//!     hist.record(ns).unwrap();
//! }
//! report.latency.push(LatRow::from_histogram(64, &hist));
//! print!("{}", bw_table(&report.bandwidth, BwUnit::MBps));
//! print!("{}", lat_table(&report.latency));
//! ```

mod error;
mod figures;
mod json;
mod plot;
mod progress;
mod table;

pub use error::ReportError;
pub use figures::{BwRow, LatRow, Percentile, new_histogram};
pub use json::{Report, SCHEMA_VERSION, UNITS, describe_machine};
pub use plot::{render_svg, write_svg};
pub use progress::{Progress, SHOW_AFTER, progress_line};
pub use table::{BwUnit, RULE, bw_header, bw_line, bw_table, lat_header, lat_line, lat_table};
