//! Parsing the GGUF header, metadata and tensor infos from a byte slice.
//!
//! Layout (little-endian): magic `GGUF`, version `u32`, tensor count `u64`, metadata count `u64`, the metadata
//! (`string key`, `u32 type`, value), the tensor infos (`string name`, `u32 n_dims`, `u64 dims[n_dims]` innermost
//! first, `u32 ggml type`, `u64 offset` relative to the data section), padding to `general.alignment` (default
//! 32), then the data section. Strings are a `u64` byte length followed by UTF-8 bytes.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::GgmlType;
use super::error::GgufError;
use super::metadata::MetadataValue;

/// The alignment of the data section and of every tensor when the file does not set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Arrays nested deeper than this are rejected, so a corrupt file cannot exhaust the stack.
const MAX_ARRAY_DEPTH: usize = 8;

/// The most metadata array elements a file may hold in total (16.7 million). Each element becomes a
/// [`MetadataValue`] of 32 bytes however few bytes it takes in the file (a `u8` takes one), so without a cap a file
/// of `n` bytes could make the reader allocate `32 n`. The largest real arrays are tokenizer vocabularies and
/// merges (a few hundred thousand entries), far below this; at the cap the values take 512 MiB.
pub const MAX_METADATA_ELEMENTS: u64 = 1 << 24;

/// Entries reserved up front for the metadata and tensor lists, whatever count the header claims.
const INITIAL_RESERVE: u64 = 1024;

/// The fewest bytes one metadata key/value pair takes: a key length (`u64`), a type (`u32`), a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// The fewest bytes one tensor info takes: a name length (`u64`), `n_dims` (`u32`), a type (`u32`), an offset
/// (`u64`).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

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
    /// Number of elements (`u64::MAX` if the product overflows, which [`GgufFile::open`](super::GgufFile::open) never lets through).
    pub fn n_elements(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// The shape outermost first (`[rows, cols]` for a matrix), as burn and PyTorch order it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Bytes of data, or `None` for a type whose layout is unknown or a size that does not fit a `u64` (which
    /// [`GgufFile::open`](super::GgufFile::open) rejects).
    pub fn n_bytes(&self) -> Option<u64> {
        let (block_len, block_bytes) = self.ggml_type.block_geometry()?;
        let elements = self
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        (elements / block_len as u64).checked_mul(block_bytes as u64)
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
    /// Metadata array elements still allowed ([`MAX_METADATA_ELEMENTS`] minus those read).
    elements_left: u64,
}

impl<'a> Cursor<'a> {
    /// Bytes after the cursor.
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

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

    /// The `len` elements of an array of type `elem_ty`, checked before anything is allocated: the elements must
    /// fit in the rest of the file at their smallest encoded size, and in what is left of the file's element
    /// budget ([`MAX_METADATA_ELEMENTS`]).
    fn array_items(
        &mut self,
        elem_ty: u32,
        len: u64,
        what: &str,
        depth: usize,
    ) -> Result<Vec<MetadataValue>, GgufError> {
        let min_bytes = min_value_bytes(elem_ty)
            .ok_or_else(|| self.corrupt(what, format!("unknown array element type {elem_ty}")))?;
        let remaining = self.remaining();
        if len.checked_mul(min_bytes).is_none_or(|n| n > remaining) {
            return Err(self.corrupt(
                what,
                format!(
                    "array of {len} elements of type {elem_ty} needs at least {min_bytes} bytes each, but only \
                     {remaining} bytes are left in the file"
                ),
            ));
        }
        if len > self.elements_left {
            return Err(self.corrupt(
                what,
                format!(
                    "array of {len} elements exceeds the limit of {MAX_METADATA_ELEMENTS} metadata array \
                     elements per file ({} left)",
                    self.elements_left
                ),
            ));
        }
        self.elements_left -= len;
        // `len` is bounded above, so this is at most 512 MiB; `try_reserve` turns a refused allocation (a small
        // address-space limit) into an error instead of an abort.
        let mut items = Vec::new();
        items.try_reserve_exact(len as usize).map_err(|e| {
            self.corrupt(what, format!("cannot allocate {len} array elements: {e}"))
        })?;
        for _ in 0..len {
            items.push(self.value(elem_ty, what, depth + 1)?);
        }
        Ok(items)
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
                V::Array(self.array_items(elem_ty, len, what, depth)?)
            }
            10 => V::U64(self.u64(what)?),
            11 => V::I64(i64::from_le_bytes(self.array(what)?)),
            12 => V::F64(f64::from_le_bytes(self.array(what)?)),
            other => return Err(self.corrupt(what, format!("unknown metadata value type {other}"))),
        })
    }
}

/// The fewest bytes a metadata value of type `ty` takes in the file, or `None` for an unknown type.
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        // A string is at least its `u64` length; an array its `u32` element type and `u64` length.
        8 => 8,
        9 => 4 + 8,
        10..=12 => 8,
        _ => return None,
    })
}

/// Parses everything before the data section of `bytes` (the whole file), checking that every count fits the file
/// before anything is allocated for it, that keys and tensor names are unique, and that every tensor of a known
/// type lies inside the file without overlapping another. `path` only names the file in errors.
pub fn parse_header(bytes: &[u8], path: &Path) -> Result<Header, GgufError> {
    let mut c = Cursor {
        bytes,
        pos: 0,
        path,
        elements_left: MAX_METADATA_ELEMENTS,
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
    // Both lists must fit in the rest of the file at their smallest encoded size; checking this first bounds the
    // reservations below by the file's size.
    let needed = n_kv.checked_mul(MIN_KV_BYTES).and_then(|kv| {
        n_tensors
            .checked_mul(MIN_TENSOR_INFO_BYTES)?
            .checked_add(kv)
    });
    if needed.is_none_or(|n| n > c.remaining()) {
        return Err(GgufError::Truncated {
            path: path.to_path_buf(),
            what: format!(
                "the tensor and metadata counts ({n_kv} metadata entries of at least {MIN_KV_BYTES} bytes and \
                 {n_tensors} tensor infos of at least {MIN_TENSOR_INFO_BYTES} bytes)"
            ),
            offset: c.pos as u64,
            len: bytes.len() as u64,
        });
    }

    // Even a count that fits the file may be a lie (the rest of the file being tensor data), so reserve for a
    // bounded number of entries and grow only as entries are actually read.
    let mut metadata = Vec::with_capacity(n_kv.min(INITIAL_RESERVE) as usize);
    let mut keys = HashSet::with_capacity(n_kv.min(INITIAL_RESERVE) as usize);
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key #{i}"))?;
        if !keys.insert(key.clone()) {
            // A reader looking a key up would silently see only one of the values.
            return Err(c.corrupt(
                &format!("metadata key #{i}"),
                format!("key `{key}` appears twice"),
            ));
        }
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

    let mut tensors = Vec::with_capacity(n_tensors.min(INITIAL_RESERVE) as usize);
    let mut names = HashSet::with_capacity(n_tensors.min(INITIAL_RESERVE) as usize);
    for i in 0..n_tensors {
        let tensor = tensor_info(&mut c, i, alignment)?;
        if !names.insert(tensor.name.clone()) {
            return Err(c.corrupt(
                &format!("tensor info #{i}"),
                format!("tensor name `{}` appears twice", tensor.name),
            ));
        }
        tensors.push(tensor);
    }

    let file_len = bytes.len() as u64;
    let data_start = (c.pos as u64)
        .div_ceil(alignment)
        .checked_mul(alignment)
        .ok_or_else(|| {
            c.corrupt(
                "the data section",
                format!("alignment {alignment} overflows"),
            )
        })?;
    for t in &mut tensors {
        t.offset = t
            .offset
            .checked_add(data_start)
            .ok_or_else(|| c.corrupt(&format!("tensor `{}`", t.name), "offset overflows".into()))?;
        check_extent(t, file_len, path)?;
    }
    check_overlaps(&tensors, path)?;
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
    })
}

/// Reads tensor info number `i`: name, dims, type and (relative, aligned) offset.
fn tensor_info(c: &mut Cursor<'_>, i: u64, alignment: u64) -> Result<TensorInfo, GgufError> {
    let name = c.string(&format!("tensor info #{i}"))?;
    if name.is_empty() {
        // No writer emits an empty name; a zeroed region read as a tensor info (a tensor count one too high, the
        // infos then running into padding or data) does.
        return Err(c.corrupt(
            &format!("tensor info #{i}"),
            "the tensor name is empty".into(),
        ));
    }
    let what = format!("tensor `{name}`");
    let n_dims = c.u32(&what)?;
    if n_dims > 8 {
        return Err(c.corrupt(&what, format!("{n_dims} dimensions (at most 8 supported)")));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64(&what)?);
    }
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
        return Err(c.corrupt(
            &what,
            format!("dimensions {dims:?} overflow: their product does not fit in 64 bits"),
        ));
    }
    let tensor = TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
    };
    if ggml_type.block_geometry().is_some() && tensor.n_bytes().is_none() {
        return Err(c.corrupt(
            &what,
            format!(
                "{} {ggml_type} elements take more than 2^64 bytes",
                tensor.n_elements()
            ),
        ));
    }
    Ok(tensor)
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
    // `tensor_info` rejected sizes that overflow.
    let n_bytes = t.n_bytes().unwrap_or(u64::MAX);
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

/// Checks that no two tensors share bytes: a tensor whose data runs into the next one's reads that tensor's
/// values as its own. Empty tensors and tensors of unknown type (never read) take no bytes.
fn check_overlaps(tensors: &[TensorInfo], path: &Path) -> Result<(), GgufError> {
    let mut extents: Vec<(u64, u64, &str)> = tensors
        .iter()
        .filter_map(|t| {
            let len = t.n_bytes().filter(|&n| n > 0)?;
            // `check_extent` proved `offset + len` fits for known types.
            Some((t.offset, t.offset.saturating_add(len), t.name.as_str()))
        })
        .collect();
    extents.sort_unstable();
    for pair in extents.windows(2) {
        let [(start, end, name), (next_start, _, next)] = [pair[0], pair[1]];
        // Sorted by start, non-empty extents are disjoint exactly when each ends before the next begins.
        if next_start < end {
            return Err(GgufError::Corrupt {
                path: path.to_path_buf(),
                what: format!("tensor `{name}`"),
                reason: format!(
                    "its data (bytes {start}..{end}) overlaps the data of tensor `{next}`, which starts at byte \
                     {next_start}"
                ),
            });
        }
    }
    Ok(())
}
