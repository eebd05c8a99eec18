//! One split of a prepared corpus, memory-mapped and addressable as a single token stream.

use std::path::{Path, PathBuf};

use crate::error::{DatasetError, Result};
use crate::hash::stable_hash;
use crate::manifest::{Manifest, Split};
use crate::shard::MappedShard;

/// The shards of one split, mapped read-only and viewed as one contiguous stream of token ids.
///
/// Opening reads only the manifest and the 32-byte shard headers; token pages are loaded by the kernel when a
/// window touches them, so the resident memory stays proportional to what is read, not to the corpus.
#[derive(Debug)]
pub struct TokenDataset {
    dir: PathBuf,
    split: Split,
    manifest: Manifest,
    shards: Vec<MappedShard>,
    /// `starts[i]` is the stream position of shard `i`'s first id; `starts[len]` the stream length.
    starts: Vec<u64>,
}

impl TokenDataset {
    /// Maps the shards of `split` in the corpus directory `dir`, checking every shard header against the manifest
    /// (dtype, token count, tokenizer fingerprint) and every file length against its header.
    pub fn open(dir: &Path, split: Split) -> Result<Self> {
        let manifest = Manifest::load(dir)?;
        let digest = stable_hash(manifest.tokenizer.fingerprint.as_bytes());
        let mut shards = Vec::new();
        let mut starts = vec![0u64];
        for info in manifest.shards_of(split) {
            let path = dir.join(&info.file);
            let shard = MappedShard::open(&path)?;
            let header = shard.header();
            let mismatch = |message: String| DatasetError::ShardMismatch {
                path: path.clone(),
                message,
            };
            if header.dtype != manifest.dtype {
                return Err(mismatch(format!(
                    "dtype {:?}, the manifest says {:?}",
                    header.dtype, manifest.dtype
                )));
            }
            if header.tokens != info.tokens {
                return Err(mismatch(format!(
                    "{} tokens, the manifest says {}",
                    header.tokens, info.tokens
                )));
            }
            if header.fingerprint_digest != digest {
                return Err(mismatch(format!(
                    "written with tokenizer digest {:016x}, the manifest's tokenizer has digest {digest:016x}",
                    header.fingerprint_digest
                )));
            }
            // Each count is bounded by its file's size, so the sum cannot overflow.
            starts.push(starts[starts.len() - 1] + header.tokens);
            shards.push(shard);
        }
        let total = starts[starts.len() - 1];
        let declared = manifest.stats(split).tokens;
        if total != declared {
            return Err(DatasetError::Manifest {
                path: dir.join(crate::manifest::MANIFEST_FILE),
                message: format!(
                    "split `{split}` declares {declared} tokens, but its shards hold {total}"
                ),
            });
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            split,
            manifest,
            shards,
            starts,
        })
    }

    /// Like [`TokenDataset::open`], and also checks the corpus was prepared with the tokenizer whose fingerprint
    /// is `fingerprint` (a model must be trained on ids of its own tokenizer).
    pub fn open_for_tokenizer(dir: &Path, split: Split, fingerprint: &str) -> Result<Self> {
        let dataset = Self::open(dir, split)?;
        let prepared = &dataset.manifest.tokenizer.fingerprint;
        if prepared != fingerprint {
            return Err(DatasetError::Manifest {
                path: dir.join(crate::manifest::MANIFEST_FILE),
                message: format!(
                    "prepared with tokenizer fingerprint {prepared}, but the tokenizer in use is {fingerprint}"
                ),
            });
        }
        Ok(dataset)
    }

    /// The corpus directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The split this dataset reads.
    pub fn split(&self) -> Split {
        self.split
    }

    /// The corpus manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Total number of token ids in the split, derived from the shard file sizes.
    pub fn len(&self) -> u64 {
        self.starts[self.starts.len() - 1]
    }

    /// Whether the split holds no ids.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the ids at stream positions `start..start + out.len()` into `out`, reading across shard boundaries.
    ///
    /// Fails if the range runs past the end of the split.
    pub fn read(&self, start: u64, out: &mut [u32]) -> Result<()> {
        let end = start + out.len() as u64;
        if end > self.len() {
            return Err(DatasetError::InvalidOption(format!(
                "range {start}..{end} is outside split `{}` of {} ({} tokens)",
                self.split,
                self.dir.display(),
                self.len()
            )));
        }
        // The shard holding `start`: the last one starting at or before it.
        let mut shard = self.starts.partition_point(|&s| s <= start) - 1;
        let mut pos = start;
        let mut filled = 0;
        let vocab = self.manifest.tokenizer.vocab_size;
        while filled < out.len() {
            let local = pos - self.starts[shard];
            let take = ((self.starts[shard + 1] - pos) as usize).min(out.len() - filled);
            let chunk = &mut out[filled..filled + take];
            self.shards[shard].copy_to(local, chunk);
            // An id past the vocabulary would index past the model's embedding table. Checking the ids as they
            // are read costs one comparison each and keeps opening a corpus free of a full scan.
            if let Some(at) = chunk.iter().position(|&id| id as usize >= vocab) {
                return Err(DatasetError::ShardMismatch {
                    path: self.shards[shard].path().to_path_buf(),
                    message: format!(
                        "token {} is id {}, outside the manifest's vocabulary of {vocab} ids",
                        local + at as u64,
                        chunk[at]
                    ),
                });
            }
            filled += take;
            pos += take as u64;
            shard += 1;
        }
        Ok(())
    }
}
