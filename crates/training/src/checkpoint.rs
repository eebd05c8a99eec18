//! Checkpoint directories, written atomically.
//!
//! A checkpoint is a directory: the model (in whatever layout the caller's [`ModelStore`](crate::ModelStore)
//! writes), `optimizer.safetensors` ([`AdamW::save`](crate::AdamW::save)) and `trainer_state.json`
//! ([`TrainerState`]). It is first written to a sibling temporary directory and then renamed into place; a
//! previous checkpoint is moved aside first and removed last, so at any moment either the old or the new complete
//! checkpoint exists under the final name or under `<name>.old`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::TrainError;

/// File name of the trainer state inside a checkpoint directory.
pub const TRAINER_STATE_FILE: &str = "trainer_state.json";
/// File name of the optimizer state inside a checkpoint directory.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";

/// Everything besides model and optimizer needed to continue a run exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimiser steps completed (the schedule's next step).
    pub step: usize,
    /// Training tokens consumed so far.
    pub tokens_seen: u64,
    /// Best validation loss so far.
    pub best_val_loss: Option<f64>,
    /// Validation passes since the best one (for early stopping).
    pub evals_since_best: usize,
    /// Wall-clock seconds of training so far, across resumes.
    pub elapsed_s: f64,
    /// The data source's position, including its random generator ([`TrainData::state`](crate::TrainData::state)).
    pub data: serde_json::Value,
    /// The run configuration the run was started with, for the record.
    pub config: serde_json::Value,
}

impl TrainerState {
    /// Reads `trainer_state.json` from a checkpoint directory.
    pub fn load(dir: &Path) -> Result<Self, TrainError> {
        let path = dir.join(TRAINER_STATE_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| TrainError::io(&path, e))?;
        let state: Self = serde_json::from_str(&text).map_err(|e| TrainError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        state
            .check()
            .map_err(|message| TrainError::Json { path, message })?;
        Ok(state)
    }

    /// Range checks of values a resumed run counts on from: far beyond any real run, and leaving room to keep
    /// counting (a step count of `usize::MAX` would overflow at the next step, an elapsed time of 1e300 s would
    /// not convert to a `Duration`).
    fn check(&self) -> Result<(), String> {
        const MAX_COUNT: u64 = u32::MAX as u64;
        const MAX_TOKENS: u64 = 1 << 62;
        const MAX_ELAPSED_S: f64 = 1e10;
        let counts = [
            ("step", self.step as u64),
            ("evals_since_best", self.evals_since_best as u64),
        ];
        for (field, value) in counts {
            if value > MAX_COUNT {
                return Err(format!(
                    "`{field}` is {value}: expected at most {MAX_COUNT}"
                ));
            }
        }
        if self.tokens_seen > MAX_TOKENS {
            return Err(format!(
                "`tokens_seen` is {}: expected at most {MAX_TOKENS}",
                self.tokens_seen
            ));
        }
        if !(0.0..=MAX_ELAPSED_S).contains(&self.elapsed_s) {
            return Err(format!(
                "`elapsed_s` is {}: expected seconds in 0..={MAX_ELAPSED_S}",
                self.elapsed_s
            ));
        }
        if let Some(loss) = self.best_val_loss.filter(|l| !l.is_finite()) {
            return Err(format!("`best_val_loss` is {loss}: expected a finite loss"));
        }
        Ok(())
    }

    /// Writes `trainer_state.json` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), TrainError> {
        let path = dir.join(TRAINER_STATE_FILE);
        let text = serde_json::to_string_pretty(self).map_err(|e| TrainError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        std::fs::write(&path, text).map_err(|e| TrainError::io(&path, e))
    }
}

/// Writes a checkpoint to `dir` atomically: `fill` writes the files into a fresh temporary directory, which then
/// replaces `dir`. If `fill` fails, `dir` is untouched and the temporary directory is removed.
pub fn write_atomically(
    dir: &Path,
    fill: impl FnOnce(&Path) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    let tmp = sibling(dir, "tmp");
    let old = sibling(dir, "old");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    if let Err(error) = fill(&tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(error);
    }
    if dir.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| TrainError::io(&old, e))?;
        }
        std::fs::rename(dir, &old).map_err(|e| TrainError::io(dir, e))?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| TrainError::io(dir, e))?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| TrainError::io(&old, e))?;
    }
    Ok(())
}

/// The checkpoint directory to read for `dir`: `dir` itself, or `<dir>.old` when a crash interrupted the swap in
/// [`write_atomically`] between its two renames.
pub fn resolve_checkpoint(dir: &Path) -> Option<PathBuf> {
    if dir.join(TRAINER_STATE_FILE).exists() {
        return Some(dir.to_path_buf());
    }
    let old = sibling(dir, "old");
    old.join(TRAINER_STATE_FILE).exists().then_some(old)
}

fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".{suffix}"));
    dir.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(step: usize) -> TrainerState {
        TrainerState {
            step,
            tokens_seen: 42,
            best_val_loss: Some(1.5),
            evals_since_best: 0,
            elapsed_s: 3.0,
            data: serde_json::json!({"word_pos": 7}),
            config: serde_json::json!({"name": "x"}),
        }
    }

    #[test]
    fn a_checkpoint_replaces_the_previous_one_and_leaves_no_temporaries() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("last");
        write_atomically(&dir, |d| state(1).save(d)).unwrap();
        write_atomically(&dir, |d| state(2).save(d)).unwrap();
        assert_eq!(TrainerState::load(&dir).unwrap(), state(2));
        let names: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["last"]);
    }

    #[test]
    fn a_failed_write_keeps_the_previous_checkpoint() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("last");
        write_atomically(&dir, |d| state(1).save(d)).unwrap();
        let failed = write_atomically(&dir, |d| {
            state(2).save(d)?;
            Err(TrainError::External {
                context: "saving the model".into(),
                source: "disk full".into(),
            })
        });
        assert!(failed.is_err());
        assert_eq!(TrainerState::load(&dir).unwrap(), state(1));
        assert!(!root.path().join("last.tmp").exists());
    }

    #[test]
    fn an_interrupted_swap_is_recovered_from_the_old_directory() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("last");
        write_atomically(&dir, |d| state(1).save(d)).unwrap();
        // Simulate a crash after the first rename of a second write: only `last.old` holds a checkpoint.
        std::fs::rename(&dir, root.path().join("last.old")).unwrap();
        assert_eq!(resolve_checkpoint(&dir), Some(root.path().join("last.old")));
        assert_eq!(resolve_checkpoint(&root.path().join("missing")), None);
    }
}
