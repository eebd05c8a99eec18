//! Parsing the GGUF header, metadata and tensor infos from a byte slice.
//!
//! Layout (little-endian): magic `GGUF`, version `u32`, tensor count `u64`, metadata count `u64`, the metadata
//! (`string key`, `u32 type`, value), the tensor infos (`string name`, `u32 n_dims`, `u64 dims[n_dims]` innermost
//! first, `u32 ggml type`, `u64 offset` relative to the data section), padding to `general.alignment` (default
//! 32), then the data section. Strings are a `u64` byte length followed by UTF-8 bytes.

use std::path::{Path, PathBuf};

use super::error::GgufError;
use super::ggml_type::GgmlType;
use super::metadata::MetadataValue;

/// The alignment of the data section and of every tensor when the file does not set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Arrays nested deeper than this are rejected, so a corrupt file cannot exhaust the stack.
const MAX_ARRAY_DEPTH: usize = 8;

/// Where one tensor lives in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions as stored: innermost (contiguous) first, the reverse of the PyTorch shape.
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the tensor's data in the file.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The shape outermost first (`[rows, cols]` for a matrix), as burn and PyTorch order it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Bytes of data, or `None` for a type whose layout is unknown.
    pub fn n_bytes(&self) -> Option<u64> {
        let (block_len, block_bytes) = self.ggml_type.block_geometry()?;
        Some(self.n_elements() / block_len as u64 * block_bytes as u64)
    }
}

/// The parsed structure of a GGUF file (everything but the tensor data).
#[derive(Debug)]
pub struct Header {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, MetadataValue)>,
    /// Tensor infos in file order, offsets made absolute.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of the data section and tensors.
    pub alignment: u64,
}

/// A bounds-checked little-endian cursor that names the file and the item being read in its errors.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what.to_string(),
                offset: self.pos as u64,
                len: self.bytes.len() as u64,
            });
        };
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| self.corrupt(what, format!("string is not UTF-8: {e}")))
    }

    fn corrupt(&self, what: &str, reason: String) -> GgufError {
        GgufError::Corrupt {
            path: self.path.to_path_buf(),
            what: what.to_string(),
            reason,
        }
    }

    fn value(&mut self, ty: u32, what: &str, depth: usize) -> Result<MetadataValue, GgufError> {
        use MetadataValue as V;
        Ok(match ty {
            0 => V::U8(self.array::<1>(what)?[0]),
            1 => V::I8(i8::from_le_bytes(self.array(what)?)),
            2 => V::U16(u16::from_le_bytes(self.array(what)?)),
            3 => V::I16(i16::from_le_bytes(self.array(what)?)),
            4 => V::U32(self.u32(what)?),
            5 => V::I32(i32::from_le_bytes(self.array(what)?)),
            6 => V::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => V::Bool(false),
                1 => V::Bool(true),
                b => return Err(self.corrupt(what, format!("bool byte is {b}, expected 0 or 1"))),
            },
            8 => V::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(
                        self.corrupt(what, format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"))
                    );
                }
                let elem_ty = self.u32(what)?;
                let len = self.u64(what)?;
                // Every element takes at least one byte, so a count beyond the remaining bytes is corrupt; checking
                // first keeps a bad count from reserving unbounded memory.
                if len > (self.bytes.len() - self.pos) as u64 {
                    return Err(
                        self.corrupt(what, format!("array of {len} elements exceeds the file"))
                    );
                }
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(elem_ty, what, depth + 1)?);
                }
                V::Array(items)
            }
            10 => V::U64(self.u64(what)?),
            11 => V::I64(i64::from_le_bytes(self.array(what)?)),
            12 => V::F64(f64::from_le_bytes(self.array(what)?)),
            other => return Err(self.corrupt(what, format!("unknown metadata value type {other}"))),
        })
    }
}

/// Parses everything before the data section of `bytes` (the whole file), checking that every tensor of a known
/// type lies inside the file. `path` only names the file in errors.
pub fn parse_header(bytes: &[u8], path: &Path) -> Result<Header, GgufError> {
    let mut c = Cursor {
        bytes,
        pos: 0,
        path,
    };
    let magic: [u8; 4] = c.array("the magic number")?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic {
            path: path.to_path_buf(),
            found: magic,
        });
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion {
            path: path.to_path_buf(),
            version,
        });
    }
    let n_tensors = c.u64("the tensor count")?;
    let n_kv = c.u64("the metadata count")?;

    let mut metadata = Vec::new();
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key #{i}"))?;
        let ty = c.u32(&format!("the type of metadata key `{key}`"))?;
        let value = c.value(ty, &format!("metadata key `{key}`"), 0)?;
        metadata.push((key, value));
    }
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => {
                return Err(c.corrupt(
                    "metadata key `general.alignment`",
                    format!("{v:?} is not a power of two"),
                ));
            }
        },
    };

    let mut tensors = Vec::new();
    for i in 0..n_tensors {
        let name = c.string(&format!("tensor info #{i}"))?;
        let what = format!("tensor `{name}`");
        let n_dims = c.u32(&what)?;
        if n_dims > 8 {
            return Err(c.corrupt(&what, format!("{n_dims} dimensions (at most 8 supported)")));
        }
        let dims = (0..n_dims)
            .map(|_| c.u64(&what))
            .collect::<Result<Vec<_>, _>>()?;
        let ggml_type = GgmlType::from_id(c.u32(&what)?);
        let offset = c.u64(&what)?;
        if !offset.is_multiple_of(alignment) {
            return Err(c.corrupt(
                &what,
                format!("data offset {offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        if dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .is_none()
        {
            return Err(c.corrupt(&what, format!("dimensions {dims:?} overflow")));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
        });
    }

    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    for t in &mut tensors {
        t.offset = t.offset.saturating_add(data_start);
        check_extent(t, bytes.len() as u64, path)?;
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
    })
}

/// Checks that a tensor of known type is a whole number of blocks and ends inside the file.
fn check_extent(t: &TensorInfo, file_len: u64, path: &Path) -> Result<(), GgufError> {
    let Some((block_len, _)) = t.ggml_type.block_geometry() else {
        return Ok(());
    };
    let corrupt = |reason: String| GgufError::Corrupt {
        path: PathBuf::from(path),
        what: format!("tensor `{}`", t.name),
        reason,
    };
    let inner = t.dims.first().copied().unwrap_or(1);
    if !inner.is_multiple_of(block_len as u64) {
        return Err(corrupt(format!(
            "innermost dimension {inner} is not a multiple of the {} block size {block_len}",
            t.ggml_type
        )));
    }
    let n_bytes = t.n_bytes().unwrap_or(0);
    if t.offset
        .checked_add(n_bytes)
        .is_none_or(|end| end > file_len)
    {
        return Err(GgufError::Truncated {
            path: path.to_path_buf(),
            what: format!("the data of tensor `{}` ({n_bytes} bytes)", t.name),
            offset: t.offset,
            len: file_len,
        });
    }
    Ok(())
}
