//! Saving a model as a GGUF file that llama.cpp runs: the family's metadata, the tokenizer's `tokenizer.*` keys,
//! and every canonical tensor put back where llama.cpp's converter puts it (renamed, query/key rows permuted,
//! stacked tensors assembled, Gemma's norm offset added), each in the type a [`GgufRecipe`] gives it.
//!
//! The file must load back as exactly the model: before the temporary file is renamed into place it is opened
//! with ember's own reader, and its spec compared with the model's (floats rounded to f32, as GGUF stores them).

use std::collections::BTreeMap;
use std::path::Path;

use ember_attention::EmberBackend;
use ember_ggml::{QuantizeError, quantize};

use super::recipe::{GgufRecipe, RecipeTensor};
use super::writer::{GgufWriter, OutTensor};
use super::{GgmlType, GgufError, GgufFile, MetadataValue, OUTPUT, lineage, permute_rows};
use crate::arch::{self, GgufTensor};
use crate::error::{ModelError, Result};
use crate::save::parameter_values;
use crate::spec::ModelSpec;
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

/// Where one canonical tensor goes: its place in the GGUF tensor, its canonical name and shape.
type Piece = (GgufTensor, String, Vec<usize>);

/// One GGUF tensor to write: its shape and the canonical tensors stored in it (one, or the parts of a stacked one),
/// or, for a tensor made from the spec (RoPE divisors), its values.
struct Planned {
    name: String,
    shape: Vec<usize>,
    pieces: Vec<Piece>,
    made: Option<Vec<f32>>,
}

/// Writes `model` to `path` as a GGUF file (atomically) and checks that it loads back as the same model.
/// `progress` is called with `(done, total, tensor name)` as tensors are converted. Tensors are assembled and
/// quantized one at a time as the file is written, so the model plus one tensor is what memory holds.
pub fn save_gguf<B: EmberBackend>(
    model: &Transformer<B>,
    export: &GgufExport,
    path: &Path,
    mut progress: Option<crate::weights::Progress<'_>>,
) -> Result<GgufSummary> {
    let spec = model.spec();
    let unwritable = |reason: String| unwritable(spec, reason);
    let Layout {
        gguf_arch,
        metadata: family_metadata,
        expected,
        planned,
    } = layout(spec)?;

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

    let tied = !planned.iter().any(|t| t.name == OUTPUT);
    let gqa = spec.num_heads / spec.num_kv_heads.max(1);
    let mut summary = GgufSummary::default();
    for tensor in &planned {
        let role = RecipeTensor {
            name: &tensor.name,
            dims: tensor.shape.len(),
            cols: tensor.shape.last().copied().unwrap_or(1),
            layer: RecipeTensor::layer_of(&tensor.name),
            layers: spec.num_layers,
            tied,
            gqa,
        };
        let ty = export.recipe.tensor_type(&role);
        writer.add_tensor(OutTensor::new(&tensor.name, ty, tensor.shape.clone()), path)?;
        match summary.types.iter_mut().find(|(t, _)| *t == ty) {
            Some((_, n)) => *n += 1,
            None => summary.types.push((ty, 1)),
        }
    }
    summary.tensors = planned.len();
    summary.data_bytes = writer.tensors().iter().map(OutTensor::n_bytes).sum();

    let slots = writer.tensors().to_vec();
    let total = planned.len();
    let data = |i: usize| -> Result<Vec<u8>> {
        let (tensor, slot) = (&planned[i], &slots[i]);
        if let Some(report) = progress.as_mut() {
            report(i, total, &tensor.name);
        }
        let values = fuse(model, tensor).map_err(unwritable)?;
        let cols = tensor.shape.last().copied().unwrap_or(1);
        quantize_parallel(slot.ggml_type, &values, cols).map_err(|e| {
            unwritable(format!(
                "tensor `{}` as {}: {e}",
                tensor.name, slot.ggml_type
            ))
        })
    };
    write_checked(&writer, path, spec, &expected, data)?;
    if let Some(report) = progress.as_mut() {
        report(total, total, "");
    }
    Ok(summary)
}

/// Why a model of `spec` cannot be written as GGUF.
fn unwritable(spec: &ModelSpec, reason: String) -> ModelError {
    ModelError::Unsaveable {
        architecture: format!("{} (GGUF)", spec.architecture),
        reason,
    }
}

/// What a GGUF file of a model of `spec` holds besides its tensor data.
struct Layout {
    gguf_arch: &'static str,
    metadata: Vec<(String, MetadataValue)>,
    /// The spec the file must read back as.
    expected: ModelSpec,
    planned: Vec<Planned>,
}

/// Checks, before any weights are touched, that a model of `spec` can be written as a GGUF file llama.cpp runs
/// and that reads back as the same model: the error names what stands in the way.
pub fn check_gguf_writable(spec: &ModelSpec) -> Result<()> {
    layout(spec).map(|_| ())
}

fn layout(spec: &ModelSpec) -> Result<Layout> {
    let unwritable = |reason: String| unwritable(spec, reason);
    let family = arch::family(&spec.architecture)
        .ok_or_else(|| unwritable("not a supported architecture".to_string()))?;
    let gguf_arch = family
        .gguf_architecture()
        .ok_or_else(|| unwritable("ember does not write this family as GGUF".to_string()))?;
    let metadata = family.gguf_metadata(spec).map_err(unwritable)?;
    let mut expected = lineage::as_stored(spec).map_err(unwritable)?;
    // The file reads back as the family llama.cpp's architecture names (Mistral as LLaMA).
    if let Some(reader) = arch::gguf_family(gguf_arch) {
        expected.architecture = reader.architecture().to_string();
    }
    let mut planned: Vec<Planned> = family
        .gguf_rope_tensors(spec)
        .into_iter()
        .map(|(name, values)| Planned {
            name: name.to_string(),
            shape: vec![values.len()],
            pieces: Vec::new(),
            made: Some(values),
        })
        .collect();
    planned.extend(plan(family, spec).map_err(unwritable)?);
    Ok(Layout {
        gguf_arch,
        metadata,
        expected,
        planned,
    })
}

/// Every GGUF tensor of a model of `spec`, in the order its canonical tensors come, with the pieces it holds.
fn plan(family: &dyn arch::Family, spec: &ModelSpec) -> std::result::Result<Vec<Planned>, String> {
    let mut planned: Vec<Planned> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    for tensor in spec.tensors() {
        let place = family
            .gguf_tensor(spec, &tensor)
            .ok_or_else(|| format!("tensor `{}` has no place in a GGUF file", tensor.name))?;
        let rows = place.rows.as_ref().map_or(tensor.shape[0], |r| r.end);
        let at = *index.entry(place.name.clone()).or_insert_with(|| {
            planned.push(Planned {
                name: place.name.clone(),
                shape: tensor.shape.clone(),
                pieces: Vec::new(),
                made: None,
            });
            planned.len() - 1
        });
        let entry = &mut planned[at];
        if entry.shape[1..] != tensor.shape[1..] {
            return Err(format!(
                "tensor `{}` fuses pieces of shapes {:?} and {:?}",
                entry.name, entry.shape, tensor.shape
            ));
        }
        entry.shape[0] = entry.shape[0].max(rows);
        entry
            .pieces
            .push((place, tensor.name.clone(), tensor.shape.clone()));
    }
    Ok(planned)
}

/// The values of one GGUF tensor from its canonical pieces: each permuted and offset as the converter does,
/// then laid at its rows (a whole tensor is one piece covering every row).
fn fuse<B: EmberBackend>(
    model: &Transformer<B>,
    tensor: &Planned,
) -> std::result::Result<Vec<f32>, String> {
    if let Some(values) = &tensor.made {
        return Ok(values.clone());
    }
    let cols: usize = tensor.shape[1..].iter().product::<usize>().max(1);
    let mut values = vec![0.0f32; tensor.shape.iter().product()];
    let mut covered = 0usize;
    for (place, canonical, _) in &tensor.pieces {
        let mut piece = parameter_values(model, canonical).map_err(|e| e.to_string())?;
        if let Some(heads) = place.permuted_heads {
            piece = permute_rows(&piece, heads, cols);
        }
        if place.offset != 0.0 {
            piece.iter_mut().for_each(|v| *v += place.offset);
        }
        let at = place.rows.as_ref().map_or(0, |r| r.start) * cols;
        values
            .get_mut(at..at + piece.len())
            .ok_or_else(|| format!("tensor `{}`: `{canonical}` lies outside it", tensor.name))?
            .copy_from_slice(&piece);
        covered += piece.len();
    }
    if covered != values.len() {
        return Err(format!(
            "tensor `{}`: its pieces cover {covered} of {} values",
            tensor.name,
            values.len()
        ));
    }
    Ok(values)
}

/// [`quantize`] split by rows across the kernel threads: every row is quantized on its own, so the bytes are
/// the same however the rows are split.
fn quantize_parallel(
    ty: GgmlType,
    values: &[f32],
    cols: usize,
) -> std::result::Result<Vec<u8>, QuantizeError> {
    let rows = values.len() / cols.max(1);
    let threads = ember_attention::kernel_threads().clamp(1, rows.max(1));
    if threads == 1 || values.len() < 1 << 16 {
        return quantize(ty, values, cols);
    }
    let per = rows.div_ceil(threads) * cols;
    let parts: Vec<std::result::Result<Vec<u8>, QuantizeError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = values
            .chunks(per)
            .map(|chunk| scope.spawn(move || quantize(ty, chunk, cols)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let mut out = Vec::new();
    for part in parts {
        out.extend(part?);
    }
    Ok(out)
}

/// Writes `writer` to `path`, first to a temporary file that must read back as `expected` (`spec` as GGUF holds
/// it) before it is renamed.
fn write_checked(
    writer: &GgufWriter,
    path: &Path,
    spec: &ModelSpec,
    expected: &ModelSpec,
    data: impl FnMut(usize) -> Result<Vec<u8>>,
) -> Result<()> {
    let check = path.with_file_name(format!(
        "{}.check-{}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    writer.write(&check, data)?;
    let verdict = (|| -> Result<()> {
        let file = GgufFile::open(&check)?;
        let (_, reread) = super::model_spec(&file)?;
        if reread != *expected {
            return Err(ModelError::Unsaveable {
                architecture: format!("{} (GGUF)", spec.architecture),
                reason: format!(
                    "the GGUF metadata would load back as a different model: {}",
                    crate::save::spec_differences(expected, &reread).join(", ")
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
