//! Safetensors checkpoints mixing quantized and dense tensors.
//!
//! A quantized weight `NAME` is stored as three tensors plus one metadata entry:
//! - `NAME.qcodes`: U8 `[out_features, row_bytes]`, the packed codes of [`QuantizedWeight`];
//! - `NAME.scales`: F32 `[out_features, groups_per_row]`;
//! - `NAME.mins`: F32 `[out_features, groups_per_row]`, asymmetric schemes only (the zero-point
//!   offsets, `w = c * s + m`);
//! - metadata key `ember.quantization`: a JSON object mapping each `NAME` to
//!   `{"scheme": "int4-g32", "shape": [out_features, in_features]}`.
//!
//! Every other tensor is dense F32 and kept under its own name. The metadata key `format` is set
//! to [`FORMAT`] so readers can tell an ember quantized file from a plain one.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::{SafeTensors, serialize_to_file};
use serde::{Deserialize, Serialize};

use crate::error::QuantError;
use crate::quant::header::{UniqueKeyMap, check_safetensors_header};
use crate::quant::scheme::QuantScheme;
use crate::quant::weight::QuantizedWeight;

/// Value of the `format` metadata entry written by [`QuantizedCheckpoint::save`].
pub const FORMAT: &str = "ember-quantized-v1";

/// Metadata key holding the JSON description of every quantized tensor.
pub const METADATA_KEY: &str = "ember.quantization";

/// A dense f32 tensor kept next to quantized ones (norms, biases, unquantized embeddings).
#[derive(Clone, Debug, PartialEq)]
pub struct DenseTensor {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Row-major values.
    pub values: Vec<f32>,
}

/// Named quantized and dense tensors, saved to and loaded from one safetensors file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantizedCheckpoint {
    /// Quantized weights by name.
    pub quantized: BTreeMap<String, QuantizedWeight>,
    /// Dense f32 tensors by name.
    pub dense: BTreeMap<String, DenseTensor>,
}

/// What the metadata records per quantized tensor.
#[derive(Serialize, Deserialize)]
struct Entry {
    scheme: String,
    shape: [usize; 2],
}

impl QuantizedCheckpoint {
    /// Writes every tensor and the scheme metadata to `path`.
    pub fn save(&self, path: &Path) -> Result<(), QuantError> {
        let mut buffers: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut entries = BTreeMap::new();
        for (name, weight) in &self.quantized {
            let [rows, cols] = weight.shape();
            let groups = weight.groups_per_row();
            buffers.push((
                format!("{name}.qcodes"),
                Dtype::U8,
                vec![rows, weight.row_bytes()],
                weight.packed_codes().to_vec(),
            ));
            buffers.push((
                format!("{name}.scales"),
                Dtype::F32,
                vec![rows, groups],
                f32_bytes(weight.scales()),
            ));
            if let Some(mins) = weight.mins() {
                buffers.push((
                    format!("{name}.mins"),
                    Dtype::F32,
                    vec![rows, groups],
                    f32_bytes(mins),
                ));
            }
            let entry = Entry {
                scheme: weight.scheme().to_string(),
                shape: [rows, cols],
            };
            entries.insert(name.clone(), entry);
        }
        for (name, tensor) in &self.dense {
            buffers.push((
                name.clone(),
                Dtype::F32,
                tensor.shape.clone(),
                f32_bytes(&tensor.values),
            ));
        }
        let checkpoint_error = |reason: String| QuantError::Checkpoint {
            path: path.to_path_buf(),
            reason,
        };
        let views = buffers
            .iter()
            .map(|(name, dtype, shape, bytes)| {
                TensorView::new(*dtype, shape.clone(), bytes)
                    .map(|view| (name.clone(), view))
                    .map_err(|err| checkpoint_error(format!("tensor `{name}`: {err}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let description = serde_json::to_string(&entries)
            .map_err(|err| checkpoint_error(format!("metadata: {err}")))?;
        let metadata = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            (METADATA_KEY.to_string(), description),
        ]);
        serialize_to_file(views, &Some(metadata), path).map_err(|source| QuantError::Safetensors {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Reads a file written by [`save`](Self::save). Tensors not named by the metadata must be
    /// F32 and become [`dense`](Self::dense) entries.
    pub fn load(path: &Path) -> Result<Self, QuantError> {
        let bytes = std::fs::read(path).map_err(|source| QuantError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let fail = |reason: String| QuantError::Checkpoint {
            path: path.to_path_buf(),
            reason,
        };
        check_safetensors_header(&bytes).map_err(fail)?;
        let file = SafeTensors::deserialize(&bytes).map_err(|source| QuantError::Safetensors {
            path: path.to_path_buf(),
            source,
        })?;
        let (_, header) =
            SafeTensors::read_metadata(&bytes).map_err(|source| QuantError::Safetensors {
                path: path.to_path_buf(),
                source,
            })?;
        let entries: UniqueKeyMap<Entry> = match header
            .metadata()
            .as_ref()
            .and_then(|meta| meta.get(METADATA_KEY))
        {
            Some(json) => serde_json::from_str(json)
                .map_err(|err| fail(format!("metadata `{METADATA_KEY}`: {err}")))?,
            None => UniqueKeyMap {
                entries: Vec::new(),
                duplicate: None,
            },
        };
        // A JSON object read into a map would silently keep one of two descriptions of a tensor.
        if let Some(name) = entries.duplicate {
            return Err(fail(format!(
                "metadata `{METADATA_KEY}` describes quantized tensor `{name}` twice"
            )));
        }
        let mut checkpoint = Self::default();
        let mut consumed = Vec::new();
        for (name, entry) in entries.entries {
            let scheme: QuantScheme = entry
                .scheme
                .parse()
                .map_err(|err| fail(format!("metadata for `{name}`: {err}")))?;
            let expected = Expected::of(scheme, entry.shape).ok_or_else(|| {
                fail(format!(
                    "metadata for `{name}`: shape {:?} with scheme {scheme} needs more bytes than fit in memory",
                    entry.shape
                ))
            })?;
            let tensor = |suffix: &str, dtype: Dtype| {
                let key = format!("{name}.{suffix}");
                let view = file
                    .tensor(&key)
                    .map_err(|err| fail(format!("tensor `{key}`: {err}")))?;
                if view.dtype() != dtype {
                    return Err(fail(format!(
                        "tensor `{key}`: expected dtype {dtype:?}, found {:?}",
                        view.dtype()
                    )));
                }
                // The stored shape is checked too, not only the length: a writer never transposes these.
                let [rows, cols] = entry.shape;
                let want = match suffix {
                    "qcodes" => [rows, expected.row_bytes],
                    _ => [rows, expected.groups],
                };
                if view.shape() != want {
                    return Err(fail(format!(
                        "tensor `{key}`: the metadata's shape [{rows}, {cols}] with scheme {scheme} means shape \
                         {want:?}, found {:?}",
                        view.shape()
                    )));
                }
                Ok((key, view.data().to_vec()))
            };
            let (codes_key, codes) = tensor("qcodes", Dtype::U8)?;
            let (scales_key, scales) = tensor("scales", Dtype::F32)?;
            consumed.extend([codes_key, scales_key]);
            let mins = if scheme.is_asymmetric() {
                let (key, mins) = tensor("mins", Dtype::F32)?;
                consumed.push(key);
                Some(f32_values(&mins))
            } else {
                None
            };
            let weight =
                QuantizedWeight::from_parts(scheme, entry.shape, codes, f32_values(&scales), mins)
                    .map_err(|err| fail(format!("quantized tensor `{name}`: {err}")))?;
            checkpoint.quantized.insert(name, weight);
        }
        for (name, view) in file.tensors() {
            if consumed.contains(&name) {
                continue;
            }
            if view.dtype() != Dtype::F32 {
                return Err(fail(format!(
                    "tensor `{name}`: expected dtype F32 for a dense tensor, found {:?}",
                    view.dtype()
                )));
            }
            let tensor = DenseTensor {
                shape: view.shape().to_vec(),
                values: f32_values(view.data()),
            };
            checkpoint.dense.insert(name, tensor);
        }
        Ok(checkpoint)
    }

    /// Bytes of all tensor payloads (packed codes, scales, minimums and dense values).
    pub fn payload_bytes(&self) -> usize {
        let quantized: usize = self.quantized.values().map(|w| w.storage_bytes()).sum();
        let dense: usize = self.dense.values().map(|t| 4 * t.values.len()).sum();
        quantized + dense
    }
}

/// The per-row sizes a `[rows, cols]` weight of a scheme has, computed without overflow: the shape comes from
/// the file, and [`QuantizedWeight::from_parts`] multiplies it out unchecked.
struct Expected {
    /// Bytes of packed codes per row.
    row_bytes: usize,
    /// Scales (and minimums) per row.
    groups: usize,
}

impl Expected {
    /// `None` when the codes, scales or minimums of the whole weight would not fit in `usize` bytes.
    fn of(scheme: QuantScheme, [rows, cols]: [usize; 2]) -> Option<Self> {
        let group = scheme.group_len(cols);
        if group == 0 {
            // `validate` (inside `from_parts`) reports the zero size by name.
            return Some(Self {
                row_bytes: 0,
                groups: 0,
            });
        }
        let groups = cols.div_ceil(group);
        let row_bytes = groups.checked_mul(group)?.checked_mul(scheme.bits())? / 8;
        rows.checked_mul(row_bytes)?;
        rows.checked_mul(groups)?.checked_mul(4)?;
        Some(Self { row_bytes, groups })
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
