//! Named f32 arrays in a safetensors file: the on-disk form of parameters and optimizer state.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::TrainError;

/// One array: its shape and its values in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Array {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// Writes `arrays` (and string `metadata`) to `path` as little-endian f32 safetensors.
pub(crate) fn write(
    path: &Path,
    arrays: &BTreeMap<String, Array>,
    metadata: HashMap<String, String>,
) -> Result<(), TrainError> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = arrays
        .iter()
        .map(|(name, a)| {
            (
                name.clone(),
                a.shape.clone(),
                a.values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        })
        .collect();
    let mut views = Vec::with_capacity(bytes.len());
    for (name, shape, data) in &bytes {
        let view = TensorView::new(Dtype::F32, shape.clone(), data).map_err(|e| {
            TrainError::Safetensors {
                path: path.to_path_buf(),
                message: format!("{name}: {e}"),
            }
        })?;
        views.push((name.clone(), view));
    }
    let metadata = if metadata.is_empty() {
        None
    } else {
        Some(metadata)
    };
    safetensors::serialize_to_file(views, &metadata, path).map_err(|e| TrainError::Safetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Arrays by name, and the file's string metadata.
pub(crate) type Contents = (BTreeMap<String, Array>, HashMap<String, String>);

/// Reads every array and the metadata of a file written by [`write`]; non-f32 tensors are an error.
pub(crate) fn read(path: &Path) -> Result<Contents, TrainError> {
    let buffer = std::fs::read(path).map_err(|e| TrainError::io(path, e))?;
    let invalid = |message: String| TrainError::Safetensors {
        path: path.to_path_buf(),
        message,
    };
    let (_, header) = SafeTensors::read_metadata(&buffer).map_err(|e| invalid(e.to_string()))?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let file = SafeTensors::deserialize(&buffer).map_err(|e| invalid(e.to_string()))?;
    let mut arrays = BTreeMap::new();
    for (name, view) in file.tensors() {
        if view.dtype() != Dtype::F32 {
            return Err(TrainError::Mismatch {
                path: path.to_path_buf(),
                name,
                message: format!("expected dtype F32, found {:?}", view.dtype()),
            });
        }
        let values = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        arrays.insert(
            name,
            Array {
                shape: view.shape().to_vec(),
                values,
            },
        );
    }
    Ok((arrays, metadata))
}
