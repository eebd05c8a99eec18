//! The metrics log: `metrics.jsonl`, one JSON object per line.
//!
//! Training lines carry `step`, `loss`, `lr`, `grad_norm`, `tokens_per_sec`, `elapsed_s` and `peak_rss_mib`;
//! validation lines carry `step`, `val_loss`, `val_bpb` and `val_ppl`. Absent fields are omitted, so each line
//! only says what was measured.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::TrainError;

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsRecord {
    /// Optimiser steps completed when the line was written.
    pub step: usize,
    /// Mean training loss (nats per token) of the step's micro-batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Learning rate used for the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Global gradient norm before clipping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f64>,
    /// Training throughput since the previous log line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_sec: Option<f64>,
    /// Wall-clock seconds of training so far (across resumes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_s: Option<f64>,
    /// Peak resident memory of the process so far in MiB (Linux `VmHWM`; absent where the system does not
    /// report it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_mib: Option<f64>,
    /// Mean validation loss (nats per token) over the fixed validation windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// Validation loss in bits per byte of text: comparable across tokenizers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_bpb: Option<f64>,
    /// Validation perplexity, `exp(val_loss)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_ppl: Option<f64>,
}

/// Appends records to a `metrics.jsonl` file, flushing each line so a crash loses nothing already logged.
pub struct MetricsLog {
    path: PathBuf,
    writer: BufWriter<File>,
}

impl MetricsLog {
    /// Opens `path` for appending, first dropping lines with `step > keep_up_to`: after a resume from step k, lines
    /// logged past k by the interrupted run are replaced by the resumed run's. `keep_up_to = 0` starts afresh.
    pub fn open(path: &Path, keep_up_to: usize) -> Result<Self, TrainError> {
        let kept: Vec<MetricsRecord> = if keep_up_to > 0 && path.exists() {
            read_metrics(path)?
                .into_iter()
                .filter(|r| r.step <= keep_up_to)
                .collect()
        } else {
            Vec::new()
        };
        let file = File::create(path).map_err(|e| TrainError::io(path, e))?;
        let mut log = MetricsLog {
            path: path.to_path_buf(),
            writer: BufWriter::new(file),
        };
        for record in &kept {
            log.append(record)?;
        }
        Ok(log)
    }

    /// Writes one line and flushes it.
    pub fn append(&mut self, record: &MetricsRecord) -> Result<(), TrainError> {
        let line = serde_json::to_string(record).map_err(|e| TrainError::Json {
            path: self.path.clone(),
            message: e.to_string(),
        })?;
        writeln!(self.writer, "{line}")
            .and_then(|_| self.writer.flush())
            .map_err(|e| TrainError::io(&self.path, e))
    }
}

/// Reads every record of a `metrics.jsonl` file; a malformed line is an error naming its line number.
pub fn read_metrics(path: &Path) -> Result<Vec<MetricsRecord>, TrainError> {
    let file = File::open(path).map_err(|e| TrainError::io(path, e))?;
    let mut records = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| TrainError::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(&line).map_err(|e| TrainError::Json {
            path: path.to_path_buf(),
            message: format!("line {}: {e}", i + 1),
        })?;
        records.push(record);
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_lines_round_trip_and_omit_training_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let train = MetricsRecord {
            step: 10,
            loss: Some(3.5),
            lr: Some(1e-3),
            ..Default::default()
        };
        let val = MetricsRecord {
            step: 10,
            val_loss: Some(3.0),
            val_bpb: Some(1.2),
            val_ppl: Some(3f64.exp()),
            ..Default::default()
        };
        let mut log = MetricsLog::open(&path, 0).unwrap();
        log.append(&train).unwrap();
        log.append(&val).unwrap();
        drop(log);
        let text = std::fs::read_to_string(&path).unwrap();
        let second: serde_json::Value = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
        let keys: Vec<&str> = second
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["step", "val_bpb", "val_loss", "val_ppl"]);
        assert_eq!(read_metrics(&path).unwrap(), vec![train, val]);
    }

    #[test]
    fn reopening_for_a_resume_drops_lines_past_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut log = MetricsLog::open(&path, 0).unwrap();
        for step in [10, 20, 30] {
            log.append(&MetricsRecord {
                step,
                loss: Some(1.0),
                ..Default::default()
            })
            .unwrap();
        }
        drop(log);
        let log = MetricsLog::open(&path, 20).unwrap();
        drop(log);
        let steps: Vec<usize> = read_metrics(&path)
            .unwrap()
            .iter()
            .map(|r| r.step)
            .collect();
        assert_eq!(steps, [10, 20]);
    }

    #[test]
    fn a_malformed_line_is_reported_with_its_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        std::fs::write(&path, "{\"step\":1}\nnot json\n").unwrap();
        let err = read_metrics(&path).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
    }
}
