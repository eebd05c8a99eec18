//! `manifest.json`: what a prepared corpus directory holds and how it was made.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{DatasetError, Result};
use crate::shard::TokenDtype;

/// File name of the manifest inside a prepared corpus directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The manifest format version this crate writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

/// One of the two splits of a prepared corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// The training split.
    Train,
    /// The held-out validation split.
    Val,
}

impl Split {
    /// The split's name as used in file names and the manifest.
    pub fn name(self) -> &'static str {
        match self {
            Self::Train => "train",
            Self::Val => "val",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How documents were assigned to the splits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitMethod {
    /// Each document goes to validation when the stable hash of its text falls below `val_fraction`: the same
    /// document lands in the same split whatever the input order or the rest of the corpus.
    DocumentHash,
    /// The token stream of the whole corpus is cut once: the last `val_fraction` of its tokens are validation.
    /// Used when hashing cannot split the corpus (a single document such as Tiny Shakespeare, or so few documents
    /// that one split would be empty).
    ContiguousTail,
}

/// The tokenizer the ids were produced with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerInfo {
    /// The encoder's fingerprint string.
    pub fingerprint: String,
    /// Vocabulary size: every stored id is below it.
    pub vocab_size: usize,
    /// The id written between documents, if any.
    pub eos_id: Option<u32>,
}

/// One shard file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// File name, relative to the manifest's directory.
    pub file: String,
    /// The split the shard belongs to; a split's shards are read in manifest order.
    pub split: Split,
    /// Number of token ids in the shard.
    pub tokens: u64,
}

/// Totals of one split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitStats {
    /// Documents with at least one token in the split.
    pub documents: u64,
    /// Token ids in the split, separators included.
    pub tokens: u64,
}

/// One input file and what was read from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputInfo {
    /// The file, as found (directories are expanded into their files).
    pub path: PathBuf,
    /// Size of the file in bytes.
    pub bytes: u64,
    /// Documents read from it (empty ones included).
    pub documents: u64,
    /// Invalid UTF-8 sequences replaced by U+FFFD.
    pub replaced_invalid_utf8: u64,
}

/// The contents of `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Manifest format version ([`MANIFEST_VERSION`]).
    pub format_version: u32,
    /// The tokenizer the ids were produced with.
    pub tokenizer: TokenizerInfo,
    /// Storage type of every shard.
    pub dtype: TokenDtype,
    /// How documents were split.
    pub split_method: SplitMethod,
    /// The requested validation fraction.
    pub val_fraction: f64,
    /// Whether the chat/e-mail cleaning rules were applied before tokenizing.
    pub cleaned: bool,
    /// Training split totals.
    pub train: SplitStats,
    /// Validation split totals.
    pub val: SplitStats,
    /// Documents that encoded to no token at all and were skipped.
    pub skipped_empty_documents: u64,
    /// The input files, in reading order.
    pub inputs: Vec<InputInfo>,
    /// The shard files, in reading order.
    pub shards: Vec<ShardInfo>,
}

impl Manifest {
    /// Reads `dir/manifest.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| DatasetError::io(&path, e))?;
        let manifest: Self = serde_json::from_str(&text).map_err(|e| DatasetError::Manifest {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if manifest.format_version != MANIFEST_VERSION {
            return Err(DatasetError::Manifest {
                path,
                message: format!(
                    "format version {}, this build reads version {MANIFEST_VERSION}",
                    manifest.format_version
                ),
            });
        }
        manifest
            .check()
            .map_err(|message| DatasetError::Manifest { path, message })?;
        Ok(manifest)
    }

    /// What a reader relies on beyond the JSON's types: shard files are distinct plain names in the corpus
    /// directory (a repeated shard would be read twice, a path such as `../x` would leave the directory), and the
    /// tokenizer's ids fit its vocabulary.
    fn check(&self) -> std::result::Result<(), String> {
        if self.tokenizer.vocab_size == 0 {
            return Err("`tokenizer.vocab_size` is 0: expected at least 1".into());
        }
        if let Some(eos) = self
            .tokenizer
            .eos_id
            .filter(|&id| id as usize >= self.tokenizer.vocab_size)
        {
            return Err(format!(
                "`tokenizer.eos_id` {eos} is outside the vocabulary of {} ids",
                self.tokenizer.vocab_size
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, shard) in self.shards.iter().enumerate() {
            let mut components = Path::new(&shard.file).components();
            let plain = matches!(components.next(), Some(std::path::Component::Normal(_)))
                && components.next().is_none();
            if !plain {
                return Err(format!(
                    "`shards[{i}].file` is {:?}: expected a file name in the corpus directory",
                    shard.file
                ));
            }
            if !seen.insert(shard.file.as_str()) {
                return Err(format!(
                    "`shards[{i}].file`: shard {:?} is listed twice",
                    shard.file
                ));
            }
        }
        Ok(())
    }

    /// Writes `dir/manifest.json` atomically (temporary file, then rename), so a reader never sees half of it.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(MANIFEST_FILE);
        let temp = dir.join(format!(".{MANIFEST_FILE}.tmp-{}", std::process::id()));
        let text = serde_json::to_string_pretty(self).map_err(|e| DatasetError::Manifest {
            path: path.clone(),
            message: e.to_string(),
        })?;
        std::fs::write(&temp, text).map_err(|e| DatasetError::io(&temp, e))?;
        std::fs::rename(&temp, &path).map_err(|e| DatasetError::io(&path, e))
    }

    /// The totals of `split`.
    pub fn stats(&self, split: Split) -> SplitStats {
        match split {
            Split::Train => self.train,
            Split::Val => self.val,
        }
    }

    /// The shards of `split`, in reading order.
    pub fn shards_of(&self, split: Split) -> impl Iterator<Item = &ShardInfo> {
        self.shards.iter().filter(move |s| s.split == split)
    }
}
