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

/// The values of every tensor of an f32 safetensors file (a checkpoint's `model.safetensors` or optimizer state)
/// by name, row-major; a tensor of another dtype is an error naming it.
pub fn read_f32_tensors(path: &Path) -> Result<BTreeMap<String, Vec<f32>>, TrainError> {
    let (arrays, _) = read(path)?;
    Ok(arrays
        .into_iter()
        .map(|(name, array)| (name, array.values))
        .collect())
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
    // The crate keeps one of two entries under one name; a checkpoint that names a parameter twice is refused.
    ember_model::weights::check_safetensors_header(&buffer).map_err(invalid)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_tensors_read_back_by_name_and_other_dtypes_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.safetensors");
        let arrays = BTreeMap::from([
            (
                "b".to_string(),
                Array {
                    shape: vec![2, 2],
                    values: vec![1.0, -2.5, 3.0, 0.125],
                },
            ),
            (
                "a".to_string(),
                Array {
                    shape: vec![1],
                    values: vec![7.0],
                },
            ),
        ]);
        write(&path, &arrays, HashMap::new()).unwrap();
        let read = read_f32_tensors(&path).unwrap();
        assert_eq!(read.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(read["b"], [1.0, -2.5, 3.0, 0.125]);
        assert_eq!(read["a"], [7.0]);

        let half = dir.path().join("half.safetensors");
        let bytes = [0u8; 4];
        let view = TensorView::new(Dtype::F16, vec![2], &bytes).unwrap();
        safetensors::serialize_to_file([("w", view)], &None, &half).unwrap();
        let err = read_f32_tensors(&half).unwrap_err().to_string();
        assert!(
            err.contains("half.safetensors") && err.contains('w') && err.contains("F16"),
            "{err}"
        );
    }
}
