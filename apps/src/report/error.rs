//! What can go wrong while saving a report.

use std::path::PathBuf;

/// An error writing or reading a report file.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The file could not be created, written or read.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done (`write`, `read`).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The JSON was not a report (or a report could not be encoded).
    #[error("invalid report JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The plot could not be drawn.
    #[error("cannot draw the plot: {0}")]
    Plot(String),
}
