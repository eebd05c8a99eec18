//! Errors of the training crate.

use std::path::PathBuf;

use crate::model_io::BoxError;

/// Everything that can stop training or its bookkeeping (checkpoints, metrics, plots).
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A JSON file (training state, metrics line) is malformed or has unexpected fields.
    #[error("{path}: invalid JSON: {message}")]
    Json {
        /// The file involved.
        path: PathBuf,
        /// What serde_json reported.
        message: String,
    },
    /// A safetensors file (parameters, optimizer state) is malformed.
    #[error("{path}: invalid safetensors: {message}")]
    Safetensors {
        /// The file involved.
        path: PathBuf,
        /// What safetensors reported.
        message: String,
    },
    /// A saved tensor does not fit the module or optimizer it is loaded into.
    #[error("{path}: tensor `{name}`: {message}")]
    Mismatch {
        /// The file involved.
        path: PathBuf,
        /// Name of the tensor (parameter path, optionally with a state suffix).
        name: String,
        /// What was expected and what was found.
        message: String,
    },
    /// A setting is out of range or not supported by the chosen backend.
    #[error("unsupported setting `{key}`: {message}")]
    Unsupported {
        /// The setting (config key).
        key: String,
        /// Why it cannot be used.
        message: String,
    },
    /// The loss became NaN or infinite.
    #[error(
        "loss is not finite ({loss}) at step {step}; lower training.learning_rate or enable grad_clip"
    )]
    Diverged {
        /// The optimiser step at which it happened.
        step: usize,
        /// The loss value.
        loss: f32,
    },
    /// The model, the data source or the system reported an error (saving, loading, reading shards, a replica
    /// failing); `source` is that error itself, so a caller can downcast it (e.g. to `ember_model::ModelError`).
    #[error("{context}: {source}")]
    External {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// The plot could not be drawn.
    #[error("cannot draw {path}: {message}")]
    Plot {
        /// The image file.
        path: PathBuf,
        /// What plotters reported.
        message: String,
    },
}

impl TrainError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TrainError::Io {
            path: path.into(),
            source,
        }
    }
}
