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

/// The `tokenizer.*` metadata of `file` as stored (vocabulary, merges, special ids, chat template), for a GGUF
/// written from a GGUF model: copied rather than rebuilt, so nothing llama.cpp reads from them changes.
pub fn tokenizer_metadata(file: &GgufFile) -> Vec<(String, MetadataValue)> {
    file.metadata()
        .iter()
        .filter(|(key, _)| key.starts_with("tokenizer."))
        .cloned()
        .collect()
}

/// The `tokenizer.ggml.*` keys of `vocab` and, if given, its chat template: the inverse of [`tokenizer_vocab`].
pub fn vocab_metadata(
    vocab: &GgufVocab,
    chat_template: Option<&str>,
) -> Vec<(String, MetadataValue)> {
    let strings = |items: &[String]| {
        MetadataValue::Array(items.iter().cloned().map(MetadataValue::String).collect())
    };
    let mut out = vec![(
        "tokenizer.ggml.model".to_string(),
        MetadataValue::String(vocab.model.clone()),
    )];
    let mut put =
        |key: &str, value: MetadataValue| out.push((format!("tokenizer.ggml.{key}"), value));
    if let Some(pre) = &vocab.pre {
        put("pre", MetadataValue::String(pre.clone()));
    }
    put("tokens", strings(&vocab.tokens));
    if !vocab.scores.is_empty() {
        put(
            "scores",
            MetadataValue::Array(
                vocab
                    .scores
                    .iter()
                    .map(|&s| MetadataValue::F32(s))
                    .collect(),
            ),
        );
    }
    put(
        "token_type",
        MetadataValue::Array(
            vocab
                .token_types
                .iter()
                .map(|&t| MetadataValue::I32(t))
                .collect(),
        ),
    );
    if !vocab.merges.is_empty() {
        put("merges", strings(&vocab.merges));
    }
    for (key, id) in [
        ("bos_token_id", vocab.bos),
        ("eos_token_id", vocab.eos),
        ("unknown_token_id", vocab.unk),
    ] {
        if let Some(id) = id {
            put(key, MetadataValue::U32(id));
        }
    }
    for (key, flag) in [
        ("add_space_prefix", vocab.add_space_prefix),
        ("add_bos_token", vocab.add_bos),
        ("add_eos_token", vocab.add_eos),
    ] {
        if let Some(flag) = flag {
            put(key, MetadataValue::Bool(flag));
        }
    }
    if let Some(template) = chat_template {
        out.push((
            CHAT_TEMPLATE.to_string(),
            MetadataValue::String(template.to_string()),
        ));
    }
    out
}
