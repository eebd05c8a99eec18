//! A tokenizer as the `tokenizer.ggml.*` arrays of a GGUF file ([`GgufVocab`]), for writing models llama.cpp
//! runs: the inverse of [`Tokenizer::from_gguf_vocab`] for byte-level BPE vocabularies.

use crate::bpe::Symbols;
use crate::error::{Result, TokenizerError};
use crate::load::GgufVocab;
use crate::load::gguf_pre::name_of;
use crate::normalize::Normalize;
use crate::tokenizer::Tokenizer;

/// llama.cpp's `tokenizer.ggml.token_type` values.
const TYPE_NORMAL: i32 = 1;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;
const TYPE_UNUSED: i32 = 5;

impl Tokenizer {
    /// This tokenizer as a GGUF vocabulary (`tokenizer.ggml.model` `gpt2`, its pre-tokenizer by llama.cpp's name),
    /// such that [`Tokenizer::from_gguf_vocab`] rebuilds one that encodes every text alike. Only byte-level BPE
    /// with a pre-tokenizer llama.cpp knows by name can be written; anything else is an error saying what.
    pub fn to_gguf_vocab(&self) -> Result<GgufVocab> {
        let unsupported = |what: String| TokenizerError::Unsupported {
            path: "GGUF tokenizer.ggml".into(),
            what,
        };
        if !matches!(self.model.symbols, Symbols::Bytes(_)) {
            return Err(unsupported(
                "a SentencePiece-style (character-level) vocabulary written as GGUF; only byte-level BPE is"
                    .into(),
            ));
        }
        // NFC is the one normalizer byte-level vocabularies carry (Qwen 2's); GGUF has no key for it and
        // llama.cpp's converter drops it, so the file tokenizes NFC text alike and other text as llama.cpp does.
        if let Some(normalizer) = self
            .normalizers
            .iter()
            .find(|n| !matches!(n, Normalize::Nfc))
        {
            return Err(unsupported(format!(
                "a byte-level vocabulary with a normalizer ({normalizer:?}); llama.cpp's `gpt2` vocabularies \
                 have none"
            )));
        }
        if self.prefix_space || self.strip_leading_space {
            return Err(unsupported(
                "a byte-level vocabulary that adds a prefix space; llama.cpp's `gpt2` vocabularies do not"
                    .into(),
            ));
        }
        let ignore_merges = self.model.whole_words.is_some();
        let pre = name_of(&self.splitters, ignore_merges).ok_or_else(|| {
            unsupported(
                "a pre-tokenizer llama.cpp has no `tokenizer.ggml.pre` name for".to_string(),
            )
        })?;
        let tokens = self.model.tokens.clone();
        let mut token_types: Vec<i32> = tokens
            .iter()
            .map(|t| {
                if t.is_empty() {
                    TYPE_UNUSED
                } else {
                    TYPE_NORMAL
                }
            })
            .collect();
        for added in &self.added.tokens {
            if let Some(ty) = token_types.get_mut(added.id as usize) {
                *ty = if added.special {
                    TYPE_CONTROL
                } else {
                    TYPE_USER_DEFINED
                };
            }
        }
        let mut ranked: Vec<(u32, u32, u32)> = self
            .model
            .merges
            .iter()
            .map(|(&key, &(rank, _))| (rank, (key >> 32) as u32, key as u32))
            .collect();
        ranked.sort_unstable();
        let token = |id: u32| tokens.get(id as usize).map(String::as_str).unwrap_or("");
        let merges = ranked
            .iter()
            .map(|&(_, left, right)| format!("{} {}", token(left), token(right)))
            .collect();
        Ok(GgufVocab {
            path: Default::default(),
            model: "gpt2".to_string(),
            pre: Some(pre.to_string()),
            tokens,
            scores: Vec::new(),
            token_types,
            merges,
            bos: self.bos,
            eos: self.eos,
            unk: self.model.unk,
            add_space_prefix: None,
            add_bos: Some(self.add_bos),
            add_eos: Some(self.add_eos),
        })
    }
}
