//! Saving a model as a GGUF file that llama.cpp runs: the family's metadata, the tokenizer's `tokenizer.*` keys,
//! and every canonical tensor put back where llama.cpp's converter puts it (renamed, query/key rows permuted,
//! fused tensors assembled, Gemma's norm offset added), each in the type a [`GgufRecipe`] gives it.
//!
//! The file must load back as exactly the model: before the temporary file is renamed into place it is opened
//! with ember's own reader, and its spec compared with the model's (floats rounded to f32, as GGUF stores them).

use std::collections::BTreeMap;
use std::path::Path;

use ember_attention::EmberBackend;
use ember_attention::ggml::{QuantizeError, quantize};

use super::recipe::{GgufRecipe, RecipeTensor};
use super::writer::{GgufWriter, OutTensor};
use super::{GgmlType, GgufError, GgufFile, MetadataValue, OUTPUT, lineage, permute_rows};
use crate::arch::{self, GgufTensor};
use crate::error::{ModelError, Result};
use crate::save::parameter_values;
use crate::transformer::Transformer;

/// What goes into a GGUF file besides the model's weights.
#[derive(Clone, Debug)]
pub struct GgufExport {
    /// The per-tensor type mix.
    pub recipe: GgufRecipe,
    /// The tokenizer's `tokenizer.*` keys (see [`super::vocab_metadata`]), copied in order.
    pub tokenizer: Vec<(String, MetadataValue)>,
    /// `general.name`, if any.
    pub name: Option<String>,
}

/// What was written.
#[derive(Clone, Debug, Default)]
pub struct GgufSummary {
    /// Tensors in the file.
    pub tensors: usize,
    /// Bytes of tensor data.
    pub data_bytes: u64,
    /// How many tensors each type holds, in first-use order.
    pub types: Vec<(GgmlType, usize)>,
}

/// A canonical tensor on its way into a GGUF tensor: where it goes, its values and its canonical shape.
type Piece = (GgufTensor, Vec<f32>, Vec<usize>);

/// One GGUF tensor being assembled from the canonical tensors stored in it.
struct Assembled {
    /// Canonical-orientation `[rows, cols]` (or `[len]`) values; fused tensors are filled piece by piece.
    values: Vec<f32>,
    shape: Vec<usize>,
}

/// Writes `model` to `path` as a GGUF file (atomically) and checks that it loads back as the same model.
/// `progress` is called with `(done, total, tensor name)` as tensors are converted.
pub fn save_gguf<B: EmberBackend>(
    model: &Transformer<B>,
    export: &GgufExport,
    path: &Path,
    mut progress: Option<crate::weights::Progress<'_>>,
) -> Result<GgufSummary> {
    let spec = model.spec();
    let unwritable = |reason: String| ModelError::Unsaveable {
        architecture: format!("{} (GGUF)", spec.architecture),
        reason,
    };
    let family = arch::family(&spec.architecture)
        .ok_or_else(|| unwritable("not a supported architecture".to_string()))?;
    let gguf_arch = family
        .gguf_architecture()
        .ok_or_else(|| unwritable("ember does not write this family as GGUF".to_string()))?;
    let family_metadata = family.gguf_metadata(spec).map_err(unwritable)?;

    let mut writer = GgufWriter::new();
    writer.set(
        "general.architecture",
        MetadataValue::String(gguf_arch.to_string()),
    );
    if let Some(name) = &export.name {
        writer.set("general.name", MetadataValue::String(name.clone()));
    }
    writer.set(
        "general.file_type",
        MetadataValue::U32(export.recipe.file_type()),
    );
    writer.set("general.quantization_version", MetadataValue::U32(2));
    for (key, value) in family_metadata {
        writer.set(key, value);
    }
    for (key, value) in &export.tokenizer {
        writer.set(key.clone(), value.clone());
    }

    let stored = assemble(model, family, spec).map_err(unwritable)?;
    let tied = !stored.iter().any(|(name, _)| name == OUTPUT);
    let gqa = spec.num_heads / spec.num_kv_heads.max(1);
    let total = stored.len();
    let mut summary = GgufSummary::default();
    for (done, (name, tensor)) in stored.into_iter().enumerate() {
        if let Some(report) = progress.as_mut() {
            report(done, total, &name);
        }
        let cols = tensor.shape.last().copied().unwrap_or(1);
        let role = RecipeTensor {
            name: &name,
            dims: tensor.shape.len(),
            cols,
            layer: name
                .strip_prefix("blk.")
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(layer, _)| layer.parse().ok()),
            layers: spec.num_layers,
            tied,
            gqa,
        };
        let ty = export.recipe.tensor_type(&role);
        let data = quantize(ty, &tensor.values, cols)
            .map_err(|e: QuantizeError| unwritable(format!("tensor `{name}` as {ty}: {e}")))?;
        summary.data_bytes += data.len() as u64;
        match summary.types.iter_mut().find(|(t, _)| *t == ty) {
            Some((_, n)) => *n += 1,
            None => summary.types.push((ty, 1)),
        }
        writer.add_tensor(
            OutTensor {
                name,
                ggml_type: ty,
                shape: tensor.shape,
                data,
            },
            path,
        )?;
    }
    if let Some(report) = progress.as_mut() {
        report(total, total, "");
    }
    summary.tensors = total;
    write_checked(&writer, path, spec)?;
    Ok(summary)
}

/// Every GGUF tensor of `model`, in the order its canonical tensors come, assembled from them.
fn assemble<B: EmberBackend>(
    model: &Transformer<B>,
    family: &dyn arch::Family,
    spec: &crate::spec::ModelSpec,
) -> std::result::Result<Vec<(String, Assembled)>, String> {
    let mut order: Vec<String> = Vec::new();
    let mut pieces: BTreeMap<String, Vec<Piece>> = BTreeMap::new();
    for tensor in spec.tensors() {
        let place = family
            .gguf_tensor(spec, &tensor)
            .ok_or_else(|| format!("tensor `{}` has no place in a GGUF file", tensor.name))?;
        let values = parameter_values(model, &tensor.name).map_err(|e| e.to_string())?;
        if !pieces.contains_key(&place.name) {
            order.push(place.name.clone());
        }
        pieces
            .entry(place.name.clone())
            .or_default()
            .push((place, values, tensor.shape.clone()));
    }
    order
        .into_iter()
        .map(|name| {
            let parts = pieces.remove(&name).unwrap_or_default();
            fuse(&name, parts).map(|t| (name, t))
        })
        .collect()
}

/// One GGUF tensor from its canonical pieces: each permuted and offset as the converter does, then laid at its
/// rows (a whole tensor is one piece covering every row).
fn fuse(name: &str, parts: Vec<Piece>) -> std::result::Result<Assembled, String> {
    let Some((_, _, first_shape)) = parts.first() else {
        return Err(format!("tensor `{name}` has no pieces"));
    };
    let cols: usize = first_shape[1..].iter().product();
    let rows = parts
        .iter()
        .map(|(place, _, shape)| place.rows.as_ref().map_or(shape[0], |r| r.end))
        .max()
        .unwrap_or(0);
    let mut shape = first_shape.clone();
    if !shape.is_empty() {
        shape[0] = rows;
    }
    let mut values = vec![0.0f32; rows * cols.max(1)];
    let mut covered = 0usize;
    for (place, mut piece, piece_shape) in parts {
        let piece_cols: usize = piece_shape[1..].iter().product();
        if piece_cols != cols {
            return Err(format!(
                "tensor `{name}` fuses pieces of {cols} and {piece_cols} columns"
            ));
        }
        if let Some(heads) = place.permuted_heads {
            piece = permute_rows(&piece, heads, cols.max(1));
        }
        if place.offset != 0.0 {
            piece.iter_mut().for_each(|v| *v += place.offset);
        }
        let start = place.rows.as_ref().map_or(0, |r| r.start);
        let at = start * cols.max(1);
        values[at..at + piece.len()].copy_from_slice(&piece);
        covered += piece.len();
    }
    if covered != values.len() {
        return Err(format!(
            "tensor `{name}`: its pieces cover {covered} of {} values",
            values.len()
        ));
    }
    Ok(Assembled { values, shape })
}

/// Writes `writer` to `path`, first to a temporary file that must read back as `spec` before it is renamed.
fn write_checked(writer: &GgufWriter, path: &Path, spec: &crate::spec::ModelSpec) -> Result<()> {
    let check = path.with_file_name(format!(
        "{}.check-{}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    writer.write(&check)?;
    let verdict = (|| -> Result<()> {
        let file = GgufFile::open(&check)?;
        let (_, reread) = super::model_spec(&file)?;
        let expected = lineage::as_stored(spec);
        if reread != expected {
            return Err(ModelError::Unsaveable {
                architecture: format!("{} (GGUF)", spec.architecture),
                reason: format!(
                    "the GGUF metadata would load back as a different model: {}",
                    crate::save::spec_differences(&expected, &reread).join(", ")
                ),
            });
        }
        Ok(())
    })();
    match verdict {
        Ok(()) => std::fs::rename(&check, path).map_err(|source| {
            let _ = std::fs::remove_file(&check);
            GgufError::Io {
                path: path.to_path_buf(),
                source,
            }
            .into()
        }),
        Err(e) => {
            let _ = std::fs::remove_file(&check);
            Err(e)
        }
    }
}
