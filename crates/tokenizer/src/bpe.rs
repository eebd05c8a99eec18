//! The BPE model: initial symbols for a word (bytes or characters), then merges by rank until none applies.
//!
//! Merges are stored as a map from an adjacent id pair to `(rank, merged id)`. For `tokenizer.json` and
//! `merges.txt` the rank is the merge's line; for tiktoken files, where a token's rank is the priority of every
//! split that forms it, each split of each token into two tokens becomes a pair with the token's rank. Both
//! conventions then run the same loop: merge the lowest-rank adjacent pair, leftmost first on ties.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use crate::error::{Result, TokenizerError};

/// How a word becomes the symbols merging starts from.
#[derive(Debug, Clone)]
pub(crate) enum Symbols {
    /// Byte-level BPE: one symbol per byte (`None` where the vocabulary lacks that byte).
    Bytes(Box<[Option<u32>; 256]>),
    /// Character-level BPE (SentencePiece style): one symbol per character found in the vocabulary; a character
    /// that is not falls back to its UTF-8 bytes as `<0xNN>` tokens when `byte_fallback` is set.
    Chars {
        /// The ids of `<0x00>`..`<0xFF>`, when the model uses byte fallback and has all of them.
        byte_fallback: Option<Box<[u32; 256]>>,
    },
}

/// Words above this many symbols merge with a heap instead of a linear scan per merge.
const SCAN_LIMIT: usize = 48;

/// Vocabulary plus merges.
#[derive(Debug, Clone)]
pub(crate) struct BpeModel {
    /// Token string as written in the vocabulary, by id (byte-level tokens in GPT-2's printable mapping).
    pub tokens: Vec<String>,
    /// Inverse of `tokens`.
    pub token_ids: FxHashMap<String, u32>,
    /// `pair_key(left, right)` -> (rank, merged id).
    pub merges: FxHashMap<u64, (u32, u32)>,
    /// How words become initial symbols.
    pub symbols: Symbols,
    /// The unknown token, for symbols the vocabulary lacks.
    pub unk: Option<u32>,
    /// Whether consecutive unknown symbols collapse into one.
    pub fuse_unk: bool,
    /// A word that is itself a token is emitted whole without merging (tiktoken's and LLaMA-3's rule). Keys are
    /// the word's raw bytes.
    pub whole_words: Option<FxHashMap<Box<[u8]>, u32>>,
}

#[inline]
pub(crate) fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

impl BpeModel {
    /// Builds the whole-word table for `ignore_merges` from raw token bytes.
    pub fn whole_word_table(token_bytes: &[Vec<u8>]) -> FxHashMap<Box<[u8]>, u32> {
        let mut table = FxHashMap::default();
        for (id, bytes) in token_bytes.iter().enumerate() {
            table
                .entry(bytes.clone().into_boxed_slice())
                .or_insert(id as u32);
        }
        table
    }

    /// Appends the ids of `word` to `out`.
    pub fn encode_word(&self, word: &str, out: &mut Vec<u32>) -> Result<()> {
        if let Some(table) = &self.whole_words
            && let Some(&id) = table.get(word.as_bytes())
        {
            out.push(id);
            return Ok(());
        }
        let start = out.len();
        match &self.symbols {
            Symbols::Bytes(byte_ids) => {
                for &b in word.as_bytes() {
                    self.push_symbol(byte_ids[usize::from(b)], out, word)?;
                }
            }
            Symbols::Chars { byte_fallback } => {
                for (i, c) in word.char_indices() {
                    if let Some(&id) = self.token_ids.get(&word[i..i + c.len_utf8()]) {
                        out.push(id);
                    } else if let Some(bytes) = byte_fallback {
                        let mut buf = [0u8; 4];
                        out.extend(
                            c.encode_utf8(&mut buf)
                                .bytes()
                                .map(|b| bytes[usize::from(b)]),
                        );
                    } else {
                        self.push_symbol(None, out, word)?;
                    }
                }
            }
        }
        self.merge(out, start);
        Ok(())
    }

    fn push_symbol(&self, id: Option<u32>, out: &mut Vec<u32>, word: &str) -> Result<()> {
        match (id, self.unk) {
            (Some(id), _) => out.push(id),
            (None, Some(unk)) => {
                if !(self.fuse_unk && out.last() == Some(&unk)) {
                    out.push(unk);
                }
            }
            (None, None) => return Err(TokenizerError::Untokenizable(word.to_owned())),
        }
        Ok(())
    }

    #[inline]
    fn lookup(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.merges.get(&pair_key(left, right)).copied()
    }

    /// Applies merges to `ids[start..]` in place.
    fn merge(&self, ids: &mut Vec<u32>, start: usize) {
        let n = ids.len() - start;
        if n < 2 {
            return;
        }
        if n <= SCAN_LIMIT {
            self.merge_scan(ids, start)
        } else {
            self.merge_heap(ids, start)
        }
    }

    /// O(n^2) in symbols but allocation-free and fastest for the short words pre-tokenizers produce.
    fn merge_scan(&self, ids: &mut Vec<u32>, start: usize) {
        let mut ranks = [(u32::MAX, 0u32); SCAN_LIMIT];
        let mut len = ids.len() - start;
        let w = &mut ids[start..];
        for i in 0..len - 1 {
            ranks[i] = self.lookup(w[i], w[i + 1]).unwrap_or((u32::MAX, 0));
        }
        loop {
            let mut best = u32::MAX;
            let mut at = 0;
            for (i, &(rank, _)) in ranks[..len - 1].iter().enumerate() {
                if rank < best {
                    best = rank;
                    at = i;
                }
            }
            if best == u32::MAX {
                break;
            }
            w[at] = ranks[at].1;
            w.copy_within(at + 2..len, at + 1);
            ranks.copy_within(at + 1..len - 1, at);
            len -= 1;
            if at + 1 < len {
                ranks[at] = self.lookup(w[at], w[at + 1]).unwrap_or((u32::MAX, 0));
            }
            if at > 0 {
                ranks[at - 1] = self.lookup(w[at - 1], w[at]).unwrap_or((u32::MAX, 0));
            }
            if len < 2 {
                break;
            }
        }
        ids.truncate(start + len);
    }

    /// O(n log n): a doubly linked list over the symbols and a heap of candidate merges, checked when popped.
    fn merge_heap(&self, ids: &mut Vec<u32>, start: usize) {
        const NONE: usize = usize::MAX;
        let n = ids.len() - start;
        let mut sym: Vec<u32> = ids[start..].to_vec();
        let mut next: Vec<usize> = (1..=n).map(|i| if i == n { NONE } else { i }).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| if i == 0 { NONE } else { i - 1 }).collect();
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::new();
        for i in 0..n - 1 {
            if let Some((rank, _)) = self.lookup(sym[i], sym[i + 1]) {
                heap.push(Reverse((rank, i)));
            }
        }
        while let Some(Reverse((rank, i))) = heap.pop() {
            let j = next[i];
            if !alive[i] || j == NONE {
                continue;
            }
            let Some((current, merged)) = self.lookup(sym[i], sym[j]) else {
                continue;
            };
            if current != rank {
                continue;
            }
            sym[i] = merged;
            alive[j] = false;
            next[i] = next[j];
            if next[j] != NONE {
                prev[next[j]] = i;
                if let Some((r, _)) = self.lookup(sym[i], sym[next[j]]) {
                    heap.push(Reverse((r, i)));
                }
            }
            if prev[i] != NONE
                && let Some((r, _)) = self.lookup(sym[prev[i]], sym[i])
            {
                heap.push(Reverse((r, prev[i])));
            }
        }
        ids.truncate(start);
        ids.extend((0..n).filter(|&i| alive[i]).map(|i| sym[i]));
    }
}
