//! A tokenizer as the `tokenizer.ggml.*` arrays of a GGUF file ([`GgufVocab`]), for writing models llama.cpp
//! runs: the inverse of [`Tokenizer::from_gguf_vocab`]. Byte-level BPE goes in as llama.cpp's `gpt2` model (tokens
//! and merges); SentencePiece-style BPE as its `llama` model, whose merges are not stored but follow from token
//! scores (the adjacent pair forming the highest-scoring token merges first).

use crate::bpe::Symbols;
use crate::error::{Result, TokenizerError};
use crate::load::GgufVocab;
use crate::load::gguf::{
    TYPE_BYTE, TYPE_CONTROL, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_UNUSED, TYPE_USER_DEFINED,
};
use crate::load::gguf_pre::name_of;
use crate::normalize::{Normalize, Prepend};
use crate::tokenizer::Tokenizer;

impl Tokenizer {
    /// This tokenizer as a GGUF vocabulary, such that [`Tokenizer::from_gguf_vocab`] (and llama.cpp) rebuilds one
    /// that encodes every text alike: byte-level BPE with a pre-tokenizer llama.cpp knows by name as `gpt2`,
    /// SentencePiece-style BPE whose merges scores can express as `llama`. Anything else is an error saying what.
    pub fn to_gguf_vocab(&self) -> Result<GgufVocab> {
        if let Symbols::Chars { byte_fallback } = &self.model.symbols {
            let byte_ids = byte_fallback.as_deref().map_or(&[][..], |ids| &ids[..]);
            return self.sentencepiece_vocab(byte_ids);
        }
        // NFC is the one normalizer byte-level vocabularies carry (Qwen 2's); GGUF has no key for it and
        // llama.cpp's converter drops it, so the file tokenizes NFC text alike and other text as llama.cpp does.
        if let Some(normalizer) = self
            .normalizers
            .iter()
            .find(|n| !matches!(n, Normalize::Nfc))
        {
            return Err(unsupported_layout(format!(
                "a byte-level vocabulary with a normalizer ({normalizer:?}); llama.cpp's `gpt2` vocabularies \
                 have none"
            )));
        }
        if self.prefix_space || self.strip_leading_space {
            return Err(unsupported_layout(
                "a byte-level vocabulary that adds a prefix space; llama.cpp's `gpt2` vocabularies do not"
                    .into(),
            ));
        }
        let ignore_merges = self.model.whole_words.is_some();
        let pre = name_of(&self.splitters, ignore_merges).ok_or_else(|| {
            unsupported_layout(
                "a pre-tokenizer llama.cpp has no `tokenizer.ggml.pre` name for".to_string(),
            )
        })?;
        let tokens = self.model.tokens.clone();
        let token_types = self.token_types(&[]);
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

    /// llama.cpp's token type of each id: added tokens control (special) or user-defined, the unknown token
    /// unknown, `byte_ids` (the byte-fallback tokens) byte, empty slots unused, the rest normal.
    fn token_types(&self, byte_ids: &[u32]) -> Vec<i32> {
        let mut types: Vec<i32> = self
            .model
            .tokens
            .iter()
            .map(|t| {
                if t.is_empty() {
                    TYPE_UNUSED
                } else {
                    TYPE_NORMAL
                }
            })
            .collect();
        for &id in byte_ids {
            if let Some(ty) = types.get_mut(id as usize) {
                *ty = TYPE_BYTE;
            }
        }
        for added in &self.added.tokens {
            if let Some(ty) = types.get_mut(added.id as usize) {
                *ty = if added.special {
                    TYPE_CONTROL
                } else {
                    TYPE_USER_DEFINED
                };
            }
        }
        if let Some(ty) = self.model.unk.and_then(|id| types.get_mut(id as usize)) {
            *ty = TYPE_UNKNOWN;
        }
        types
    }

    /// The `llama` (SentencePiece) vocabulary: each token's score is minus the rank of the first merge that forms
    /// it, so llama.cpp's rule (merge the adjacent pair whose token scores highest) replays the merges in order.
    /// That holds only when the merges are SentencePiece's own (every split of a token into two tokens merges to
    /// it, the splits of one token adjacent in rank), as in every `tokenizer.json` converted from a SentencePiece
    /// model; the vocabulary is read back here and its merges compared, so merges learnt otherwise are refused
    /// rather than written to tokenize differently.
    fn sentencepiece_vocab(&self, byte_ids: &[u32]) -> Result<GgufVocab> {
        let add_space_prefix = self.sentencepiece_prefix()?;
        if !self.splitters.is_empty() || self.prefix_space || self.model.whole_words.is_some() {
            return Err(unsupported_layout(
                "a SentencePiece-style vocabulary with a pre-tokenizer that splits words; llama.cpp's `llama` \
                 vocabularies take the whole text"
                    .into(),
            ));
        }
        let n = self.model.tokens.len();
        let mut first_rank = vec![u32::MAX; n];
        for &(rank, merged) in self.model.merges.values() {
            if let Some(r) = first_rank.get_mut(merged as usize) {
                *r = (*r).min(rank);
            }
        }
        // Tokens no merge forms come after every merged one, in id order, as SentencePiece scores its pieces.
        let merges = self.model.merges.len() as f32;
        let scores: Vec<f32> = first_rank
            .iter()
            .enumerate()
            .map(|(id, &rank)| {
                if rank == u32::MAX {
                    -(merges + id as f32)
                } else {
                    -(rank as f32)
                }
            })
            .collect();
        let vocab = GgufVocab {
            path: Default::default(),
            model: "llama".to_string(),
            pre: None,
            tokens: self.model.tokens.clone(),
            scores,
            token_types: self.token_types(byte_ids),
            merges: Vec::new(),
            bos: self.bos,
            eos: self.eos,
            unk: self.model.unk,
            add_space_prefix: Some(add_space_prefix),
            add_bos: Some(self.add_bos),
            add_eos: Some(self.add_eos),
        };
        let rebuilt = Tokenizer::from_gguf_vocab(vocab.clone())?;
        self.check_same_merges(&rebuilt)?;
        Ok(vocab)
    }

    /// `tokenizer.ggml.add_space_prefix` for this tokenizer's normalizers: the layouts SentencePiece models come
    /// in (LLaMA 2's `Prepend` + `Replace`, Mistral's `Metaspace`, Gemma's `Replace` alone, the GGUF reader's own).
    fn sentencepiece_prefix(&self) -> Result<bool> {
        const MARK: &str = "\u{2581}";
        let replace =
            |n: &Normalize| matches!(n, Normalize::Replace(from, to) if from == " " && to == MARK);
        let prefix = match self.normalizers.as_slice() {
            [Normalize::Prepend(p), r] if (p == MARK || p == " ") && replace(r) => Some(true),
            [r] if replace(r) => Some(false),
            [
                Normalize::Metaspace {
                    replacement: '\u{2581}',
                    prepend,
                },
            ] => Some(*prepend != Prepend::Never),
            _ => None,
        };
        prefix.ok_or_else(|| {
            unsupported_layout(format!(
                "a SentencePiece-style vocabulary with normalizers {:?}; llama.cpp's `llama` vocabularies only \
                 replace spaces with `\u{2581}` and optionally prepend one",
                self.normalizers
            ))
        })
    }

    /// Fails unless `rebuilt` (this tokenizer read back from its `llama` vocabulary) merges every pair this one
    /// does, to the same token and in the same order. Pairs only the rebuilt one has are allowed where they form
    /// an added token, which is matched before merging and so never merged to.
    fn check_same_merges(&self, rebuilt: &Tokenizer) -> Result<()> {
        let token = |id: u32| {
            self.model
                .tokens
                .get(id as usize)
                .map(String::as_str)
                .unwrap_or("")
        };
        let mut ours: Vec<(u32, u64, u32)> = self
            .model
            .merges
            .iter()
            .map(|(&key, &(rank, merged))| (rank, key, merged))
            .collect();
        ours.sort_unstable();
        let differs = |key: u64, why: &str| {
            unsupported_layout(format!(
                "SentencePiece-style merges scores cannot express: the merge `{} {}` {why}; llama.cpp's `llama` \
                 vocabularies merge every split of a token, by the token's score (this tokenizer's merges were \
                 not converted from a SentencePiece model)",
                token((key >> 32) as u32),
                token(key as u32)
            ))
        };
        let mut last = 0;
        for &(_, key, merged) in &ours {
            match rebuilt.model.merges.get(&key) {
                Some(&(priority, id)) if id == merged => {
                    if priority < last {
                        return Err(differs(key, "would come before merges ranked ahead of it"));
                    }
                    last = priority;
                }
                _ => return Err(differs(key, "would not be made")),
            }
        }
        let added = |id: u32| self.added.tokens.iter().any(|t| t.id == id);
        if let Some((&key, _)) = rebuilt
            .model
            .merges
            .iter()
            .find(|(key, (_, id))| !self.model.merges.contains_key(key) && !added(*id))
        {
            return Err(differs(
                key,
                "is not one of this tokenizer's but would be made",
            ));
        }
        Ok(())
    }
}

fn unsupported_layout(what: String) -> TokenizerError {
    TokenizerError::Unsupported {
        path: "GGUF tokenizer.ggml".into(),
        what,
    }
}
