//! Token corpora for training: preparation of documents into memory-mapped shards, reproducible train/validation
//! splits, and batching.
//!
//! - [`prepare`] reads text files, directories and JSONL, optionally [cleans](clean) them, tokenizes them in
//!   parallel with any [`DocumentEncoder`] and writes shards plus a [`Manifest`].
//! - [`TokenDataset`] maps the shards of one split; [`RandomBatches`] draws seeded random windows from it (resumable
//!   through [`ReaderState`]), [`EvalBatches`] walks it sequentially, and [`Prefetcher`] builds batches ahead on a
//!   background thread.
//!
//! The crate has no tensor dependency: a [`Batch`] is plain `Vec<u32>` ids that the trainer turns into tensors.

mod batch;
mod chat;
mod chat_rows;
pub mod clean;
mod dataset;
mod encoder;
mod error;
mod hash;
mod manifest;
mod prefetch;
mod prepare;
mod shard;
mod source;
mod tokenizer;
mod writer;

pub use batch::{Batch, EvalBatches, RandomBatches, ReaderState};
pub use chat::{ChatConversation, ChatTurn, NO_LOSS, chat_row, read_chat_jsonl};
pub use chat_rows::{CHAT_ROWS_MANIFEST, ChatRows};
pub use dataset::TokenDataset;
pub use encoder::DocumentEncoder;
pub use error::{DatasetError, Result};
pub use hash::stable_hash;
pub use manifest::{
    InputInfo, MANIFEST_FILE, MANIFEST_VERSION, Manifest, ShardInfo, Split, SplitMethod,
    SplitStats, TokenizerInfo,
};
pub use prefetch::Prefetcher;
pub use prepare::{
    DEFAULT_SHARD_TOKENS, DEFAULT_VAL_FRACTION, PrepareOptions, PrepareReport, Progress, prepare,
};
pub use shard::{
    HEADER_BYTES, MappedShard, SHARD_MAGIC, SHARD_VERSION, ShardHeader, ShardWriter, TokenDtype,
};
pub use tokenizer::{TokenizerEncoder, fingerprint_path};
pub use writer::CorpusWriter;
