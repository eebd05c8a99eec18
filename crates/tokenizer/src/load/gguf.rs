//! Tokenizers from the vocabulary arrays of a GGUF file (`tokenizer.ggml.*`). The GGUF reader lives in the model
//! crate; it hands the arrays over as a [`GgufVocab`].

use std::path::PathBuf;

use crate::added::AddedToken;
use crate::error::{Result, TokenizerError};
use crate::load::gguf_pre::{SUPPORTED, pretokenizer};
use crate::load::{ModelSpec, byte_level_bytes, sentencepiece_bytes};
use crate::normalize::Normalize;
use crate::tokenizer::{Parts, Tokenizer};

/// llama.cpp's `tokenizer.ggml.token_type` values (its `llama_token_type`), shared with the writer.
pub(crate) const TYPE_NORMAL: i32 = 1;
pub(crate) const TYPE_UNKNOWN: i32 = 2;
pub(crate) const TYPE_CONTROL: i32 = 3;
pub(crate) const TYPE_USER_DEFINED: i32 = 4;
pub(crate) const TYPE_UNUSED: i32 = 5;
pub(crate) const TYPE_BYTE: i32 = 6;

/// The `tokenizer.ggml.*` metadata of a GGUF file as plain vectors.
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// The GGUF file the arrays come from, for error messages.
    pub path: PathBuf,
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece BPE by scores).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name (`"default"`, `"gpt-2"`, `"llama-bpe"`, `"qwen2"`, ...).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece merge priorities; higher merges first). May be empty for `gpt2`.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges` (`"left right"`), for `gpt2`.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece; llama.cpp's default is true).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.add_bos_token`: whether a sequence starts with the BOS token.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`: whether a sequence ends with the EOS token.
    pub add_eos: Option<bool>,
}

impl Tokenizer {
    /// Builds a tokenizer from a GGUF vocabulary.
    pub fn from_gguf_vocab(vocab: GgufVocab) -> Result<Self> {
        let source = if vocab.path.as_os_str().is_empty() {
            PathBuf::from("GGUF tokenizer.ggml")
        } else {
            vocab.path.clone()
        };
        let bad = |m: String| TokenizerError::malformed(&source, m);
        let n = vocab.tokens.len();
        for (key, len) in [
            ("scores", vocab.scores.len()),
            ("token_type", vocab.token_types.len()),
        ] {
            if len != 0 && len != n {
                return Err(bad(format!(
                    "tokenizer.ggml.{key} has {len} entries for {n} tokens"
                )));
            }
        }
        for (key, id) in [
            ("bos_token_id", vocab.bos),
            ("eos_token_id", vocab.eos),
            ("unknown_token_id", vocab.unk),
        ] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(bad(format!(
                    "tokenizer.ggml.{key} = {id} is outside the {n} tokens"
                )));
            }
        }
        let ty = |i: usize| vocab.token_types.get(i).copied().unwrap_or(TYPE_NORMAL);
        // llama.cpp matches the unknown token in text as it does control tokens.
        let added: Vec<AddedToken> = (0..n)
            .filter(|&i| {
                matches!(ty(i), TYPE_UNKNOWN | TYPE_CONTROL | TYPE_USER_DEFINED)
                    && !vocab.tokens[i].is_empty()
            })
            .map(|i| AddedToken {
                content: vocab.tokens[i].clone(),
                id: i as u32,
                special: ty(i) != TYPE_USER_DEFINED,
            })
            .collect();
        match vocab.model.as_str() {
            "gpt2" => {
                let Some(pre) = pretokenizer(vocab.pre.as_deref())? else {
                    return Err(TokenizerError::Unsupported {
                        path: source,
                        what: format!(
                            "tokenizer.ggml.pre {:?} (supported: {})",
                            vocab.pre.as_deref().unwrap_or_default(),
                            SUPPORTED.join(", ")
                        ),
                    });
                };
                let ids: rustc_hash::FxHashMap<&str, u32> = vocab
                    .tokens
                    .iter()
                    .enumerate()
                    .rev()
                    .map(|(i, t)| (t.as_str(), i as u32))
                    .collect();
                let mut merges = Vec::with_capacity(vocab.merges.len());
                for (k, m) in vocab.merges.iter().enumerate() {
                    let (l, r) = m.split_once(' ').ok_or_else(|| {
                        bad(format!(
                            "tokenizer.ggml.merges[{k}] = {m:?} is not `left right`"
                        ))
                    })?;
                    let id = |t: &str| {
                        ids.get(t).copied().ok_or_else(|| {
                            bad(format!("tokenizer.ggml.merges[{k}]: {t:?} is not a token"))
                        })
                    };
                    merges.push((id(l)?, id(r)?, id(&format!("{l}{r}"))?));
                }
                let token_bytes: Vec<Vec<u8>> =
                    vocab.tokens.iter().map(|t| byte_level_bytes(t)).collect();
                let spec = ModelSpec {
                    tokens: vocab.tokens,
                    token_bytes: token_bytes.clone(),
                    byte_level: true,
                    byte_fallback: false,
                    unk: vocab.unk,
                    fuse_unk: false,
                    ignore_merges: pre.ignore_merges,
                };
                Ok(Tokenizer::from_parts(Parts {
                    model: spec.build(&merges),
                    normalizers: Vec::new(),
                    splitters: pre.splitters,
                    prefix_space: false,
                    added,
                    token_bytes,
                    strip_leading_space: false,
                    bos: vocab.bos,
                    eos: vocab.eos,
                    add_bos: vocab.add_bos.unwrap_or(pre.add_bos),
                    add_eos: vocab.add_eos.unwrap_or(false),
                }))
            }
            "llama" => {
                if vocab.scores.len() != n {
                    return Err(bad(
                        "tokenizer.ggml.scores is required for a llama (SentencePiece) vocabulary"
                            .into(),
                    ));
                }
                let token_bytes: Vec<Vec<u8>> = vocab
                    .tokens
                    .iter()
                    .map(|t| sentencepiece_bytes(t, true, "\u{2581}"))
                    .collect();
                // llama.cpp merges the adjacent pair whose concatenation has the highest score: rank tokens by
                // score, descending, ties by id.
                let mut order: Vec<usize> = (0..n).collect();
                order.sort_by(|&a, &b| vocab.scores[b].total_cmp(&vocab.scores[a]).then(a.cmp(&b)));
                let mut priority = vec![u32::MAX; n];
                for (rank, &id) in order.iter().enumerate() {
                    priority[id] = rank as u32;
                }
                // Only text pieces take part in merges: control and byte tokens are never formed by merging.
                let split_keys: Vec<Vec<u8>> = (0..n)
                    .map(|i| {
                        if matches!(ty(i), TYPE_CONTROL | TYPE_BYTE) {
                            Vec::new()
                        } else {
                            vocab.tokens[i].as_bytes().to_vec()
                        }
                    })
                    .collect();
                let add_prefix = vocab.add_space_prefix.unwrap_or(true);
                let spec = ModelSpec {
                    tokens: vocab.tokens,
                    token_bytes: split_keys,
                    byte_level: false,
                    byte_fallback: true,
                    unk: vocab.unk,
                    fuse_unk: true,
                    ignore_merges: false,
                };
                let mut normalizers = Vec::new();
                if add_prefix {
                    normalizers.push(Normalize::Prepend(" ".into()));
                }
                normalizers.push(Normalize::Replace(" ".into(), "\u{2581}".into()));
                Ok(Tokenizer::from_parts(Parts {
                    model: spec.build_from_splits(&priority),
                    normalizers,
                    splitters: Vec::new(),
                    prefix_space: false,
                    added,
                    token_bytes,
                    strip_leading_space: add_prefix,
                    bos: vocab.bos,
                    eos: vocab.eos,
                    add_bos: vocab.add_bos.unwrap_or(true),
                    add_eos: vocab.add_eos.unwrap_or(false),
                }))
            }
            other => Err(TokenizerError::Unsupported {
                path: source,
                what: format!("tokenizer.ggml.model {other:?}"),
            }),
        }
    }
}
