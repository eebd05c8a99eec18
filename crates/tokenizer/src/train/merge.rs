//! The merge-learning loop: pair counts kept up to date incrementally, next pair from a lazy priority queue.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::byte_level;
use crate::train::TrainProgress;

/// Result of training: the vocabulary by id and the merges in order.
pub(crate) struct Learned {
    /// Token strings (byte-level mapping) by id: special tokens, the 256 byte characters by code point, then one
    /// token per new string formed by a merge.
    pub vocab: Vec<String>,
    /// Merges by rank, as vocabulary strings.
    pub merges: Vec<(String, String)>,
}

type Pair = (u32, u32);

/// Replaces every non-overlapping occurrence of `pair` (leftmost first) by `new`, returning pair-count deltas.
fn merge_word(word: &mut Vec<u32>, pair: Pair, new: u32, deltas: &mut Vec<(Pair, i64)>) {
    let mut i = 0;
    while i + 1 < word.len() {
        if (word[i], word[i + 1]) == pair {
            if i > 0 {
                deltas.push(((word[i - 1], pair.0), -1));
                deltas.push(((word[i - 1], new), 1));
            }
            if i + 2 < word.len() {
                deltas.push(((pair.1, word[i + 2]), -1));
                deltas.push(((new, word[i + 2]), 1));
            }
            word[i] = new;
            word.remove(i + 1);
        }
        i += 1;
    }
}

pub(crate) fn learn(
    words: &[(Vec<u8>, u64)],
    specials: &[String],
    vocab_size: usize,
    min_frequency: u64,
    progress: &mut dyn TrainProgress,
) -> Learned {
    let mut vocab: Vec<String> = specials.to_vec();
    let mut alphabet: Vec<char> = (0..=255u8).map(byte_level::byte_to_char).collect();
    alphabet.sort_unstable();
    let mut byte_id = [0u32; 256];
    for c in alphabet {
        let b = byte_level::char_to_byte(c).expect("alphabet comes from the byte mapping");
        byte_id[usize::from(b)] = vocab.len() as u32;
        vocab.push(c.to_string());
    }
    let mut ids: FxHashMap<String, u32> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();

    let mut symbols: Vec<Vec<u32>> = words
        .iter()
        .map(|(w, _)| w.iter().map(|&b| byte_id[usize::from(b)]).collect())
        .collect();
    let counts: Vec<i64> = words.iter().map(|&(_, c)| c as i64).collect();
    let mut pair_counts: FxHashMap<Pair, i64> = FxHashMap::default();
    let mut where_found: FxHashMap<Pair, FxHashSet<u32>> = FxHashMap::default();
    for (w, word) in symbols.iter().enumerate() {
        for p in word.windows(2) {
            let pair = (p[0], p[1]);
            *pair_counts.entry(pair).or_insert(0) += counts[w];
            where_found.entry(pair).or_default().insert(w as u32);
        }
    }
    let mut queue: BinaryHeap<(i64, Reverse<Pair>)> =
        pair_counts.iter().map(|(&p, &c)| (c, Reverse(p))).collect();

    let mut merges = Vec::new();
    let mut deltas = Vec::new();
    while vocab.len() < vocab_size {
        let Some((count, Reverse(pair))) = queue.pop() else {
            break;
        };
        let current = pair_counts.get(&pair).copied().unwrap_or(0);
        if count != current {
            // Stale entry: the pair's count dropped since it was queued.
            if current > 0 {
                queue.push((current, Reverse(pair)));
            }
            continue;
        }
        if count < 1 || (count as u64) < min_frequency {
            break;
        }
        let (left, right) = (
            vocab[pair.0 as usize].clone(),
            vocab[pair.1 as usize].clone(),
        );
        let joined = format!("{left}{right}");
        let new = match ids.get(&joined) {
            Some(&id) => id,
            None => {
                let id = vocab.len() as u32;
                vocab.push(joined.clone());
                ids.insert(joined, id);
                id
            }
        };
        merges.push((left, right));
        progress.advance(1);

        let mut positions: Vec<u32> = where_found
            .remove(&pair)
            .unwrap_or_default()
            .into_iter()
            .collect();
        positions.sort_unstable();
        let mut touched: Vec<Pair> = Vec::new();
        for w in positions {
            deltas.clear();
            merge_word(&mut symbols[w as usize], pair, new, &mut deltas);
            for &(p, d) in &deltas {
                *pair_counts.entry(p).or_insert(0) += d * counts[w as usize];
                if d > 0 && where_found.entry(p).or_default().insert(w) {
                    touched.push(p);
                }
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for p in touched {
            let c = pair_counts[&p];
            if c > 0 {
                queue.push((c, Reverse(p)));
            }
        }
    }
    Learned { vocab, merges }
}
