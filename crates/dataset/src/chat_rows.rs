//! Prepared chat fine-tuning rows (`ember prepare --format chat`): each conversation already rendered, tokenized
//! and padded to one row of `width` ids, untrained ids flagged with [`crate::NO_LOSS`], so a large chat corpus is
//! tokenized once rather than at the start of every run.
//!
//! A directory holds `chat_rows.json` (the manifest: format, row width, row counts, the tokenizer's fingerprint)
//! and `chat_rows.bin` (every row's ids as little-endian u32, the training rows then the validation rows). Both are
//! written atomically, the manifest last, so a directory with a manifest is complete.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{DatasetError, Result};

/// The manifest's file name; a directory holding it is a prepared chat corpus.
pub const CHAT_ROWS_MANIFEST: &str = "chat_rows.json";
const ROWS_FILE: &str = "chat_rows.bin";
const FORMAT: &str = "ember-chat-rows-v1";

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: String,
    width: usize,
    train_rows: usize,
    val_rows: usize,
    tokenizer: String,
}

/// Training and validation rows of a chat corpus, and the tokenizer they were made with.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRows {
    /// Ids per row (`model.block_size + 1`).
    pub width: usize,
    /// [`crate::fingerprint_path`] of the tokenizer (the model) that encoded them.
    pub tokenizer: String,
    /// Rows to train on.
    pub train: Vec<Vec<u32>>,
    /// Held-out rows.
    pub val: Vec<Vec<u32>>,
}

impl ChatRows {
    /// Whether `dir` holds prepared chat rows.
    pub fn is_prepared(dir: &Path) -> bool {
        dir.join(CHAT_ROWS_MANIFEST).is_file()
    }

    /// Writes the rows into `dir` (created if missing), replacing an earlier preparation there.
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| DatasetError::io(dir, e))?;
        if let Some(row) = self
            .train
            .iter()
            .chain(&self.val)
            .find(|r| r.len() != self.width)
        {
            return Err(DatasetError::InvalidOption(format!(
                "chat rows: a row of {} ids in rows of width {}",
                row.len(),
                self.width
            )));
        }
        let mut bytes = Vec::with_capacity((self.train.len() + self.val.len()) * self.width * 4);
        for id in self.train.iter().chain(&self.val).flatten() {
            bytes.extend_from_slice(&id.to_le_bytes());
        }
        write_atomic(&dir.join(ROWS_FILE), &bytes)?;
        let manifest = Manifest {
            format: FORMAT.to_string(),
            width: self.width,
            train_rows: self.train.len(),
            val_rows: self.val.len(),
            tokenizer: self.tokenizer.clone(),
        };
        let path = dir.join(CHAT_ROWS_MANIFEST);
        let text = serde_json::to_string_pretty(&manifest).map_err(|e| DatasetError::Manifest {
            path: path.clone(),
            message: e.to_string(),
        })?;
        write_atomic(&path, text.as_bytes())
    }

    /// Reads the rows of `dir`; a manifest that does not match its rows file is an error naming both, checked
    /// before anything is allocated by the manifest's counts.
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(CHAT_ROWS_MANIFEST);
        let bad = |message: String| DatasetError::Manifest {
            path: path.clone(),
            message,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| DatasetError::io(&path, e))?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if m.format != FORMAT {
            return Err(bad(format!("format `{}`, expected `{FORMAT}`", m.format)));
        }
        if m.width < 2 {
            return Err(bad(format!("width {}, expected at least 2", m.width)));
        }
        let rows_path = dir.join(ROWS_FILE);
        let len = std::fs::metadata(&rows_path)
            .map_err(|e| DatasetError::io(&rows_path, e))?
            .len();
        let expected = m
            .train_rows
            .checked_add(m.val_rows)
            .and_then(|rows| rows.checked_mul(m.width))
            .and_then(|ids| ids.checked_mul(4))
            .ok_or_else(|| bad("row counts overflow".into()))?;
        if len != expected as u64 {
            return Err(bad(format!(
                "{} + {} rows of {} ids need {expected} bytes in {ROWS_FILE}, which has {len}",
                m.train_rows, m.val_rows, m.width
            )));
        }
        let bytes = std::fs::read(&rows_path).map_err(|e| DatasetError::io(&rows_path, e))?;
        let mut rows = bytes.chunks_exact(m.width * 4).map(|row| {
            row.chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect::<Vec<u32>>()
        });
        let train = rows.by_ref().take(m.train_rows).collect();
        let val = rows.collect();
        Ok(Self {
            width: m.width,
            tokenizer: m.tokenizer,
            train,
            val,
        })
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let temp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    std::fs::write(&temp, bytes).map_err(|e| DatasetError::io(&temp, e))?;
    std::fs::rename(&temp, path).map_err(|e| DatasetError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> ChatRows {
        ChatRows {
            width: 3,
            tokenizer: "abc".into(),
            train: vec![vec![1, 2, crate::NO_LOSS | 3], vec![4, 5, 6]],
            val: vec![vec![7, 8, 9]],
        }
    }

    #[test]
    fn rows_round_trip_and_a_truncated_or_lying_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!ChatRows::is_prepared(dir.path()));
        rows().save(dir.path()).unwrap();
        assert!(ChatRows::is_prepared(dir.path()));
        assert_eq!(ChatRows::open(dir.path()).unwrap(), rows());

        let bin = dir.path().join(ROWS_FILE);
        let full = std::fs::read(&bin).unwrap();
        std::fs::write(&bin, &full[..full.len() - 4]).unwrap();
        let e = ChatRows::open(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(CHAT_ROWS_MANIFEST) && e.contains("36 bytes"),
            "{e}"
        );

        // A manifest claiming an absurd count is refused by the size check, not by an allocation.
        let manifest = dir.path().join(CHAT_ROWS_MANIFEST);
        let text = std::fs::read_to_string(&manifest).unwrap();
        std::fs::write(
            &manifest,
            text.replace("\"train_rows\": 2", "\"train_rows\": 18446744073709551615"),
        )
        .unwrap();
        let e = ChatRows::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("overflow"), "{e}");
    }
}
