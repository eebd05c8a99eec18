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

/// The tokenizer arrays and special ids of `file`.
pub fn tokenizer_vocab(file: &GgufFile) -> Result<GgufVocab, GgufError> {
    let string = |v: &MetadataValue| v.as_str().map(str::to_string);
    Ok(GgufVocab {
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
        add_space_prefix: file
            .get("tokenizer.ggml.add_space_prefix")
            .and_then(MetadataValue::as_bool),
    })
}

/// The chat template of `file`, if it has one.
pub fn chat_template(file: &GgufFile) -> Option<&str> {
    file.get(CHAT_TEMPLATE).and_then(MetadataValue::as_str)
}
