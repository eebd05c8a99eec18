//! The embedded tokenizer (`tokenizer.ggml.*` metadata) handed to the tokenizer crate as a [`GgufVocab`].

use ember_tokenizer::GgufVocab;

use super::{GgufError, GgufFile, MetadataValue};

/// Key of the chat template (a Jinja string) some GGUF files carry.
pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// The elements of array `key`, empty when absent.
fn array<'f>(file: &'f GgufFile, key: &str) -> Result<&'f [MetadataValue], GgufError> {
    match file.get(key) {
        None => Ok(&[]),
        Some(v) => v
            .as_array()
            .ok_or_else(|| file.metadata_error(key, "an array", v.type_name())),
    }
}

/// Converts every element of array `key` with `convert`, naming the key and `expected` element type on failure.
fn elements<T>(
    file: &GgufFile,
    key: &str,
    expected: &str,
    convert: impl Fn(&MetadataValue) -> Option<T>,
) -> Result<Vec<T>, GgufError> {
    array(file, key)?
        .iter()
        .map(|v| convert(v).ok_or_else(|| file.metadata_error(key, expected, v.type_name())))
        .collect()
}

/// The token id under `key`, if present.
fn token_id(file: &GgufFile, key: &str) -> Result<Option<u32>, GgufError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .map(Some)
            .ok_or_else(|| file.metadata_error(key, "a token id", v.type_name())),
    }
}

/// The boolean under `key`, if present.
fn flag(file: &GgufFile, key: &str) -> Result<Option<bool>, GgufError> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| file.metadata_error(key, "a boolean", v.type_name())),
    }
}

/// The tokenizer of a GGUF file at `path`: its `tokenizer.ggml.*` arrays built into an [`ember_tokenizer::Tokenizer`], reading
/// only the metadata (the file is mapped, its tensors are not touched). What `--tokenizer FILE.gguf` loads.
pub fn load_tokenizer(
    path: &std::path::Path,
) -> Result<ember_tokenizer::Tokenizer, TokenizerFromGgufError> {
    let file = GgufFile::open(path)?;
    let vocab = tokenizer_vocab(&file)?;
    Ok(ember_tokenizer::Tokenizer::from_gguf_vocab(vocab)?)
}

/// Why a GGUF file's tokenizer could not be loaded: the file, or the vocabulary in it.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerFromGgufError {
    /// The file is not a readable GGUF file, or its `tokenizer.ggml.*` metadata has the wrong types.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The vocabulary is inconsistent or of an unsupported kind.
    #[error(transparent)]
    Tokenizer(#[from] ember_tokenizer::TokenizerError),
}

/// The tokenizer arrays and special ids of `file`.
pub fn tokenizer_vocab(file: &GgufFile) -> Result<GgufVocab, GgufError> {
    let string = |v: &MetadataValue| v.as_str().map(str::to_string);
    Ok(GgufVocab {
        path: file.path().to_path_buf(),
        model: file.require_str("tokenizer.ggml.model")?.to_string(),
        pre: file
            .get("tokenizer.ggml.pre")
            .and_then(MetadataValue::as_str)
            .map(str::to_string),
        tokens: elements(file, "tokenizer.ggml.tokens", "an array of strings", string)?,
        scores: elements(file, "tokenizer.ggml.scores", "an array of floats", |v| {
            v.as_f64().map(|f| f as f32)
        })?,
        token_types: elements(
            file,
            "tokenizer.ggml.token_type",
            "an array of integers",
            |v| v.as_i64().and_then(|i| i32::try_from(i).ok()),
        )?,
        merges: elements(file, "tokenizer.ggml.merges", "an array of strings", string)?,
        bos: token_id(file, "tokenizer.ggml.bos_token_id")?,
        eos: token_id(file, "tokenizer.ggml.eos_token_id")?,
        unk: token_id(file, "tokenizer.ggml.unknown_token_id")?,
        add_space_prefix: flag(file, "tokenizer.ggml.add_space_prefix")?,
        add_bos: flag(file, "tokenizer.ggml.add_bos_token")?,
        add_eos: flag(file, "tokenizer.ggml.add_eos_token")?,
    })
}

/// The chat template of `file`, if it has one.
pub fn chat_template(file: &GgufFile) -> Option<&str> {
    file.get(CHAT_TEMPLATE).and_then(MetadataValue::as_str)
}
