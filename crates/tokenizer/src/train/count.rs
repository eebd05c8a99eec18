//! Word counting: GPT-2 pre-tokenization of the corpus, in parallel over newline-aligned chunks.

use rayon::prelude::*;
use rustc_hash::FxHashMap;

use crate::pretokenize::Splitter;
use crate::train::TrainProgress;

/// Chunk size for parallel counting.
const CHUNK: usize = 1 << 20;

/// Distinct words (raw bytes) with their counts, sorted by bytes so training does not depend on hashing order.
pub(crate) fn count_words<S: AsRef<str> + Sync>(
    texts: &[S],
    progress: &mut dyn TrainProgress,
) -> Vec<(Vec<u8>, u64)> {
    let mut total: FxHashMap<&str, u64> = FxHashMap::default();
    for text in texts {
        let text = text.as_ref();
        let chunks = chunks(text);
        let partial: Vec<FxHashMap<&str, u64>> = chunks
            .par_iter()
            .map(|chunk| {
                let mut counts = FxHashMap::default();
                Splitter::Gpt2.split(chunk, &mut |w| *counts.entry(w).or_insert(0) += 1);
                counts
            })
            .collect();
        for counts in partial {
            for (w, c) in counts {
                *total.entry(w).or_insert(0) += c;
            }
        }
        progress.advance(text.len() as u64);
    }
    let mut words: Vec<(Vec<u8>, u64)> = total
        .into_iter()
        .map(|(w, c)| (w.as_bytes().to_vec(), c))
        .collect();
    words.sort_unstable();
    words
}

/// Splits `text` into pieces of about [`CHUNK`] bytes, cut after a lone newline between two ASCII
/// non-whitespace characters (`x\nY`). GPT-2's pattern makes that newline a piece of its own both in the whole
/// text and at the end of a chunk (a newline is never the optional prefix of the next word), so counting each
/// chunk separately gives the same words as counting the whole text.
fn chunks(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    while text.len() - start > CHUNK {
        let mut cut = start + CHUNK;
        let solid = |b: u8| b.is_ascii() && !b.is_ascii_whitespace();
        while cut < bytes.len()
            && !(bytes[cut - 1] == b'\n' && solid(bytes[cut]) && solid(bytes[cut - 2]))
        {
            cut += 1;
        }
        out.push(&text[start..cut]);
        start = cut;
    }
    out.push(&text[start..]);
    out
}
