//! The shard file: a 32-byte versioned header followed by little-endian token ids.
//!
//! ```text
//! offset  size  field
//!      0     8  magic  b"EMBERTOK"
//!      8     4  format version (u32 LE, currently 1)
//!     12     4  bytes per token (u32 LE: 2 = u16, 4 = u32)
//!     16     8  token count (u64 LE)
//!     24     8  tokenizer fingerprint digest (u64 LE, `stable_hash` of the fingerprint string)
//!     32     .  token ids, `count` x bytes-per-token, little-endian
//! ```
//!
//! The header is 32 bytes so the ids stay aligned for either dtype; the file length is fully determined by the
//! header, which lets a reader count tokens (and windows) from file sizes without touching the data.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::error::{DatasetError, Result};

/// The magic bytes that open every shard.
pub const SHARD_MAGIC: [u8; 8] = *b"EMBERTOK";
/// The shard format version this crate writes and reads.
pub const SHARD_VERSION: u32 = 1;
/// Size of the shard header in bytes.
pub const HEADER_BYTES: usize = 32;

/// How token ids are stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    /// Two bytes per token: vocabularies of at most 65,536 ids.
    U16,
    /// Four bytes per token.
    U32,
}

impl TokenDtype {
    /// The narrowest dtype that holds every id of a vocabulary of `vocab_size` ids.
    pub fn for_vocab(vocab_size: usize) -> Self {
        if vocab_size <= 1 << 16 {
            Self::U16
        } else {
            Self::U32
        }
    }

    /// Bytes per stored token.
    pub fn bytes(self) -> usize {
        match self {
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }

    fn from_bytes(bytes: u32) -> Option<Self> {
        match bytes {
            2 => Some(Self::U16),
            4 => Some(Self::U32),
            _ => None,
        }
    }
}

/// The decoded header of a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardHeader {
    /// Storage type of the ids.
    pub dtype: TokenDtype,
    /// Number of token ids in the shard.
    pub tokens: u64,
    /// `stable_hash` of the tokenizer fingerprint the ids were produced with.
    pub fingerprint_digest: u64,
}

impl ShardHeader {
    fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..8].copy_from_slice(&SHARD_MAGIC);
        out[8..12].copy_from_slice(&SHARD_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&(self.dtype.bytes() as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.tokens.to_le_bytes());
        out[24..32].copy_from_slice(&self.fingerprint_digest.to_le_bytes());
        out
    }

    fn decode(path: &Path, bytes: &[u8]) -> Result<Self> {
        let bad = |message: String| DatasetError::ShardMismatch {
            path: path.to_path_buf(),
            message,
        };
        if bytes.len() < HEADER_BYTES {
            return Err(bad(format!(
                "{} bytes is shorter than the {HEADER_BYTES}-byte header",
                bytes.len()
            )));
        }
        if bytes[0..8] != SHARD_MAGIC {
            return Err(bad(format!(
                "bad magic {:?}, expected {:?}",
                &bytes[0..8],
                SHARD_MAGIC
            )));
        }
        let u32_at =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]));
        let version = u32_at(8);
        if version != SHARD_VERSION {
            return Err(bad(format!(
                "format version {version}, this build reads version {SHARD_VERSION}"
            )));
        }
        let width = u32_at(12);
        let dtype = TokenDtype::from_bytes(width)
            .ok_or_else(|| bad(format!("{width} bytes per token, expected 2 or 4")))?;
        Ok(Self {
            dtype,
            tokens: u64_at(16),
            fingerprint_digest: u64_at(24),
        })
    }
}

/// Writes one shard atomically: ids go to a temporary file next to the target, which is renamed into place by
/// [`ShardWriter::finish`]; a writer dropped before `finish` removes its temporary file.
pub struct ShardWriter {
    path: PathBuf,
    temp: PathBuf,
    out: Option<BufWriter<File>>,
    header: ShardHeader,
    buf: Vec<u8>,
}

impl ShardWriter {
    /// Starts a shard at `path` storing ids as `dtype`.
    pub fn create(path: &Path, dtype: TokenDtype, fingerprint_digest: u64) -> Result<Self> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
        let file = File::create(&temp).map_err(|e| DatasetError::io(&temp, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let header = ShardHeader {
            dtype,
            tokens: 0,
            fingerprint_digest,
        };
        out.write_all(&header.encode())
            .map_err(|e| DatasetError::io(&temp, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            temp,
            out: Some(out),
            header,
            buf: Vec::new(),
        })
    }

    /// Number of ids written so far.
    pub fn tokens(&self) -> u64 {
        self.header.tokens
    }

    /// Appends `ids`; fails if an id does not fit the shard's dtype.
    pub fn push(&mut self, ids: &[u32]) -> Result<()> {
        self.buf.clear();
        match self.header.dtype {
            TokenDtype::U16 => {
                for &id in ids {
                    let narrow = u16::try_from(id).map_err(|_| DatasetError::ShardMismatch {
                        path: self.path.clone(),
                        message: format!("token id {id} does not fit a u16 shard"),
                    })?;
                    self.buf.extend_from_slice(&narrow.to_le_bytes());
                }
            }
            TokenDtype::U32 => ids
                .iter()
                .for_each(|id| self.buf.extend_from_slice(&id.to_le_bytes())),
        }
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| DatasetError::ShardMismatch {
                path: self.path.clone(),
                message: "write after finish".into(),
            })?;
        out.write_all(&self.buf)
            .map_err(|e| DatasetError::io(&self.temp, e))?;
        self.header.tokens += ids.len() as u64;
        Ok(())
    }

    /// Writes the final header, flushes to disk and renames the shard into place; returns its header.
    pub fn finish(mut self) -> Result<ShardHeader> {
        let temp = self.temp.clone();
        let io = |e| DatasetError::io(&temp, e);
        let out = self.out.take().ok_or_else(|| DatasetError::ShardMismatch {
            path: self.path.clone(),
            message: "finished twice".into(),
        })?;
        let mut file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&self.header.encode()).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&self.temp, &self.path).map_err(|e| DatasetError::io(&self.path, e))?;
        Ok(self.header)
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        if self.out.is_some() {
            // An unfinished shard is garbage: leave no partial file behind. Failure to remove it is harmless.
            self.out = None;
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// A read-only, memory-mapped shard. Only the pages that are read are loaded, so a corpus larger than RAM can be
/// sampled from.
#[derive(Debug)]
pub struct MappedShard {
    path: PathBuf,
    map: Mmap,
    header: ShardHeader,
}

impl MappedShard {
    /// Maps `path` and checks that its header is well formed and its length matches the header's token count.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| DatasetError::io(path, e))?;
        // SAFETY: the map is read-only and shards are written once (atomic rename) and never modified in place.
        // Another process truncating the file while it is mapped would fault; that is outside what we support.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| DatasetError::io(path, e))?;
        // Training reads short windows at random offsets: read-ahead would load (and map) hundreds of KiB around
        // each 1 KiB window, which for a corpus larger than RAM is wasted I/O and evicts useful pages. The advice
        // is a hint; a kernel that refuses it still reads correctly, so its error is ignored.
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Random);
        let header = ShardHeader::decode(path, &map)?;
        let payload = (map.len() - HEADER_BYTES) as u64;
        let width = header.dtype.bytes() as u64;
        // Checked: a count near 2^64 would wrap to a small byte count and pass for a short file.
        let expected = header.tokens.checked_mul(width);
        if expected != Some(payload) {
            let bytes = expected.map_or_else(|| "more than 2^64".to_string(), |b| b.to_string());
            return Err(DatasetError::ShardMismatch {
                path: path.to_path_buf(),
                message: format!(
                    "header declares {} tokens ({bytes} bytes of ids) but the file holds {payload} bytes of ids",
                    header.tokens
                ),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            map,
            header,
        })
    }

    /// The shard's header.
    pub fn header(&self) -> ShardHeader {
        self.header
    }

    /// The shard's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of token ids in the shard.
    pub fn len(&self) -> u64 {
        self.header.tokens
    }

    /// Whether the shard holds no ids.
    pub fn is_empty(&self) -> bool {
        self.header.tokens == 0
    }

    /// Copies the ids at positions `start..start + out.len()` into `out`.
    ///
    /// The caller guarantees the range lies inside the shard (the dataset computes ranges from shard lengths).
    pub(crate) fn copy_to(&self, start: u64, out: &mut [u32]) {
        let width = self.header.dtype.bytes();
        let begin = HEADER_BYTES + start as usize * width;
        let bytes = &self.map[begin..begin + out.len() * width];
        match self.header.dtype {
            TokenDtype::U16 => {
                for (dst, src) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *dst = u32::from(u16::from_le_bytes([src[0], src[1]]));
                }
            }
            TokenDtype::U32 => {
                for (dst, src) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *dst = u32::from_le_bytes([src[0], src[1], src[2], src[3]]);
                }
            }
        }
    }
}
