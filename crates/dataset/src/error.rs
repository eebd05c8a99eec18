//! The error type of the dataset crate.

use std::path::PathBuf;

/// Everything that can go wrong while preparing or reading a token corpus.
///
/// Every variant names the file (and, for JSONL, the line) it is about, so a message can be acted on without a
/// debugger.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// An operating-system error while reading or writing `path`.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory being accessed.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A JSONL line that is not a JSON object holding the text field as a string.
    #[error("{path}:{line}: {message}")]
    Jsonl {
        /// The JSONL file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What was wrong with the line.
        message: String,
    },
    /// The inputs held no document with any text.
    #[error("empty corpus: no non-empty document found in {inputs}")]
    EmptyCorpus {
        /// The inputs, as given.
        inputs: String,
    },
    /// A shard whose header is malformed or disagrees with its manifest or the tokenizer.
    #[error("shard {path}: {message}")]
    ShardMismatch {
        /// The shard file.
        path: PathBuf,
        /// What was expected and what was found.
        message: String,
    },
    /// A manifest that cannot be parsed or is inconsistent.
    #[error("manifest {path}: {message}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// An option outside its valid range (the message names the option and the range).
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// A split too short for the requested windows.
    #[error(
        "split `{split}` of {dir} holds {tokens} tokens per rank, too few for a window of {needed} tokens"
    )]
    SplitTooShort {
        /// The prepared corpus directory.
        dir: PathBuf,
        /// `train` or `val`.
        split: String,
        /// Tokens available to one rank.
        tokens: u64,
        /// Tokens one window needs (`block_size + 1`).
        needed: u64,
    },
    /// A saved reader state that does not fit the dataset or batch shape it is resumed with.
    #[error("reader state mismatch: {0}")]
    StateMismatch(String),
    /// The tokenizer at `path` could not be loaded.
    #[error("tokenizer {path}: {message}")]
    Tokenizer {
        /// The tokenizer file or directory.
        path: PathBuf,
        /// The tokenizer's error.
        message: String,
    },
    /// The encoder failed on a document.
    #[error("cannot encode document {document}: {message}")]
    Encode {
        /// The document (`file` or `file:line`).
        document: String,
        /// The encoder's message.
        message: String,
    },
    /// A token id that does not fit the vocabulary declared by the encoder.
    #[error(
        "token id {id} from the encoder is outside its vocabulary of {vocab_size} (document {document})"
    )]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// The declared vocabulary size.
        vocab_size: usize,
        /// The document that produced it (`file` or `file:line`).
        document: String,
    },
}

impl DatasetError {
    /// Wraps an I/O error with the path it concerns.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

/// The result type of this crate.
pub type Result<T> = std::result::Result<T, DatasetError>;
