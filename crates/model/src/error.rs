//! The error type of this crate: every variant names the file, key or tensor involved and what was expected.

use std::path::PathBuf;

/// Everything that can go wrong describing, building, loading or saving a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A config file is not valid JSON or lacks a key its family needs.
    #[error("{path}: {message}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong, naming the key (serde's "missing field `hidden_size`" or our own message).
        message: String,
    },
    /// `architectures[0]` names a family ember does not implement.
    #[error("{path}: unsupported architecture `{found}`; supported: {}", supported.join(", "))]
    UnknownArchitecture {
        /// The config file.
        path: PathBuf,
        /// The architecture the config asks for.
        found: String,
        /// Every architecture in the registry.
        supported: Vec<&'static str>,
    },
    /// A spec whose sizes contradict each other (e.g. heads not dividing the hidden size).
    #[error("invalid model spec: {0}")]
    InvalidSpec(String),
    /// A safetensors file is truncated, has a malformed header, or a tensor with an unsupported dtype.
    #[error("{path}: corrupt or unsupported safetensors file: {message}")]
    Safetensors {
        /// The safetensors (or index) file.
        path: PathBuf,
        /// What the parser reported.
        message: String,
    },
    /// A tensor the spec needs is not in the checkpoint.
    #[error("missing tensor `{name}` (needed for `{canonical}`) in {dir}")]
    MissingTensor {
        /// The checkpoint's (Hugging Face) name of the tensor.
        name: String,
        /// Our canonical name of the parameter it feeds.
        canonical: String,
        /// The model directory.
        dir: PathBuf,
    },
    /// A tensor is present with the wrong shape.
    #[error("{}: tensor `{name}` has shape {found:?}, expected {expected:?}", file.display())]
    ShapeMismatch {
        /// The file holding the tensor.
        file: PathBuf,
        /// The checkpoint's name of the tensor.
        name: String,
        /// The shape the spec implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A token id is not below the vocabulary size.
    #[error(
        "token id {id} at position {position} is out of range for a vocabulary of {vocab_size}"
    )]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// Its position in the input (row-major over `[batch, seq]`).
        position: usize,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// An input longer than the model's positions (learned position embeddings have a fixed table).
    #[error("sequence of {len} positions exceeds the model's context length {context_length}")]
    ContextOverflow {
        /// Positions needed (cache offset plus new tokens).
        len: usize,
        /// The model's context length.
        context_length: usize,
    },
    /// The attention kernel, RoPE or the KV cache rejected its inputs (e.g. a cache holding another batch size,
    /// or a paged pool out of budget: [`ember_attention::AttentionError::Cache`]).
    #[error("{0}")]
    Attention(#[from] ember_attention::AttentionError),
    /// A weight could not be quantized (e.g. it holds a NaN), or quantized GGUF blocks did not fit the layer.
    #[error("quantizing `{tensor}`: {message}")]
    Quantization {
        /// Canonical name of the tensor.
        tensor: String,
        /// What the quantizer reported.
        message: String,
    },
    /// A GGUF file is malformed, lacks a key, or holds a tensor type ember cannot read (the message names the
    /// file and the key or tensor).
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    /// The family can read this spec but cannot write it back in its own config format.
    #[error("cannot save as `{architecture}`: {reason}")]
    Unsaveable {
        /// The family asked for.
        architecture: String,
        /// What the spec has that the family's config cannot express.
        reason: String,
    },
    /// LoRA settings or an adapter that do not fit the model (a target naming no module, a rank out of range,
    /// matrices of the wrong shape, a packed base layer).
    #[error("{0}")]
    Lora(String),
}

/// Shorthand for results in this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
