//! Loading tokenizers from files: [`Tokenizer::from_path`] picks the format.

mod gguf;
mod gguf_export;
mod gguf_pre;
mod hf_json;
mod ids;
pub(crate) mod json;
mod tiktoken;

use std::path::Path;

use rustc_hash::FxHashMap;

pub use gguf::GgufVocab;

use crate::bpe::{BpeModel, Symbols, pair_key};
use crate::byte_level;
use crate::error::{Result, TokenizerError};
use crate::tokenizer::Tokenizer;

impl Tokenizer {
    /// Loads a tokenizer from a HF `tokenizer.json`, a tiktoken rank file (`*.tiktoken`), a GPT-2 `vocab.json`
    /// (with `merges.txt` next to it), or a directory holding `tokenizer.json` or `vocab.json` + `merges.txt`.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            let json = path.join("tokenizer.json");
            if json.is_file() {
                return Self::from_hf_json_file(&json);
            }
            let (vocab, merges) = (path.join("vocab.json"), path.join("merges.txt"));
            if vocab.is_file() && merges.is_file() {
                return Self::from_gpt2_files(&vocab, &merges);
            }
            return Err(TokenizerError::malformed(
                path,
                "directory has neither tokenizer.json nor vocab.json + merges.txt",
            ));
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name == "vocab.json" {
            return Self::from_gpt2_files(path, path.with_file_name("merges.txt"));
        }
        if name.ends_with(".tiktoken") {
            return Self::from_tiktoken_file(path);
        }
        let bytes = read(path)?;
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
            Self::from_hf_json_bytes(&bytes, path)
        } else {
            tiktoken::from_known_ranks(&bytes, path)
        }
    }
}

pub(crate) fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| TokenizerError::io(path, e))
}

/// Everything needed to build a [`BpeModel`] from a vocabulary: token strings, their raw bytes, and merges.
pub(crate) struct ModelSpec {
    /// Vocabulary strings by id.
    pub tokens: Vec<String>,
    /// The raw bytes each token decodes to, by id.
    pub token_bytes: Vec<Vec<u8>>,
    /// Byte-level (GPT-2 mapping) rather than character-level symbols.
    pub byte_level: bool,
    /// Character-level only: fall back to `<0xNN>` tokens.
    pub byte_fallback: bool,
    pub unk: Option<u32>,
    pub fuse_unk: bool,
    /// Emit a word that is itself a token whole (tiktoken's rule, HF `ignore_merges`).
    pub ignore_merges: bool,
}

impl ModelSpec {
    /// Builds the model with explicit merges `(left, right, merged)`, ranked by position.
    pub fn build(self, merges: &[(u32, u32, u32)]) -> BpeModel {
        let mut map = FxHashMap::default();
        map.reserve(merges.len());
        for (rank, &(l, r, m)) in merges.iter().enumerate() {
            map.entry(pair_key(l, r)).or_insert((rank as u32, m));
        }
        self.build_with_map(map)
    }

    /// Builds the model with tiktoken's rule: every split of a token into two tokens merges to it, with the
    /// token's priority (`priority[id]`, lower first).
    pub fn build_from_splits(self, priority: &[u32]) -> BpeModel {
        let by_bytes: FxHashMap<&[u8], u32> = self
            .token_bytes
            .iter()
            .enumerate()
            .map(|(id, b)| (b.as_slice(), id as u32))
            .collect();
        let mut map = FxHashMap::default();
        for (id, bytes) in self.token_bytes.iter().enumerate() {
            for k in 1..bytes.len() {
                if let (Some(&l), Some(&r)) = (by_bytes.get(&bytes[..k]), by_bytes.get(&bytes[k..]))
                {
                    let entry = map
                        .entry(pair_key(l, r))
                        .or_insert((priority[id], id as u32));
                    if priority[id] < entry.0 {
                        *entry = (priority[id], id as u32);
                    }
                }
            }
        }
        self.build_with_map(map)
    }

    fn build_with_map(self, merges: FxHashMap<u64, (u32, u32)>) -> BpeModel {
        let token_ids: FxHashMap<String, u32> = self
            .tokens
            .iter()
            .enumerate()
            .rev()
            .map(|(id, t)| (t.clone(), id as u32))
            .collect();
        let symbols = if self.byte_level {
            let mut ids = Box::new([None; 256]);
            for b in 0..=255u8 {
                ids[usize::from(b)] = token_ids
                    .get(byte_level::byte_to_char(b).to_string().as_str())
                    .copied();
            }
            Symbols::Bytes(ids)
        } else {
            let fallback = self.byte_fallback.then(|| {
                let ids: Option<Vec<u32>> = (0..=255u8)
                    .map(|b| token_ids.get(format!("<0x{b:02X}>").as_str()).copied())
                    .collect();
                ids.map(|v| Box::new(<[u32; 256]>::try_from(v).expect("256 byte tokens")))
            });
            Symbols::Chars {
                byte_fallback: fallback.flatten(),
            }
        };
        let whole_words = self.ignore_merges.then(|| {
            if self.byte_level {
                BpeModel::whole_word_table(&self.token_bytes)
            } else {
                let strings: Vec<Vec<u8>> =
                    self.tokens.iter().map(|t| t.as_bytes().to_vec()).collect();
                BpeModel::whole_word_table(&strings)
            }
        });
        BpeModel {
            tokens: self.tokens,
            token_ids,
            merges,
            symbols,
            unk: self.unk,
            fuse_unk: self.fuse_unk,
            whole_words,
        }
    }
}

/// Raw bytes of a byte-level vocabulary string; strings outside the mapping (added tokens stored in the vocab)
/// stand for their own UTF-8.
pub(crate) fn byte_level_bytes(token: &str) -> Vec<u8> {
    byte_level::string_to_bytes(token).unwrap_or_else(|| token.as_bytes().to_vec())
}

/// Raw bytes of a SentencePiece-style token: `<0xNN>` is one byte (with byte fallback), `▁` is a space.
pub(crate) fn sentencepiece_bytes(token: &str, byte_fallback: bool, marker: &str) -> Vec<u8> {
    if byte_fallback
        && token.len() == 6
        && token.starts_with("<0x")
        && token.ends_with('>')
        && let Ok(b) = u8::from_str_radix(&token[3..5], 16)
    {
        return vec![b];
    }
    token.replace(marker, " ").into_bytes()
}
