//! Test helpers shared by the integration tests: tiny encoders and a corpus builder.

#![allow(dead_code)]

use std::path::Path;

use ember_dataset::{
    CorpusWriter, DocumentEncoder, MANIFEST_VERSION, Manifest, SplitMethod, SplitStats, TokenDtype,
    TokenizerInfo,
};

/// Byte-level encoder: id = byte value, EOS = 256. Its output is trivially predictable, which makes it an exact
/// oracle for what the shards must hold.
pub struct ByteEncoder;

/// The EOS id of [`ByteEncoder`].
pub const BYTE_EOS: u32 = 256;

impl DocumentEncoder for ByteEncoder {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn vocab_size(&self) -> usize {
        257
    }
    fn eos_id(&self) -> Option<u32> {
        Some(BYTE_EOS)
    }
    fn fingerprint(&self) -> String {
        "bytes-v1".into()
    }
}

/// A byte encoder whose ids are shifted past 65,536, forcing u32 shards.
pub struct WideEncoder;

impl DocumentEncoder for WideEncoder {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(|b| 70_000 + u32::from(b)).collect())
    }
    fn vocab_size(&self) -> usize {
        70_257
    }
    fn eos_id(&self) -> Option<u32> {
        Some(70_256)
    }
    fn fingerprint(&self) -> String {
        "wide-v1".into()
    }
}

/// Writes a corpus whose train split is the ids `0..train_tokens` (so every id is its own stream position) in
/// shards of `shard_tokens`, and whose val split is `val` tokens; returns the manifest.
pub fn positional_corpus(
    dir: &Path,
    train_tokens: u64,
    val_tokens: u64,
    shard_tokens: u64,
) -> Manifest {
    let mut writer = CorpusWriter::new(dir, TokenDtype::U32, "positions", shard_tokens);
    let chunk: u64 = 1 << 20;
    let mut start = 0;
    while start < train_tokens {
        let end = (start + chunk).min(train_tokens);
        let ids: Vec<u32> = (start..end).map(|i| i as u32).collect();
        writer.push(ember_dataset::Split::Train, &ids).unwrap();
        start = end;
    }
    let val: Vec<u32> = (0..val_tokens).map(|i| i as u32).collect();
    writer.push(ember_dataset::Split::Val, &val).unwrap();
    let shards = writer.finish().unwrap();
    let manifest = Manifest {
        format_version: MANIFEST_VERSION,
        tokenizer: TokenizerInfo {
            fingerprint: "positions".into(),
            vocab_size: u32::MAX as usize,
            eos_id: None,
        },
        dtype: TokenDtype::U32,
        split_method: SplitMethod::ContiguousTail,
        // A short decimal: serde_json (without `float_roundtrip`) may misparse the last bit of a 17-digit one.
        val_fraction: 0.1,
        cleaned: false,
        train: SplitStats {
            documents: 1,
            tokens: train_tokens,
        },
        val: SplitStats {
            documents: 1,
            tokens: val_tokens,
        },
        skipped_empty_documents: 0,
        inputs: Vec::new(),
        shards,
    };
    manifest.save(dir).unwrap();
    manifest
}

/// Splits a byte-encoded split stream at EOS ids back into document texts.
pub fn documents_of(stream: &[u32]) -> Vec<String> {
    stream
        .split(|&id| id == BYTE_EOS)
        .map(|doc| String::from_utf8(doc.iter().map(|&b| b as u8).collect()).unwrap())
        .collect()
}

/// Every id of `split` in `dir`.
pub fn read_split(dir: &Path, split: ember_dataset::Split) -> Vec<u32> {
    let dataset = ember_dataset::TokenDataset::open(dir, split).unwrap();
    let mut out = vec![0u32; dataset.len() as usize];
    dataset.read(0, &mut out).unwrap();
    out
}
