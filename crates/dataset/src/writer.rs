//! Writes the token streams of both splits into size-capped shard files.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::hash::stable_hash;
use crate::manifest::{ShardInfo, Split};
use crate::shard::{ShardWriter, TokenDtype};

/// Streams token ids of the train and validation splits into shards named `train-00000.bin`, `val-00000.bin`, ...,
/// each holding at most `shard_tokens` ids. Shards are created lazily, so a split that receives nothing has no file.
pub struct CorpusWriter {
    dir: PathBuf,
    dtype: TokenDtype,
    fingerprint_digest: u64,
    shard_tokens: u64,
    streams: [Stream; 2],
    shards: Vec<ShardInfo>,
}

/// The shard being filled for one split.
struct Stream {
    split: Split,
    next_index: usize,
    open: Option<ShardWriter>,
}

impl CorpusWriter {
    /// Prepares to write into the existing directory `dir`; `fingerprint` is the encoder's fingerprint string.
    pub fn new(dir: &Path, dtype: TokenDtype, fingerprint: &str, shard_tokens: u64) -> Self {
        let stream = |split| Stream {
            split,
            next_index: 0,
            open: None,
        };
        Self {
            dir: dir.to_path_buf(),
            dtype,
            fingerprint_digest: stable_hash(fingerprint.as_bytes()),
            shard_tokens: shard_tokens.max(1),
            streams: [stream(Split::Train), stream(Split::Val)],
            shards: Vec::new(),
        }
    }

    /// File name of shard `index` of `split`.
    pub fn shard_name(split: Split, index: usize) -> String {
        format!("{split}-{index:05}.bin")
    }

    /// Appends `ids` to the stream of `split`, starting new shards as the current one fills.
    pub fn push(&mut self, split: Split, mut ids: &[u32]) -> Result<()> {
        let stream = &mut self.streams[split as usize];
        while !ids.is_empty() {
            let writer = match &mut stream.open {
                Some(writer) => writer,
                None => {
                    let path = self.dir.join(Self::shard_name(split, stream.next_index));
                    stream.next_index += 1;
                    stream.open.insert(ShardWriter::create(
                        &path,
                        self.dtype,
                        self.fingerprint_digest,
                    )?)
                }
            };
            let room = (self.shard_tokens - writer.tokens()) as usize;
            let (now, later) = ids.split_at(room.min(ids.len()));
            writer.push(now)?;
            ids = later;
            if writer.tokens() == self.shard_tokens {
                Self::close(stream, &mut self.shards)?;
            }
        }
        Ok(())
    }

    /// Finishes the open shards and returns every shard written, train shards first.
    pub fn finish(mut self) -> Result<Vec<ShardInfo>> {
        for stream in &mut self.streams {
            Self::close(stream, &mut self.shards)?;
        }
        self.shards
            .sort_by_key(|s| (s.split as usize, s.file.clone()));
        Ok(std::mem::take(&mut self.shards))
    }

    fn close(stream: &mut Stream, shards: &mut Vec<ShardInfo>) -> Result<()> {
        if let Some(writer) = stream.open.take() {
            let header = writer.finish()?;
            shards.push(ShardInfo {
                file: Self::shard_name(stream.split, stream.next_index - 1),
                split: stream.split,
                tokens: header.tokens,
            });
        }
        Ok(())
    }
}
