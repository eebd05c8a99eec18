//! Memory-mapped safetensors checkpoints: `model.safetensors` or a sharded `model.safetensors.index.json`.
//!
//! Headers are parsed once per file; tensor bytes stay in the page cache and are converted to `f32` straight
//! from the mapping, so loading copies each weight once (into the vector handed to the backend).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors, TensorInfo};

use crate::error::{ModelError, Result};

/// Name of the single-file checkpoint in a model directory.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the shard index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

struct MappedFile {
    path: PathBuf,
    mmap: Mmap,
    /// Byte offset of the data section (8 + header length).
    data_start: usize,
    tensors: HashMap<String, TensorInfo>,
}

/// An open checkpoint: every tensor's file, dtype, shape and bytes.
pub struct Checkpoint {
    dir: PathBuf,
    files: Vec<MappedFile>,
    /// Tensor name to index into `files`; sorted so listings are deterministic.
    index: BTreeMap<String, usize>,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn corrupt(path: &Path, message: impl Into<String>) -> ModelError {
    ModelError::Safetensors {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn map_file(path: &Path) -> Result<MappedFile> {
    let file = File::open(path).map_err(io_error(path))?;
    // SAFETY: the mapping is read-only and lives as long as the `Checkpoint`; like every mmap-based loader
    // (safetensors, llama.cpp) we assume the checkpoint is not truncated by another process while loaded.
    let mmap = unsafe { Mmap::map(&file) }.map_err(io_error(path))?;
    // The crate keeps one of two entries under one name; ember refuses the file instead.
    ember_optimization::quant::header::check_safetensors_header(&mmap)
        .map_err(|message| corrupt(path, message))?;
    let (header_len, metadata) =
        SafeTensors::read_metadata(&mmap).map_err(|e| corrupt(path, format!("{e:?}")))?;
    let tensors = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| (name, info.clone()))
        .collect();
    Ok(MappedFile {
        path: path.to_path_buf(),
        mmap,
        data_start: 8 + header_len,
        tensors,
    })
}

impl Checkpoint {
    /// Opens the checkpoint of model directory `dir`: the shard index if present, else `model.safetensors`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join(INDEX_FILE);
        let shard_names: Vec<String> = if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path).map_err(io_error(&index_path))?;
            let value: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| corrupt(&index_path, format!("invalid JSON: {e}")))?;
            let map = value
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| corrupt(&index_path, "missing key `weight_map`"))?;
            let mut names = Vec::new();
            for (tensor, file) in map {
                let file = file.as_str().ok_or_else(|| {
                    corrupt(
                        &index_path,
                        format!("`weight_map.{tensor}`: expected a file name, found {file}"),
                    )
                })?;
                // Shards live next to the index; a path elsewhere (`../x`, `/etc/x`) is not a checkpoint's.
                let plain = Path::new(file).components().count() == 1
                    && matches!(
                        Path::new(file).components().next(),
                        Some(std::path::Component::Normal(_))
                    );
                if !plain {
                    return Err(corrupt(
                        &index_path,
                        format!(
                            "`weight_map.{tensor}`: shard `{file}` is not a file name in the model directory"
                        ),
                    ));
                }
                names.push(file.to_string());
            }
            names.sort();
            names.dedup();
            names
        } else {
            vec![SINGLE_FILE.to_string()]
        };
        let paths: Vec<PathBuf> = shard_names.iter().map(|name| dir.join(name)).collect();
        Self::from_files(dir, &paths)
    }

    /// Opens one safetensors file (a PEFT adapter's weights, say) as a checkpoint.
    pub fn open_file(path: &Path) -> Result<Self> {
        Self::from_files(
            path.parent().unwrap_or(Path::new(".")),
            &[path.to_path_buf()],
        )
    }

    fn from_files(dir: &Path, paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut index = BTreeMap::new();
        for path in paths {
            let file = map_file(path)?;
            for tensor in file.tensors.keys() {
                // Two shards holding one tensor would leave which one loads to the order of the files.
                if let Some(previous) = index.insert(tensor.clone(), files.len()) {
                    let previous: &MappedFile = &files[previous];
                    return Err(corrupt(
                        &file.path,
                        format!(
                            "tensor `{tensor}` is also in shard {}",
                            previous.path.display()
                        ),
                    ));
                }
            }
            files.push(file);
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            files,
            index,
        })
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// Whether the checkpoint has a tensor called `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The file holding tensor `name` (the model directory when there is no such tensor), for error messages.
    pub fn file_of(&self, name: &str) -> &Path {
        self.index
            .get(name)
            .map_or(&self.dir, |&i| self.files[i].path.as_path())
    }

    /// The shape of tensor `name`, if present.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        let file = &self.files[*self.index.get(name)?];
        file.tensors.get(name).map(|info| info.shape.as_slice())
    }

    /// Tensor `name` converted to `f32` (from f32, f16, bf16 or f64), row-major in its stored shape.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let Some(&file_index) = self.index.get(name) else {
            return Err(corrupt(&self.dir, format!("no tensor `{name}`")));
        };
        let file = &self.files[file_index];
        let info = &file.tensors[name];
        let (start, end) = info.data_offsets;
        // `read_metadata` validated that offsets are contiguous and within the file.
        let bytes = &file.mmap[file.data_start + start..file.data_start + end];
        Ok(match info.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::F64 => bytes
                .chunks_exact(8)
                .map(|b| {
                    f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32
                })
                .collect(),
            other => {
                return Err(corrupt(
                    &file.path,
                    format!("tensor `{name}` has dtype {other:?}; expected F32, F16 or BF16"),
                ));
            }
        })
    }
}
