//! GGUF v2/v3 reading (header, metadata, tensor infos and dequantization) and GGUF v3 writing ([`save_gguf`]).
//!
//! [`GgufFile::open`] memory-maps a file and parses its structure; tensors are dequantized to f32 on request with
//! [`GgufFile::tensor_f32`], so only the tensors a model asks for are ever expanded. [`model_spec`] and [`load`]
//! go through the architecture registry (each family maps its own GGUF metadata and tensors, see
//! [`crate::arch::Family::gguf_config`]); [`tokenizer_vocab`] extracts the embedded tokenizer.

mod error;
mod export;
mod hparams;
mod lineage;
mod metadata;
mod model;
mod reader;
mod recipe;
mod vocab;
mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

/// ggml's types and their dequantization live with the kernels that multiply packed blocks.
pub use ember_ggml::{GgmlType, dequantize};
pub use error::GgufError;
pub use export::{GgufExport, GgufSummary, check_gguf_writable, save_gguf};
pub use hparams::{GgufHparams, OUTPUT, TOKEN_EMBD};
pub(crate) use lineage::{count_value, rope_lineage_metadata};
pub use metadata::MetadataValue;
pub use model::{
    GgufSource, family, is_gguf, load, load_quantized, model_spec, permute_rows, unpacked_matrices,
    unpermute_rows,
};
pub use reader::{DEFAULT_ALIGNMENT, MAX_METADATA_ELEMENTS, TensorInfo};
pub use recipe::{GgufRecipe, RECIPES, RecipeTensor};
pub use vocab::{
    CHAT_TEMPLATE, TokenizerFromGgufError, chat_template, load_tokenizer, tokenizer_metadata,
    tokenizer_vocab, vocab_metadata,
};
pub use writer::{GgufWriter, OutTensor, WRITTEN_VERSION};

/// An open GGUF file: its parsed header over a read-only memory map of the whole file.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    header: reader::Header,
}

impl GgufFile {
    /// Maps and parses the GGUF file at `path`, checking that every tensor of a known type lies inside it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Like every memory-mapped model loader we rely on
        // the file not being truncated or rewritten while it is open; all reads of it are bounds-checked against the
        // length seen at open time.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = reader::parse_header(&map, &path)?;
        Ok(Self { path, map, header })
    }

    /// Drops this process's resident copies of the file's pages once the weights have been copied out of them.
    /// The map stays valid: a later read faults the same bytes back in from the file (usually from the kernel's
    /// page cache, which keeps them). Loading copies every tensor, so without this the model counted twice in the
    /// resident set while it ran (SmolLM2-135M Q4_1 with `--quantize gguf`: 96 MiB of file pages beside 99 MiB
    /// of copied blocks). Advisory: where the kernel refuses, nothing changes.
    pub fn release_resident_pages(&self) {
        #[cfg(unix)]
        // SAFETY: `MADV_DONTNEED` is unsafe for mappings whose pages it would change (private writable or
        // anonymous maps read back as zeros). This map is read-only and file-backed, and nothing writes the file
        // while it is open (the contract of `open`), so every byte reads the same after the call as before it,
        // including through borrows of the map held meanwhile.
        let _ = unsafe {
            self.map
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        };
    }

    /// The file this was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The alignment of tensor data in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, MetadataValue)] {
        &self.header.metadata
    }

    /// The metadata value under `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.header
            .metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The info of the tensor called `name`.
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.header
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| GgufError::MissingTensor {
                path: self.path.clone(),
                tensor: name.to_string(),
            })
    }

    /// The raw bytes of the tensor called `name`, as stored.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], GgufError> {
        let info = self.tensor_info(name)?;
        let n_bytes = info.n_bytes().ok_or_else(|| self.unsupported(info))?;
        // `parse_header` checked that offset + n_bytes lies inside the map.
        Ok(&self.map[info.offset as usize..(info.offset + n_bytes) as usize])
    }

    /// The tensor called `name` dequantized to f32: `(shape outermost first, values in row-major order)`.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), GgufError> {
        let info = self.tensor_info(name)?;
        let bytes = self.tensor_bytes(name)?;
        let values = dequantize(info.ggml_type, bytes).ok_or_else(|| self.unsupported(info))?;
        Ok((info.shape(), values))
    }

    fn unsupported(&self, info: &TensorInfo) -> GgufError {
        GgufError::UnsupportedType {
            path: self.path.clone(),
            tensor: info.name.clone(),
            ggml_type: info.ggml_type.to_string(),
            supported: GgmlType::SUPPORTED,
        }
    }

    /// The metadata value under `key`, or an error naming the key when it is absent.
    pub fn require(&self, key: &str) -> Result<&MetadataValue, GgufError> {
        self.get(key)
            .ok_or_else(|| self.metadata_error(key, "a value", "missing".into()))
    }

    /// The unsigned integer under `key`, or an error naming the key and what was found.
    pub fn require_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| self.metadata_error(key, "an unsigned integer", v.type_name()))
    }

    /// The float under `key`, or an error naming the key and what was found.
    pub fn require_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.require(key)?;
        v.as_f64()
            .ok_or_else(|| self.metadata_error(key, "a float", v.type_name()))
    }

    /// The string under `key`, or an error naming the key and what was found.
    pub fn require_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str()
            .ok_or_else(|| self.metadata_error(key, "a string", v.type_name()))
    }

    /// An error for metadata key `key` that should have been `expected`.
    pub fn metadata_error(&self, key: &str, expected: &str, found: String) -> GgufError {
        GgufError::Metadata {
            path: self.path.clone(),
            key: key.to_string(),
            expected: expected.to_string(),
            found,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kilobytes of this process's resident pages in the mapping that starts at `start`, from
    /// `/proc/self/smaps`.
    #[cfg(target_os = "linux")]
    fn resident_kib(start: *const u8) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines();
        let header = lines
            .find(|l| {
                l.split('-')
                    .next()
                    .and_then(|a| usize::from_str_radix(a, 16).ok())
                    == Some(start as usize)
            })
            .expect("the map in /proc/self/smaps");
        let rss = lines
            .find(|l| l.starts_with("Rss:"))
            .unwrap_or_else(|| panic!("no Rss line after {header}"));
        rss.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn released_pages_leave_the_resident_set_and_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.gguf");
        let mut writer = GgufWriter::new();
        writer.set(
            "general.architecture",
            MetadataValue::String("llama".into()),
        );
        let shape = vec![256, 256];
        writer
            .add_tensor(OutTensor::new("a", GgmlType::F32, shape), &path)
            .unwrap();
        let values: Vec<u8> = (0..256 * 256 * 4).map(|i| (i * 7 % 251) as u8).collect();
        writer
            .write::<GgufError>(&path, |_| Ok(values.clone()))
            .unwrap();
        let file = GgufFile::open(&path).unwrap();
        let before = file.tensor_bytes("a").unwrap().to_vec();
        assert_eq!(before, values);
        // 256 KiB of tensor data just read: at least that much of the map is resident.
        let touched = resident_kib(file.map.as_ptr());
        assert!(
            touched >= 256,
            "{touched} KiB resident after reading 256 KiB"
        );
        file.release_resident_pages();
        let released = resident_kib(file.map.as_ptr());
        assert_eq!(
            released, 0,
            "{released} KiB still resident after the release"
        );
        assert_eq!(
            file.tensor_bytes("a").unwrap(),
            &values[..],
            "bytes read after the release"
        );
    }
}
