//! The prefix cache: sequences kept in the pool after their requests ended, found again by the hash of their
//! block-aligned token prefixes, so a new prompt that starts the same way (a shared system prompt, a
//! conversation's earlier turns) forks their blocks instead of running those tokens again.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use ember_optimization::SeqId;

/// A cached sequence: its pool sequence and the tokens it holds.
#[derive(Debug)]
struct Entry {
    seq: SeqId,
    tokens: Vec<u32>,
    last_used: u64,
}

/// Cached sequences, looked up by the chained hash of each full block of their tokens (as vLLM's block hashes:
/// block `k`'s hash covers every token before it, so equal hashes mean equal prefixes up to a collision, which
/// the token comparison rules out).
#[derive(Debug)]
pub(crate) struct PrefixCache {
    block_size: usize,
    max_entries: usize,
    entries: BTreeMap<u64, Entry>,
    /// Hash of the first `k` blocks -> the newest entry holding them.
    by_hash: HashMap<u64, u64>,
    next_id: u64,
    clock: u64,
}

/// The chained hashes of every full block of `tokens`.
fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut hashes = Vec::with_capacity(tokens.len() / block_size);
    let mut previous = 0u64;
    for block in tokens.chunks_exact(block_size) {
        // DefaultHasher::new() has fixed keys: the same tokens hash the same in every run.
        let mut h = DefaultHasher::new();
        previous.hash(&mut h);
        block.hash(&mut h);
        previous = h.finish();
        hashes.push(previous);
    }
    hashes
}

impl PrefixCache {
    /// A cache of at most `max_entries` sequences over a pool of `block_size`-position blocks.
    pub fn new(block_size: usize, max_entries: usize) -> Self {
        Self {
            block_size,
            max_entries,
            entries: BTreeMap::new(),
            by_hash: HashMap::new(),
            next_id: 0,
            clock: 0,
        }
    }

    /// Cached sequences.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The cached sequence sharing the longest prefix with `prompt`, and that length: at least one full block,
    /// at most `prompt.len() - 1` (the last prompt token must run, to give the next token's logits).
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(SeqId, usize)> {
        let mut best = None;
        for (k, hash) in block_hashes(prompt, self.block_size).iter().enumerate() {
            let Some(&id) = self.by_hash.get(hash) else {
                break;
            };
            let end = (k + 1) * self.block_size;
            match self.entries.get(&id) {
                Some(e) if e.tokens.len() >= end && e.tokens[..end] == prompt[..end] => {
                    best = Some(id)
                }
                _ => break,
            }
        }
        let id = best?;
        self.clock += 1;
        let entry = self.entries.get_mut(&id)?;
        entry.last_used = self.clock;
        // Past the last matching full block the entry may still agree for a partial block.
        let common = entry
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        (common > 0).then_some((entry.seq, common))
    }

    /// Keeps `seq`, which holds `tokens`, unless it has no full block. Returns the sequences the caller must
    /// free: entries it makes redundant (their tokens are a prefix of `tokens`), the oldest entries past the
    /// size limit, or `seq` itself when it is not kept.
    pub fn insert(&mut self, seq: SeqId, tokens: Vec<u32>) -> Vec<SeqId> {
        let hashes = block_hashes(&tokens, self.block_size);
        if hashes.is_empty() || self.max_entries == 0 {
            return vec![seq];
        }
        let mut released = Vec::new();
        let redundant: Vec<u64> = hashes
            .iter()
            .filter_map(|h| self.by_hash.get(h).copied())
            .filter(|id| {
                self.entries
                    .get(id)
                    .is_some_and(|e| tokens.starts_with(&e.tokens))
            })
            .collect();
        for id in redundant {
            released.extend(self.remove(id));
        }
        self.clock += 1;
        let id = self.next_id;
        self.next_id += 1;
        for h in hashes {
            self.by_hash.insert(h, id);
        }
        self.entries.insert(
            id,
            Entry {
                seq,
                tokens,
                last_used: self.clock,
            },
        );
        while self.entries.len() > self.max_entries {
            match self.evict_lru() {
                Some(seq) => released.push(seq),
                None => break,
            }
        }
        released
    }

    /// Drops the least recently used entry; its sequence, for the caller to free.
    pub fn evict_lru(&mut self) -> Option<SeqId> {
        let id = self
            .entries
            .iter()
            .min_by_key(|(_, e)| e.last_used)
            .map(|(&id, _)| id)?;
        self.remove(id)
    }

    fn remove(&mut self, id: u64) -> Option<SeqId> {
        let entry = self.entries.remove(&id)?;
        for h in block_hashes(&entry.tokens, self.block_size) {
            if self.by_hash.get(&h) == Some(&id) {
                self.by_hash.remove(&h);
            }
        }
        Some(entry.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_longest_cached_prefix_and_keeps_one_token_to_run() {
        let mut cache = PrefixCache::new(4, 8);
        assert!(cache.insert(SeqId(1), (0..10).collect()).is_empty());
        // 9 shared tokens: two full blocks by hash, then one more of the partial block.
        let prompt: Vec<u32> = (0..9).chain([99, 98]).collect();
        assert_eq!(cache.lookup(&prompt), Some((SeqId(1), 9)));
        // The whole prompt cached: its last token still runs.
        assert_eq!(
            cache.lookup(&(0..8).collect::<Vec<_>>()),
            Some((SeqId(1), 7))
        );
        // Less than a full block in common: nothing to reuse by hash.
        assert_eq!(cache.lookup(&[0, 1, 2, 7, 7]), None);
        assert_eq!(cache.lookup(&[5, 1, 2, 3, 4, 5]), None);
    }

    #[test]
    fn a_longer_sequence_replaces_the_entries_it_extends_and_lru_bounds_the_size() {
        let mut cache = PrefixCache::new(2, 2);
        assert!(cache.insert(SeqId(1), vec![1, 2, 3]).is_empty());
        // The conversation grew: the old entry is a prefix of the new one, so it is released.
        assert_eq!(cache.insert(SeqId(2), vec![1, 2, 3, 4, 5]), vec![SeqId(1)]);
        assert_eq!(cache.len(), 1);
        assert!(cache.insert(SeqId(3), vec![7, 7, 7]).is_empty());
        cache.lookup(&[1, 2, 3, 4, 9]);
        // Over the limit: the least recently used (SeqId 3, never looked up since insertion) goes.
        assert_eq!(cache.insert(SeqId(4), vec![8, 8, 8]), vec![SeqId(3)]);
        assert_eq!(cache.lookup(&[7, 7, 7, 7]), None);
        assert_eq!(cache.lookup(&[1, 2, 3, 4, 9]), Some((SeqId(2), 4)));
        // A sequence without one full block is not kept.
        assert_eq!(cache.insert(SeqId(5), vec![1]), vec![SeqId(5)]);
    }
}
