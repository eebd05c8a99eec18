//! The error type of the bench harness.

use std::path::PathBuf;

/// What can go wrong while measuring, reading or comparing reports.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Timings or figures that cannot be summarised (empty, NaN).
    #[error("invalid samples: {0}")]
    InvalidSamples(String),
    /// A setting that cannot produce a measurement (zero runs, zero tokens, ...).
    #[error("invalid bench settings: {0}")]
    InvalidSettings(String),
    /// Reading a file the bench needs failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A report file is not a valid ember bench report.
    #[error("{path} is not an ember bench report: {source}")]
    ReportFormat {
        /// The file.
        path: PathBuf,
        /// Where and why parsing failed.
        source: serde_json::Error,
    },
    /// Two reports measure different things (a model bench against a kernel suite, ...).
    #[error("cannot compare a `{old}` report with a `{new}` report")]
    KindMismatch {
        /// Kind of the old report.
        old: &'static str,
        /// Kind of the new report.
        new: &'static str,
    },
    /// The workload under measurement failed.
    #[error("workload failed: {0}")]
    Workload(String),
}
