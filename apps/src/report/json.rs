//! The whole report of a run, and its JSON form (`--json FILE`).
//!
//! The form is versioned ([`SCHEMA_VERSION`]); every report names the
//! ntbdk version that wrote it, the command line, its parameters as typed
//! JSON values (numbers as numbers, absent limits as `null`) and the unit
//! of every figure ([`UNITS`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::ReportError;
use super::figures::{BwRow, LatRow};

/// The version of the JSON form [`Report`] writes. 2: `schema`,
/// `ntbdk_version`, `command_line`, `units` added, parameters typed (1 had
/// strings only and no version field).
pub const SCHEMA_VERSION: u32 = 2;

/// The unit of every figure of a report, by field (`bandwidth.*` for
/// [`BwRow`], `latency.*` for [`LatRow`]); written into every report.
pub const UNITS: &[(&str, &str)] = &[
    ("unix_time", "s since 1970-01-01 UTC"),
    ("bandwidth.bytes", "B (message size)"),
    ("bandwidth.iterations", "messages"),
    ("bandwidth.seconds", "s"),
    ("bandwidth.gb_per_s", "GB/s (10^9 B/s)"),
    ("bandwidth.peak_gb_per_s", "GB/s (10^9 B/s)"),
    ("bandwidth.mpps", "Mpps (10^6 messages/s)"),
    ("latency.bytes", "B (message size)"),
    ("latency.iterations", "samples"),
    ("latency.*_us", "us (microseconds)"),
    ("latency.distribution.quantile", "fraction, 0 to 1"),
    ("latency.distribution.usec", "us (microseconds)"),
];

/// Every figure of one run of an app: what ran, where, with which
/// parameters, and its bandwidth and latency rows.
///
/// ```
/// use std::time::Duration;
/// use ntbdk_apps::report::{BwRow, Report, SCHEMA_VERSION};
///
/// let mut report = Report::new("ntb-perf");
/// report.param("op", "write").param("post_list", 8);
/// report.bandwidth.push(BwRow::new(4096, 1000, Duration::from_millis(1)));
/// let text = report.to_json().unwrap();
/// let back = Report::from_json(&text).unwrap();
/// assert_eq!(back, report);
/// assert_eq!(back.schema, SCHEMA_VERSION);
/// assert_eq!(back.params["post_list"], 8);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The version of this JSON form ([`SCHEMA_VERSION`]).
    pub schema: u32,
    /// The ntbdk version that wrote the report.
    pub ntbdk_version: String,
    /// The app that measured (`ntb-perf`, `ntb-pingpong`, …).
    pub tool: String,
    /// The command line, program name first.
    pub command_line: Vec<String>,
    /// When the report was created, seconds since the Unix epoch.
    pub unix_time: u64,
    /// The machine it ran on (CPU model, online CPUs, kernel).
    pub machine: String,
    /// The run's parameters (test, op, post list, cores, …) as typed
    /// values: numbers are numbers, a limit not set is `null`.
    pub params: BTreeMap<String, Value>,
    /// The unit of each figure, by field ([`UNITS`]).
    pub units: BTreeMap<String, String>,
    /// Bandwidth rows, by message size.
    pub bandwidth: Vec<BwRow>,
    /// Latency rows, by message size.
    pub latency: Vec<LatRow>,
}

impl Report {
    /// An empty report of `tool`, stamped with the version, this process's
    /// command line, the time and this machine.
    pub fn new(tool: &str) -> Self {
        Self {
            schema: SCHEMA_VERSION,
            ntbdk_version: env!("CARGO_PKG_VERSION").to_string(),
            tool: tool.to_string(),
            command_line: std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            unix_time: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            machine: describe_machine(),
            params: BTreeMap::new(),
            units: UNITS
                .iter()
                .map(|&(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            bandwidth: Vec::new(),
            latency: Vec::new(),
        }
    }

    /// Records a parameter of the run, as a typed value (a number stays a
    /// number; `Option::None` is `null`).
    pub fn param(&mut self, key: &str, value: impl Into<Value>) -> &mut Self {
        self.params.insert(key.to_string(), value.into());
        self
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> Result<String, ReportError> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Parses a report written by [`to_json`](Self::to_json).
    pub fn from_json(text: &str) -> Result<Self, ReportError> {
        Ok(serde_json::from_str(text)?)
    }

    /// Writes the report as JSON to `path` (the `--json FILE` option).
    pub fn write_json(&self, path: &Path) -> Result<(), ReportError> {
        let mut text = self.to_json()?;
        text.push('\n');
        std::fs::write(path, text).map_err(|source| ReportError::Io {
            action: "write",
            path: path.to_path_buf(),
            source,
        })
    }

    /// Reads a report written by [`write_json`](Self::write_json).
    pub fn read_json(path: &Path) -> Result<Self, ReportError> {
        let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io {
            action: "read",
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text)
    }
}

/// A one-line description of this machine: CPU model, online CPUs, kernel.
pub fn describe_machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    // Online CPUs, not this process's affinity (which pinning narrows).
    let cores = std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.lines().filter(|l| l.starts_with("processor")).count())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!("{cpu}, {cores} online CPUs, Linux {kernel}")
}
