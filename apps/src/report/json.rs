//! The whole report of a run, and its JSON form (`--json FILE`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::error::ReportError;
use super::figures::{BwRow, LatRow};

/// Every figure of one run of an app: what ran, where, with which
/// parameters, and its bandwidth and latency rows.
///
/// ```
/// use std::time::Duration;
/// use ntbdk_apps::report::{BwRow, Report};
///
/// let mut report = Report::new("ntb-perf");
/// report.param("op", "write");
/// report.bandwidth.push(BwRow::new(4096, 1000, Duration::from_millis(1)));
/// let text = report.to_json().unwrap();
/// assert_eq!(Report::from_json(&text).unwrap(), report);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The app that measured (`ntb-perf`, `ntb-pingpong`, …).
    pub tool: String,
    /// When the report was created, seconds since the Unix epoch.
    pub unix_time: u64,
    /// The machine it ran on (CPU model, online CPUs, kernel).
    pub machine: String,
    /// The run's parameters (test, op, burst, cores, …), as given.
    pub params: BTreeMap<String, String>,
    /// Bandwidth rows, by message size.
    pub bandwidth: Vec<BwRow>,
    /// Latency rows, by message size.
    pub latency: Vec<LatRow>,
}

impl Report {
    /// An empty report of `tool`, stamped with the time and this machine.
    pub fn new(tool: &str) -> Self {
        Self {
            tool: tool.to_string(),
            unix_time: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            machine: describe_machine(),
            params: BTreeMap::new(),
            bandwidth: Vec::new(),
            latency: Vec::new(),
        }
    }

    /// Records a parameter of the run.
    pub fn param(&mut self, key: &str, value: impl ToString) -> &mut Self {
        self.params.insert(key.to_string(), value.to_string());
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
