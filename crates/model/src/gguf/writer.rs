//! Writing GGUF v3 files: the exact inverse of [`super::reader`]'s layout (magic, version, counts, metadata,
//! tensor infos, then each tensor's data at a multiple of the alignment).
//!
//! The file is written next to its destination under a temporary name and renamed over it only once complete,
//! so a reader never sees half a model and a failed write leaves any earlier file in place.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::reader::DEFAULT_ALIGNMENT;
use super::{GgmlType, GgufError, MetadataValue};

/// The GGUF version this writer produces (llama.cpp's current one).
pub const WRITTEN_VERSION: u32 = 3;

/// One tensor of the file: its name, type and shape (outermost first, as [`super::TensorInfo::shape`] returns
/// it). Its bytes are asked for only when the data section is written ([`GgufWriter::write`]), one tensor at a
/// time, so a file is written without holding all its tensors at once.
#[derive(Clone, Debug)]
pub struct OutTensor {
    /// The GGUF tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Its element type.
    pub ggml_type: GgmlType,
    /// Dimensions outermost first (`[rows, cols]` for a matrix).
    pub shape: Vec<usize>,
    /// The bytes its type and shape take.
    n_bytes: u64,
}

/// A GGUF file being assembled: metadata in insertion order, then tensors in insertion order.
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<OutTensor>,
}

impl OutTensor {
    /// A tensor `name` of `ggml_type` and `shape`.
    pub fn new(name: impl Into<String>, ggml_type: GgmlType, shape: Vec<usize>) -> Self {
        OutTensor {
            name: name.into(),
            ggml_type,
            shape,
            n_bytes: 0,
        }
    }

    /// The bytes its data takes.
    pub fn n_bytes(&self) -> u64 {
        self.n_bytes
    }
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`, replacing an earlier value of the same key in place (GGUF keys are unique).
    pub fn set(&mut self, key: impl Into<String>, value: MetadataValue) {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key, value)),
        }
    }

    /// The metadata so far, in file order.
    pub fn metadata(&self) -> &[(String, MetadataValue)] {
        &self.metadata
    }

    /// The tensors so far, in file order.
    pub fn tensors(&self) -> &[OutTensor] {
        &self.tensors
    }

    /// Adds a tensor, checking that its type's blocks divide its rows and that no other tensor has its name
    /// (`what` names the destination in errors).
    pub fn add_tensor(&mut self, mut tensor: OutTensor, what: &Path) -> Result<(), GgufError> {
        let corrupt = |reason: String| GgufError::Corrupt {
            path: what.to_path_buf(),
            what: format!("tensor `{}`", tensor.name),
            reason,
        };
        let (block_len, block_bytes) = tensor
            .ggml_type
            .block_geometry()
            .ok_or_else(|| corrupt(format!("type {} has no known layout", tensor.ggml_type)))?;
        let elements: usize = tensor.shape.iter().product();
        let cols = tensor.shape.last().copied().unwrap_or(1);
        if cols % block_len != 0 {
            return Err(corrupt(format!(
                "its rows of {cols} values are not whole {} blocks of {block_len}",
                tensor.ggml_type
            )));
        }
        if self.tensors.iter().any(|t| t.name == tensor.name) {
            return Err(corrupt("written twice".to_string()));
        }
        tensor.n_bytes = (elements / block_len * block_bytes) as u64;
        self.tensors.push(tensor);
        Ok(())
    }

    /// The alignment the data section will use: `general.alignment` if set, else the default.
    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Writes the file to `path` atomically (a temporary file in the same directory, renamed over `path`), asking
    /// `data(i)` for the bytes of tensor `i` in order, once each. A wrong byte count or an error of `data` stops
    /// the write and removes the temporary file.
    pub fn write<E: From<GgufError>>(
        &self,
        path: &Path,
        mut data: impl FnMut(usize) -> Result<Vec<u8>, E>,
    ) -> Result<(), E> {
        let temp = temporary_path(path);
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let result = (|| -> Result<(), E> {
            let file = std::fs::File::create(&temp).map_err(io)?;
            let mut out = BufWriter::new(file);
            self.write_to(&mut out, path, &mut data)?;
            let file = out.into_inner().map_err(|e| io(e.into_error()))?;
            file.sync_all().map_err(io)?;
            std::fs::rename(&temp, path).map_err(io)?;
            Ok(())
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        result
    }

    /// Writes the whole file to `out` (`path` names it in errors), taking each tensor's bytes from `data`.
    fn write_to<E: From<GgufError>>(
        &self,
        out: &mut impl Write,
        path: &Path,
        data: &mut impl FnMut(usize) -> Result<Vec<u8>, E>,
    ) -> Result<(), E> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let alignment = self.alignment();
        let header = self.header(alignment).map_err(io)?;
        out.write_all(&header).map_err(io)?;
        let mut offset = 0u64;
        for (i, t) in self.tensors.iter().enumerate() {
            let bytes = data(i)?;
            if bytes.len() as u64 != t.n_bytes {
                return Err(GgufError::Corrupt {
                    path: path.to_path_buf(),
                    what: format!("tensor `{}`", t.name),
                    reason: format!(
                        "{} bytes given, its shape {:?} in {} takes {}",
                        bytes.len(),
                        t.shape,
                        t.ggml_type,
                        t.n_bytes
                    ),
                }
                .into());
            }
            out.write_all(&bytes).map_err(io)?;
            let end = align(offset + t.n_bytes, alignment);
            pad(out, end - offset - t.n_bytes).map_err(io)?;
            offset = end;
        }
        out.flush().map_err(io)?;
        Ok(())
    }

    /// Everything before the data section: magic, version, counts, metadata, tensor infos and the padding to
    /// the alignment.
    fn header(&self, alignment: u64) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        out.write_all(b"GGUF")?;
        out.write_all(&WRITTEN_VERSION.to_le_bytes())?;
        out.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        out.write_all(&(self.metadata.len() as u64).to_le_bytes())?;
        for (key, value) in &self.metadata {
            write_string(&mut out, key)?;
            out.write_all(&value_type(value).to_le_bytes())?;
            write_value(&mut out, value)?;
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            write_string(&mut out, &t.name)?;
            out.write_all(&(t.shape.len() as u32).to_le_bytes())?;
            for &d in t.shape.iter().rev() {
                out.write_all(&(d as u64).to_le_bytes())?;
            }
            out.write_all(&t.ggml_type.id().to_le_bytes())?;
            out.write_all(&offset.to_le_bytes())?;
            offset = align(offset + t.n_bytes, alignment);
        }
        let len = out.len() as u64;
        pad(&mut out, align(len, alignment) - len)?;
        Ok(out)
    }
}

/// `path` with `.tmp-<pid>` appended to its file name, in the same directory so the rename stays on one
/// file system.
fn temporary_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}

fn align(n: u64, alignment: u64) -> u64 {
    n.div_ceil(alignment) * alignment
}

fn pad(out: &mut impl Write, n: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 64] = [0; 64];
    let mut left = n;
    while left > 0 {
        let chunk = left.min(ZEROS.len() as u64) as usize;
        out.write_all(&ZEROS[..chunk])?;
        left -= chunk as u64;
    }
    Ok(())
}

/// Writes a GGUF string (`u64` length, bytes); returns the bytes written.
fn write_string(out: &mut impl Write, s: &str) -> std::io::Result<u64> {
    out.write_all(&(s.len() as u64).to_le_bytes())?;
    out.write_all(s.as_bytes())?;
    Ok(8 + s.len() as u64)
}

/// The GGUF value type number of `value` (0..=12).
fn value_type(value: &MetadataValue) -> u32 {
    match value {
        MetadataValue::U8(_) => 0,
        MetadataValue::I8(_) => 1,
        MetadataValue::U16(_) => 2,
        MetadataValue::I16(_) => 3,
        MetadataValue::U32(_) => 4,
        MetadataValue::I32(_) => 5,
        MetadataValue::F32(_) => 6,
        MetadataValue::Bool(_) => 7,
        MetadataValue::String(_) => 8,
        MetadataValue::Array(_) => 9,
        MetadataValue::U64(_) => 10,
        MetadataValue::I64(_) => 11,
        MetadataValue::F64(_) => 12,
    }
}

/// Writes `value` without its type tag; returns the bytes written. An array's element type is its first
/// element's (an empty array is written as one of `u8`); the reader requires every element to share it.
fn write_value(out: &mut impl Write, value: &MetadataValue) -> std::io::Result<u64> {
    let scalar =
        |out: &mut dyn Write, bytes: &[u8]| out.write_all(bytes).map(|()| bytes.len() as u64);
    match value {
        MetadataValue::U8(v) => scalar(out, &v.to_le_bytes()),
        MetadataValue::I8(v) => scalar(out, &v.to_le_bytes()),
        MetadataValue::U16(v) => scalar(out, &v.to_le_bytes()),
        MetadataValue::I16(v) => scalar(out, &v.to_le_bytes()),
        MetadataValue::U32(v) => scalar(out, &v.to_le_bytes()),
        MetadataValue::I32(v) => scalar(out, &v.to_le_bytes()),
        MetadataValue::F32(v) => scalar(out, &v.to_le_bytes()),
        MetadataValue::Bool(v) => scalar(out, &[u8::from(*v)]),
        MetadataValue::U64(v) => scalar(out, &v.to_le_bytes()),
        MetadataValue::I64(v) => scalar(out, &v.to_le_bytes()),
        MetadataValue::F64(v) => scalar(out, &v.to_le_bytes()),
        MetadataValue::String(s) => write_string(out, s),
        MetadataValue::Array(items) => {
            let ty = items.first().map_or(0, value_type);
            out.write_all(&ty.to_le_bytes())?;
            out.write_all(&(items.len() as u64).to_le_bytes())?;
            let mut n = 4 + 8;
            for item in items {
                if value_type(item) != ty {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!(
                            "a GGUF array mixes {} and {} elements",
                            items[0].type_name(),
                            item.type_name()
                        ),
                    ));
                }
                n += write_value(out, item)?;
            }
            Ok(n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_byte_count_or_a_failing_tensor_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.gguf");
        let mut writer = GgufWriter::new();
        writer.set(
            "general.architecture",
            MetadataValue::String("llama".into()),
        );
        writer
            .add_tensor(OutTensor::new("a", GgmlType::F32, vec![2, 3]), &path)
            .unwrap();
        let err = writer
            .write::<GgufError>(&path, |_| Ok(vec![0; 5]))
            .unwrap_err();
        assert!(err.to_string().contains("5 bytes given"), "{err}");
        let err = writer
            .write::<GgufError>(&path, |_| {
                Err(GgufError::Corrupt {
                    path: path.clone(),
                    what: "tensor `a`".into(),
                    reason: "no values".into(),
                })
            })
            .unwrap_err();
        assert!(err.to_string().contains("no values"), "{err}");
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
        writer
            .write::<GgufError>(&path, |_| Ok(vec![0; 24]))
            .unwrap();
        let file = crate::gguf::GgufFile::open(&path).unwrap();
        assert_eq!(file.tensor_info("a").unwrap().shape(), vec![2, 3]);
        assert!(
            writer
                .add_tensor(OutTensor::new("a", GgmlType::F32, vec![1]), &path)
                .is_err(),
            "a name written twice"
        );
        assert!(
            writer
                .add_tensor(OutTensor::new("b", GgmlType::Q8_0, vec![2, 16]), &path)
                .unwrap_err()
                .to_string()
                .contains("not whole Q8_0 blocks")
        );
    }
}
