//! Error types of the crate: one enum for quantized weights, one for the paged KV-cache pool.

use std::path::PathBuf;

/// Errors from quantizing, loading or saving weights.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// A scheme string that [`crate::QuantScheme::from_str`](std::str::FromStr) does not know.
    #[error(
        "unknown quantization scheme `{text}`: expected int8, int8-gN, int4, int4-gN or int4-gN-asym"
    )]
    UnknownScheme {
        /// The text that failed to parse.
        text: String,
    },
    /// A group size that is zero or not a multiple of 8.
    #[error("invalid quantization group size {group_size}: expected a positive multiple of 8")]
    InvalidGroupSize {
        /// The rejected group size.
        group_size: usize,
    },
    /// A group size above [`crate::quant::scheme::MAX_GROUP_SIZE`], or longer than the rows it would quantize
    /// (every row is padded to whole groups, so such a group only wastes memory and time).
    #[error("quantization group size {group_size}: expected at most {max} ({why})")]
    GroupTooLarge {
        /// The rejected group size.
        group_size: usize,
        /// The largest group accepted here.
        max: usize,
        /// Where the bound comes from.
        why: String,
    },
    /// A weight matrix with a zero dimension.
    #[error("cannot quantize an empty weight of shape {shape:?}")]
    EmptyShape {
        /// `[out_features, in_features]`.
        shape: [usize; 2],
    },
    /// A buffer whose length does not match the shape and scheme.
    #[error("{what}: expected {expected} elements, got {actual}")]
    LengthMismatch {
        /// Which buffer (e.g. `weights`, `scales of layers.0.q_proj`).
        what: String,
        /// Length implied by the shape and scheme.
        expected: usize,
        /// Length supplied.
        actual: usize,
    },
    /// A NaN or infinite weight, which has no quantized representation.
    #[error("weight at row {row}, column {col} is not finite ({value})")]
    NonFinite {
        /// Output channel.
        row: usize,
        /// Input element.
        col: usize,
        /// The offending value.
        value: f32,
    },
    /// GGUF block data that does not fit the declared shape.
    #[error("GGUF {kind} tensor of shape [{rows}, {cols}]: {reason}")]
    GgufBlocks {
        /// `Q8_0`, `Q4_0` or `Q4_1`.
        kind: &'static str,
        /// Rows (GGUF `ne[1]`, output features).
        rows: usize,
        /// Columns (GGUF `ne[0]`, input features).
        cols: usize,
        /// What is wrong.
        reason: String,
    },
    /// ggml block bytes that are not a `[rows, cols]` matrix of their type (see
    /// [`ember_ggml::GgmlMatrix::new`]).
    #[error("ggml blocks: {reason}")]
    GgmlBlocks {
        /// What is wrong, naming the type, the shape and the expected byte length.
        reason: String,
    },
    /// A tensor shape that does not match what the layer expects.
    #[error("{what}: expected shape {expected:?}, got {actual:?}")]
    ShapeMismatch {
        /// Which tensor.
        what: String,
        /// Expected dimensions.
        expected: Vec<usize>,
        /// Actual dimensions.
        actual: Vec<usize>,
    },
    /// Tensor data read back from a device had an unexpected element type.
    #[error("{what}: {reason}")]
    DeviceData {
        /// Which tensor.
        what: String,
        /// The conversion error.
        reason: String,
    },
    /// Reading or writing a checkpoint failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The safetensors container could not be parsed or written.
    #[error("{path}: safetensors: {source}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: safetensors::SafeTensorError,
    },
    /// A checkpoint whose tensors or metadata do not describe a valid quantized weight.
    #[error("{path}: {reason}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is missing or inconsistent (names the tensor or metadata key).
        reason: String,
    },
}

/// Errors from the paged KV-cache pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The memory budget cannot hold the blocks a request needs.
    #[error(
        "KV-cache pool exhausted: sequence {seq} needs {needed} more block(s) of {block_size} tokens \
         but only {free} of {total} are free; finish or preempt a sequence, or raise the budget"
    )]
    OutOfBlocks {
        /// The sequence that asked.
        seq: u64,
        /// Blocks the request needed.
        needed: usize,
        /// Blocks free at the time.
        free: usize,
        /// Blocks in the pool.
        total: usize,
        /// Tokens per block.
        block_size: usize,
    },
    /// A budget too small for even one block.
    #[error("KV-cache budget of {budget_bytes} bytes is below one block ({block_bytes} bytes)")]
    BudgetTooSmall {
        /// The requested budget.
        budget_bytes: usize,
        /// Bytes of one block across all layers, K and V.
        block_bytes: usize,
    },
    /// An invalid pool configuration (zero sizes).
    #[error("invalid KV-cache pool configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// A sequence id that is not (or no longer) live in the pool.
    #[error("unknown sequence {seq} (never added, or already freed)")]
    UnknownSequence {
        /// The id.
        seq: u64,
    },
    /// A write outside the positions reserved for a sequence, or with a mismatching shape.
    #[error("sequence {seq}, layer {layer}: {reason}")]
    BadWrite {
        /// The sequence.
        seq: u64,
        /// The layer.
        layer: usize,
        /// What is wrong.
        reason: String,
    },
}
