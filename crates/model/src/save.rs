//! Saving in the Hugging Face layout (`config.json` + `model.safetensors` with the family's tensor names), so
//! `transformers` loads what ember trains.
//!
//! The family writes its `config.json` and parses it back (`hf_config`): a spec that does not come back equal is
//! `ModelError::Unsaveable`, naming the field, so a knob a family cannot write is never dropped silently.

use std::collections::BTreeMap;
use std::path::Path;

use ember_attention::EmberBackend;
use safetensors::tensor::{Dtype, TensorView};

use crate::arch::{self, Layout, TensorSource};
use crate::error::{ModelError, Result};
use crate::spec::ModelSpec;
use crate::transformer::Transformer;
use crate::weights::SINGLE_FILE;

/// One checkpoint tensor being assembled from the canonical tensors that map into it.
struct Stored {
    source: TensorSource,
    /// Canonical-orientation data; stacked tensors are filled piece by piece.
    data: Vec<f32>,
    rows_written: usize,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The family of `spec` and its Hugging Face `config.json` document.
pub(crate) fn hf_config(
    spec: &ModelSpec,
) -> Result<(&'static dyn arch::Family, serde_json::Value)> {
    let unsaveable = |reason: String| ModelError::Unsaveable {
        architecture: spec.architecture.clone(),
        reason,
    };
    let family = arch::family(&spec.architecture).ok_or_else(|| {
        unsaveable(format!(
            "not a supported architecture ({})",
            arch::supported().join(", ")
        ))
    })?;
    let config = family.to_config(spec).map_err(unsaveable)?;
    // A knob the family's writer does not know would be dropped without a trace: the config must read back as
    // exactly this spec.
    let reparsed = family.parse_config(&config).map_err(|e| {
        unsaveable(format!(
            "the config.json it writes does not parse back: {e}"
        ))
    })?;
    if reparsed != *spec {
        return Err(unsaveable(format!(
            "its config.json cannot express {}",
            spec_differences(spec, &reparsed).join(", ")
        )));
    }
    Ok((family, config))
}

/// `key: value (would load back as other)` for every top-level spec field where `spec` and `reparsed` differ.
pub(crate) fn spec_differences(spec: &ModelSpec, reparsed: &ModelSpec) -> Vec<String> {
    let fields = |s: &ModelSpec| match serde_json::to_value(s) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let (wanted, got) = (fields(spec), fields(reparsed));
    let differing: Vec<String> = wanted
        .iter()
        .filter(|(key, value)| got.get(*key) != Some(value))
        .map(|(key, value)| {
            let other = got
                .get(key)
                .map_or("nothing".to_string(), |v| v.to_string());
            format!("`{key}` = {value} (it would load back as {other})")
        })
        .collect();
    if differing.is_empty() {
        vec!["the spec".to_string()]
    } else {
        differing
    }
}

/// The f32 values of canonical parameter `name` (dequantized if quantized), row-major.
pub(crate) fn parameter_values<B: EmberBackend>(
    model: &Transformer<B>,
    name: &str,
) -> Result<Vec<f32>> {
    model
        .parameter(name)
        .and_then(|d| d.convert::<f32>().into_vec::<f32>().ok())
        .ok_or_else(|| ModelError::InvalidSpec(format!("model has no parameter `{name}`")))
}

/// Writes `config` as `dir/config.json`.
pub(crate) fn write_config(dir: &Path, config: &serde_json::Value) -> Result<()> {
    let config_path = dir.join("config.json");
    let text = serde_json::to_string_pretty(config).map_err(|e| ModelError::Config {
        path: config_path.clone(),
        message: e.to_string(),
    })?;
    std::fs::write(&config_path, text + "\n").map_err(io(&config_path))
}

/// Writes `model` to directory `dir` (created if needed) as its spec's architecture, every weight in f32
/// (quantized weights dequantized; [`crate::save_quantized`] keeps them packed).
pub fn save<B: EmberBackend>(model: &Transformer<B>, dir: &Path) -> Result<()> {
    let spec = model.spec();
    let (family, config) = hf_config(spec)?;

    let mut stored: BTreeMap<String, Stored> = BTreeMap::new();
    for tensor in spec.tensors() {
        let source = family.source(spec, &tensor);
        let values = parameter_values(model, &tensor.name)?;
        let mut canonical_shape = source.stored_shape.clone();
        if source.layout == Layout::Transposed {
            canonical_shape.swap(0, 1);
        }
        let row_len: usize = canonical_shape[1..].iter().product();
        let entry = stored.entry(source.name.clone()).or_insert_with(|| Stored {
            data: vec![0.0; canonical_shape.iter().product()],
            source: source.clone(),
            rows_written: 0,
        });
        match &source.rows {
            None => {
                entry.data.copy_from_slice(&values);
                entry.rows_written += canonical_shape[0];
            }
            Some(ranges) => {
                let mut offset = 0;
                for range in ranges {
                    let len = range.len() * row_len;
                    entry.data[range.start * row_len..range.end * row_len]
                        .copy_from_slice(&values[offset..offset + len]);
                    offset += len;
                    entry.rows_written += range.len();
                }
            }
        }
    }

    let mut bytes: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(stored.len());
    for (name, entry) in stored {
        let shape = entry.source.stored_shape.clone();
        let canonical_rows = if entry.source.layout == Layout::Transposed {
            shape[1]
        } else {
            shape[0]
        };
        if entry.rows_written != canonical_rows {
            return Err(ModelError::InvalidSpec(format!(
                "`{name}`: the family's mapping fills {} of {canonical_rows} rows",
                entry.rows_written
            )));
        }
        let data = match entry.source.layout {
            Layout::Canonical => entry.data,
            Layout::Transposed => crate::weights::transpose(&entry.data, shape[1], shape[0]),
        };
        bytes.push((
            name,
            shape,
            data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ));
    }
    let views = bytes
        .iter()
        .map(|(name, shape, data)| {
            TensorView::new(Dtype::F32, shape.clone(), data).map(|view| (name.clone(), view))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| ModelError::Safetensors {
            path: dir.join(SINGLE_FILE),
            message: format!("{e:?}"),
        })?;

    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let metadata = Some(
        [("format".to_string(), "pt".to_string())]
            .into_iter()
            .collect(),
    );
    let weights_path = dir.join(SINGLE_FILE);
    safetensors::serialize_to_file(views, &metadata, &weights_path).map_err(|e| {
        ModelError::Safetensors {
            path: weights_path.clone(),
            message: format!("{e:?}"),
        }
    })?;
    write_config(dir, &config)
}
