//! Byte-level BPE training ([`BpeTrainer`]) and its `tokenizer.json` output.

mod count;
mod merge;
mod serialize;

use std::path::{Path, PathBuf};

use crate::error::{Result, TokenizerError};
use crate::tokenizer::Tokenizer;

pub use serialize::TrainedBpe;

/// Receives progress while training runs (the CLI draws a bar from it; the library draws nothing).
pub trait TrainProgress {
    /// A phase begins; `total` is its amount of work in its own unit (bytes read, merges learned).
    fn phase(&mut self, _name: &str, _total: u64) {}
    /// `done` more units of the current phase are finished.
    fn advance(&mut self, _done: u64) {}
}

/// A [`TrainProgress`] that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl TrainProgress for NoProgress {}

/// Learns a byte-level BPE (GPT-2 pre-tokenization and byte mapping) from text.
///
/// Words are counted once; each merge then updates only the pair counts of the words that contain the merged
/// pair, and the next pair comes from a priority queue (highest count, then lowest pair of ids), which is the
/// rule HF `tokenizers`' `BpeTrainer` uses, so the result is deterministic for a given input.
#[derive(Debug, Clone)]
pub struct BpeTrainer {
    vocab_size: usize,
    special_tokens: Vec<String>,
    min_frequency: u64,
}

impl BpeTrainer {
    /// A trainer for `vocab_size` tokens in total (special tokens and the 256 byte tokens included).
    pub fn new(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            special_tokens: Vec::new(),
            min_frequency: 0,
        }
    }

    /// Special tokens, given the first ids in this order.
    pub fn special_tokens(mut self, tokens: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.special_tokens = tokens.into_iter().map(Into::into).collect();
        self
    }

    /// Pairs seen fewer times than this are never merged (default 0: merge until the vocabulary is full or no
    /// pair is left).
    pub fn min_frequency(mut self, min: u64) -> Self {
        self.min_frequency = min;
        self
    }

    /// Trains on in-memory documents.
    pub fn train_texts<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        progress: &mut dyn TrainProgress,
    ) -> Result<TrainedBpe> {
        let minimum = self.special_tokens.len() + 256;
        if self.vocab_size < minimum {
            return Err(TokenizerError::Training(format!(
                "vocab size {} is below {minimum} (256 byte tokens + {} special tokens)",
                self.vocab_size,
                self.special_tokens.len()
            )));
        }
        let total: u64 = texts.iter().map(|t| t.as_ref().len() as u64).sum();
        progress.phase("counting words", total);
        let words = count::count_words(texts, progress);
        let merges_wanted = self.vocab_size - minimum;
        progress.phase("learning merges", merges_wanted as u64);
        let learned = merge::learn(
            &words,
            &self.special_tokens,
            self.vocab_size,
            self.min_frequency,
            progress,
        );
        Ok(TrainedBpe::new(&self.special_tokens, learned))
    }

    /// Trains on text files (each file is one document; it must be UTF-8).
    pub fn train_files(
        &self,
        files: &[PathBuf],
        progress: &mut dyn TrainProgress,
    ) -> Result<TrainedBpe> {
        let texts = files
            .iter()
            .map(|f| {
                let bytes = std::fs::read(f).map_err(|e| TokenizerError::io(f, e))?;
                String::from_utf8(bytes).map_err(|e| {
                    TokenizerError::malformed(
                        f,
                        format!("not UTF-8 (byte {})", e.utf8_error().valid_up_to()),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.train_texts(&texts, progress)
    }
}

/// Trains a byte-level BPE of `vocab_size` tokens on `files`, writes `out_dir/tokenizer.json`, and returns the
/// loaded tokenizer: what a training config's `tokenizer:` section asks for.
pub fn train_tokenizer_files(
    files: &[PathBuf],
    vocab_size: usize,
    special_tokens: &[String],
    out_dir: &Path,
    progress: &mut dyn TrainProgress,
) -> Result<Tokenizer> {
    let trained = BpeTrainer::new(vocab_size)
        .special_tokens(special_tokens.iter().cloned())
        .train_files(files, progress)?;
    trained.save(out_dir)?;
    trained.tokenizer()
}
