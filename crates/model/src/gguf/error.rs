//! Errors of GGUF reading.

use std::path::PathBuf;

/// Why a GGUF file could not be read, or a tensor or metadata key could not be produced from it.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating-system error.
        source: std::io::Error,
    },
    /// The file does not start with the `GGUF` magic.
    #[error("{}: not a GGUF file (magic {found:?}, expected \"GGUF\")", path.display())]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first four bytes.
        found: [u8; 4],
    },
    /// The header names a version this reader does not read (it reads 2 and 3).
    #[error("{}: GGUF version {version} is not supported (expected 2 or 3)", path.display())]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version in the header.
        version: u32,
    },
    /// The file ends, or a length points, past the end of the data while reading `what`.
    #[error("{}: truncated or corrupt while reading {what} at byte {offset} (file is {len} bytes)", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What was being read (a key, a tensor name, the header).
        what: String,
        /// Byte offset of the read that failed.
        offset: u64,
        /// File length.
        len: u64,
    },
    /// A structurally invalid value (bad UTF-8, unknown value type, overflowing shape, misaligned offset).
    #[error("{}: {what}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The key or tensor concerned.
        what: String,
        /// What was wrong.
        reason: String,
    },
    /// A tensor is stored in a ggml type this reader cannot dequantize.
    #[error("{}: tensor `{tensor}` has ggml type {ggml_type}, which is not supported (supported: {supported})", path.display())]
    UnsupportedType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The type's name (or number, when unknown).
        ggml_type: String,
        /// The types this reader dequantizes.
        supported: &'static str,
    },
    /// A tensor asked for by name is not in the file.
    #[error("{}: no tensor named `{tensor}`", path.display())]
    MissingTensor {
        /// The file.
        path: PathBuf,
        /// The name asked for.
        tensor: String,
    },
    /// A metadata key is absent or has a different type than required.
    #[error("{}: metadata key `{key}`: expected {expected}, found {found}", path.display())]
    Metadata {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The expected type or value.
        expected: String,
        /// What the file has (`missing` when absent).
        found: String,
    },
}
