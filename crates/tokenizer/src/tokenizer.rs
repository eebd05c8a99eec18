//! [`Tokenizer`]: the encode/decode pipeline (added tokens, normalization, pre-tokenization, BPE).

use std::borrow::Cow;

use rayon::prelude::*;
use rustc_hash::FxHashMap;

use crate::added::{AddedToken, AddedVocab, Segment};
use crate::bpe::BpeModel;
use crate::error::{Result, TokenizerError};
use crate::normalize::Normalize;
use crate::pretokenize::Splitter;

/// Distinct words cached per encode call; beyond this, new words are encoded without caching so memory stays
/// bounded on pathological input.
const CACHE_WORDS: usize = 1 << 16;

/// The pieces a loader assembles into a [`Tokenizer`].
#[derive(Debug, Clone)]
pub(crate) struct Parts {
    pub model: BpeModel,
    pub normalizers: Vec<Normalize>,
    pub splitters: Vec<Splitter>,
    /// HF `ByteLevel` `add_prefix_space`: a space is prepended to each piece that does not start with one.
    pub prefix_space: bool,
    pub added: Vec<AddedToken>,
    /// Raw bytes of each model token, by id (added tokens are filled in from their content).
    pub token_bytes: Vec<Vec<u8>>,
    /// The decoder drops one leading space of the decoded text (SentencePiece's prepended `▁`).
    pub strip_leading_space: bool,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Whether [`Tokenizer::encode_with_special`] starts a sequence with BOS / ends it with EOS.
    pub add_bos: bool,
    pub add_eos: bool,
}

/// A loaded tokenizer. Cheap to share between threads (`&Tokenizer` is `Sync`); see [`Tokenizer::from_path`].
#[derive(Debug, Clone)]
pub struct Tokenizer {
    pub(crate) model: BpeModel,
    pub(crate) normalizers: Vec<Normalize>,
    pub(crate) splitters: Vec<Splitter>,
    pub(crate) prefix_space: bool,
    pub(crate) added: AddedVocab,
    pub(crate) token_bytes: Vec<Box<[u8]>>,
    pub(crate) strip_leading_space: bool,
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
}

impl Tokenizer {
    pub(crate) fn from_parts(mut parts: Parts) -> Self {
        for t in &parts.added {
            let id = t.id as usize;
            if id >= parts.model.tokens.len() {
                parts.model.tokens.resize(id + 1, String::new());
            }
            if id >= parts.token_bytes.len() {
                parts.token_bytes.resize(id + 1, Vec::new());
            }
            parts.model.tokens[id].clone_from(&t.content);
            parts.token_bytes[id] = t.content.as_bytes().to_vec();
            parts.model.token_ids.insert(t.content.clone(), t.id);
        }
        parts
            .token_bytes
            .resize(parts.model.tokens.len(), Vec::new());
        Self {
            model: parts.model,
            normalizers: parts.normalizers,
            splitters: parts.splitters,
            prefix_space: parts.prefix_space,
            added: AddedVocab::new(parts.added),
            token_bytes: parts
                .token_bytes
                .into_iter()
                .map(Vec::into_boxed_slice)
                .collect(),
            strip_leading_space: parts.strip_leading_space,
            bos: parts.bos,
            eos: parts.eos,
            add_bos: parts.add_bos && parts.bos.is_some(),
            add_eos: parts.add_eos && parts.eos.is_some(),
        }
    }

    /// Encodes `text`; added and special tokens written in it (e.g. `<|endoftext|>`) become their ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_impl(text, true)
    }

    /// Encodes `text` treating special tokens written in it as plain text, so untrusted input cannot inject
    /// control tokens. Ordinary added words (a vocabulary's whitespace runs, user-defined tokens) are still
    /// matched: they are part of the vocabulary's ordinary tokenization.
    pub fn encode_ordinary(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_impl(text, false)
    }

    /// Encodes many documents in parallel on the rayon thread pool (special tokens recognised, as in
    /// [`Tokenizer::encode`]). The result is in input order.
    pub fn encode_batch<S: AsRef<str> + Sync>(&self, texts: &[S]) -> Result<Vec<Vec<u32>>> {
        texts.par_iter().map(|t| self.encode(t.as_ref())).collect()
    }

    fn encode_impl(&self, text: &str, allow_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut segments = Vec::new();
        self.added.split(text, allow_special, &mut segments);
        for segment in segments {
            match segment {
                Segment::Token(id) => out.push(id),
                Segment::Text(start, end) => {
                    self.encode_segment(&text[start..end], start, &mut out)?
                }
            }
        }
        Ok(out)
    }

    fn encode_segment(&self, text: &str, offset: usize, out: &mut Vec<u32>) -> Result<()> {
        let mut normalized = Cow::Borrowed(text);
        for n in &self.normalizers {
            normalized = n.apply(normalized, offset);
        }
        if self.prefix_space && !normalized.starts_with(' ') {
            normalized = Cow::Owned(format!(" {normalized}"));
        }
        self.encode_words(&normalized, out)
    }

    fn encode_words<'a>(&self, normalized: &'a str, out: &mut Vec<u32>) -> Result<()> {
        let mut cache = WordCache::default();
        let mut error = None;
        let mut encode_word = |word: &'a str| {
            if error.is_none()
                && let Err(e) = cache.encode(&self.model, word, out)
            {
                error = Some(e);
            }
        };
        match self.splitters.as_slice() {
            [] => encode_word(normalized),
            [only] => only.split(normalized, &mut encode_word),
            many => split_nested(many, normalized, &mut encode_word),
        }
        error.map_or(Ok(()), Err)
    }

    /// The raw bytes `ids` stand for (no UTF-8 validation; see [`Tokenizer::decode`]).
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id)?);
        }
        if self.strip_leading_space && out.first() == Some(&b' ') {
            out.remove(0);
        }
        Ok(out)
    }

    /// Where each of `ids` ends in the bytes [`Tokenizer::decode_bytes`] gives for them: token `i` covers
    /// `ends[i - 1]..ends[i]` (from 0 for the first). A leading space the decoder strips is taken off the first
    /// token, so a token that was only that space covers nothing.
    pub fn token_ends(&self, ids: &[u32]) -> Result<Vec<usize>> {
        let mut ends = Vec::with_capacity(ids.len());
        let mut at = 0usize;
        let mut strip = self.strip_leading_space;
        for &id in ids {
            let bytes = self.token_bytes(id)?;
            at += bytes.len();
            if strip && !bytes.is_empty() {
                if bytes[0] == b' ' {
                    at -= 1;
                }
                strip = false;
            }
            ends.push(at);
        }
        Ok(ends)
    }

    /// Decodes `ids` to text; byte sequences that are not valid UTF-8 become U+FFFD (as tiktoken and HF do).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }

    /// A decoder for token-by-token generation that only emits complete UTF-8 characters.
    pub fn stream_decoder(&self) -> crate::StreamDecoder<'_> {
        crate::StreamDecoder::new(self)
    }

    pub(crate) fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        self.token_bytes
            .get(id as usize)
            .map(|b| &**b)
            .ok_or(TokenizerError::UnknownId {
                id,
                vocab_size: self.vocab_size(),
            })
    }

    pub(crate) fn strips_leading_space(&self) -> bool {
        self.strip_leading_space
    }

    /// Number of ids, added tokens included (ids are `0..vocab_size`).
    pub fn vocab_size(&self) -> usize {
        self.model.tokens.len()
    }

    /// The id of a token written as in the vocabulary file (byte-level tokens use GPT-2's printable mapping,
    /// e.g. `Ġthe`), or of an added token.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.model.token_ids.get(token).copied()
    }

    /// The vocabulary string of `id` (inverse of [`Tokenizer::token_to_id`]).
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.model.tokens.get(id as usize).map(String::as_str)
    }

    /// The added tokens (special tokens and added words), in id order.
    pub fn added_tokens(&self) -> &[AddedToken] {
        &self.added.tokens
    }

    /// The beginning-of-sequence token, when the tokenizer declares one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence / end-of-text token, when the tokenizer declares one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether a sequence starts with BOS and ends with EOS (a GGUF file's `tokenizer.ggml.add_bos_token` /
    /// `add_eos_token`, with llama.cpp's defaults when absent); what [`Tokenizer::encode_with_special`] adds.
    pub fn adds_special(&self) -> (bool, bool) {
        (self.add_bos, self.add_eos)
    }

    /// [`Tokenizer::encode`] with the sequence's BOS / EOS added as the tokenizer declares
    /// ([`Tokenizer::adds_special`]): what HF's `encode(text)` (`add_special_tokens=True`) and llama.cpp's
    /// `llama_tokenize(..., add_special=true)` give.
    pub fn encode_with_special(&self, text: &str) -> Result<Vec<u32>> {
        let ids = self.encode(text)?;
        Ok(self.with_special(ids))
    }

    /// `ids` with the BOS / EOS of [`Tokenizer::adds_special`] around them.
    pub fn with_special(&self, ids: Vec<u32>) -> Vec<u32> {
        let mut out = Vec::with_capacity(ids.len() + 2);
        out.extend(self.bos.filter(|_| self.add_bos));
        out.extend(ids);
        out.extend(self.eos.filter(|_| self.add_eos));
        out
    }
}

fn split_nested<'a>(splitters: &[Splitter], text: &'a str, f: &mut dyn FnMut(&'a str)) {
    match splitters.split_first() {
        None => f(text),
        Some((first, rest)) => first.split(text, &mut |piece| split_nested(rest, piece, f)),
    }
}

/// Ids of words already encoded in this call, stored contiguously.
#[derive(Default)]
struct WordCache<'a> {
    index: FxHashMap<&'a str, (u32, u32)>,
    ids: Vec<u32>,
}

impl<'a> WordCache<'a> {
    fn encode(&mut self, model: &BpeModel, word: &'a str, out: &mut Vec<u32>) -> Result<()> {
        if let Some(&(start, len)) = self.index.get(word) {
            out.extend_from_slice(&self.ids[start as usize..(start + len) as usize]);
            return Ok(());
        }
        let from = out.len();
        model.encode_word(word, out)?;
        if self.index.len() < CACHE_WORDS {
            let start = self.ids.len() as u32;
            self.ids.extend_from_slice(&out[from..]);
            self.index.insert(word, (start, (out.len() - from) as u32));
        }
        Ok(())
    }
}
