//! [`DocumentEncoder`] for ember's own tokenizer.

use std::path::Path;

use ember_tokenizer::Tokenizer;

use crate::encoder::DocumentEncoder;
use crate::error::{DatasetError, Result};
use crate::hash::stable_hash;

/// An [`ember_tokenizer::Tokenizer`] together with the fingerprint of the files it was loaded from.
///
/// Documents are encoded with `encode_ordinary`: a literal `<|endoftext|>` in a training document is text, not a
/// control token, so only the separators written by preparation are EOS ids.
#[derive(Debug, Clone)]
pub struct TokenizerEncoder {
    tokenizer: Tokenizer,
    fingerprint: String,
}

impl TokenizerEncoder {
    /// Loads the tokenizer at `path` (a tokenizer file or a model directory) and fingerprints it with
    /// [`fingerprint_path`].
    pub fn from_path(path: &Path) -> Result<Self> {
        let tokenizer = Tokenizer::from_path(path).map_err(|e| DatasetError::Tokenizer {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Self::new(tokenizer, path)
    }

    /// `tokenizer`, already loaded from `path` by the caller (e.g. from a GGUF file's vocabulary, which this crate
    /// cannot read), fingerprinted with [`fingerprint_path`].
    pub fn new(tokenizer: Tokenizer, path: &Path) -> Result<Self> {
        Ok(Self {
            tokenizer,
            fingerprint: fingerprint_path(path)?,
        })
    }

    /// The wrapped tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The wrapped tokenizer, back from an encoder that is done: a caller that prepares a corpus and then trains
    /// with the same tokenizer keeps the one it loaded instead of cloning its vocabulary.
    pub fn into_tokenizer(self) -> Tokenizer {
        self.tokenizer
    }
}

/// How much of a tokenizer file [`fingerprint_path`] hashes: 256 MiB, above any tokenizer file and any GGUF
/// file's metadata (a 262k-token vocabulary with merges is ~30 MB).
const FINGERPRINT_PREFIX: u64 = 256 << 20;

/// The tokenizer files of a model directory, in the order they are hashed (weights are never read).
const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
];

/// The fingerprint of the tokenizer at `path`: `tok-` and the hex stable hash of the file's bytes, or for a model
/// directory of the name and bytes of each of its tokenizer files (`tokenizer.json`, `vocab.json`, `merges.txt`,
/// `tokenizer.model`) that exists. The trainer compares it with the manifest's to refuse stale shards.
pub fn fingerprint_path(path: &Path) -> Result<String> {
    let mut bytes = Vec::new();
    let read = |p: &Path| std::fs::read(p).map_err(|e| DatasetError::io(p, e));
    if path.is_dir() {
        for name in TOKENIZER_FILES {
            let file = path.join(name);
            if file.is_file() {
                bytes.extend_from_slice(name.as_bytes());
                bytes.push(0);
                bytes.extend_from_slice(&read(&file)?);
            }
        }
    } else {
        // Tokenizer files are far below the cap; a GGUF model keeps its vocabulary in the metadata at the start
        // of the file, so its first bytes (and its length) identify the tokenizer without reading gigabytes of
        // weights.
        use std::io::Read;
        let file = std::fs::File::open(path).map_err(|e| DatasetError::io(path, e))?;
        let len = file
            .metadata()
            .map_err(|e| DatasetError::io(path, e))?
            .len();
        file.take(FINGERPRINT_PREFIX)
            .read_to_end(&mut bytes)
            .map_err(|e| DatasetError::io(path, e))?;
        if len > FINGERPRINT_PREFIX {
            bytes.extend_from_slice(&len.to_le_bytes());
        }
    }
    Ok(format!("tok-{:016x}", stable_hash(&bytes)))
}

impl DocumentEncoder for TokenizerEncoder {
    fn encode(&self, text: &str) -> std::result::Result<Vec<u32>, String> {
        self.tokenizer
            .encode_ordinary(text)
            .map_err(|e| e.to_string())
    }

    fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }

    fn eos_id(&self) -> Option<u32> {
        self.tokenizer.eos_id()
    }

    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }
}
