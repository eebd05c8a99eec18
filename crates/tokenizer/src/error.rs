//! The error type of every fallible tokenizer operation.

use std::path::PathBuf;

/// What went wrong while loading, encoding, decoding or training a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A tokenizer file was read but its content is not what it must be.
    #[error("{path}: {message}")]
    Malformed {
        /// The file (or a description of the in-memory source, such as `GGUF vocabulary`).
        path: PathBuf,
        /// What is wrong, naming the key or line.
        message: String,
    },
    /// A tokenizer file uses a feature (a normalizer, pre-tokenizer, model option) this crate does not implement.
    #[error("{path}: unsupported {what}")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The feature, e.g. `pre_tokenizer type "Digits"`.
        what: String,
    },
    /// A pre-tokenization pattern is not a valid regular expression.
    #[error("invalid pre-tokenizer pattern {pattern:?}: {message}")]
    Pattern {
        /// The pattern.
        pattern: String,
        /// The regex engine's complaint.
        message: String,
    },
    /// A token id is outside the vocabulary.
    #[error("token id {id} is out of range (vocabulary size {vocab_size})")]
    UnknownId {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// A character has no token and the model has neither byte fallback nor an unknown token.
    #[error("no token for {0:?}: the vocabulary has neither byte fallback nor an unknown token")]
    Untokenizable(String),
    /// Training was asked for something impossible.
    #[error("training: {0}")]
    Training(String),
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, TokenizerError>;

impl TokenizerError {
    pub(crate) fn malformed(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Malformed {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
