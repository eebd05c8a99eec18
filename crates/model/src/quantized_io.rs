//! Models with quantized weights on disk: `config.json` plus `model.quantized.safetensors`, an ember quantized
//! checkpoint ([`ember_optimization::QuantizedCheckpoint`]: packed codes, scales and zero points under ember's
//! canonical tensor names, the scheme of each in the file's metadata, every other tensor dense f32).
//!
//! Quantization is per output row, so the packed rows are stored as the model holds them; loading uploads them
//! as they are, with no round trip through f32.

use std::path::{Path, PathBuf};

use ember_attention::EmberBackend;
use ember_optimization::{
    DenseTensor, PackedWeight, QuantizedCheckpoint, QuantizedLinear, QuantizedWeight,
};

use crate::error::{ModelError, Result};
use crate::load::Loaded;
use crate::nn::{BlockModule, Embedding, Linear};
use crate::save::{hf_config, parameter_values, write_config};
use crate::spec::ModelSpec;
use crate::tensors::{EMBED, LM_HEAD, TensorRole, TensorSpec};
use crate::transformer::Transformer;
use crate::weights::{Progress, WeightSource};

/// The weights file of a quantized model directory.
pub const QUANTIZED_FILE: &str = "model.quantized.safetensors";

fn quant_error(tensor: &str) -> impl FnOnce(ember_optimization::QuantError) -> ModelError + '_ {
    move |e| ModelError::Quantization {
        tensor: tensor.to_string(),
        message: e.to_string(),
    }
}

impl<B: EmberBackend> Transformer<B> {
    /// The quantized weight of matrix `name` (canonical name), read back from the device; `None` when that
    /// weight is dense or the model has no such matrix.
    pub fn quantized_weight(&self, name: &str) -> Result<Option<QuantizedWeight>> {
        let linear = |l: &Linear<B>| match l {
            Linear::Quantized(q) => Some(q.to_weight()),
            Linear::Dense(_) | Linear::Ggml(_) => None,
        };
        let weight = match name {
            EMBED => match &self.embed {
                Embedding::Quantized(q) => Some(q.to_weight()),
                Embedding::Dense(_) | Embedding::Ggml(_) => None,
            },
            LM_HEAD => self.lm_head.as_ref().and_then(linear),
            _ => match name
                .strip_suffix(".weight")
                .and_then(|module| self.block_module(module))
            {
                Some(BlockModule::Linear(l)) => linear(l),
                _ => None,
            },
        };
        weight.transpose().map_err(quant_error(name))
    }
}

/// Writes `model` to directory `dir` (created if needed): its Hugging Face `config.json` and
/// [`QUANTIZED_FILE`] with every quantized matrix packed and every other tensor in f32. A tied model whose LM
/// head is a quantized copy of a dense embedding keeps that copy under `lm_head.weight`.
pub fn save_quantized<B: EmberBackend>(model: &Transformer<B>, dir: &Path) -> Result<()> {
    let spec = model.spec();
    let (_, config) = hf_config(spec)?;
    let mut checkpoint = QuantizedCheckpoint::default();
    let mut names: Vec<TensorSpec> = spec.tensors();
    if spec.features.tied_embeddings && model.lm_head.is_some() {
        names.push(TensorSpec {
            name: LM_HEAD.to_string(),
            shape: vec![spec.vocab_size, spec.hidden_size],
            role: TensorRole::LinearWeight,
        });
    }
    for tensor in names {
        if let Some(weight) = model.quantized_weight(&tensor.name)? {
            checkpoint.quantized.insert(tensor.name, weight);
            continue;
        }
        let values = parameter_values(model, &tensor.name)?;
        checkpoint.dense.insert(
            tensor.name,
            DenseTensor {
                shape: tensor.shape,
                values,
            },
        );
    }
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(QUANTIZED_FILE);
    checkpoint
        .save(&path)
        .map_err(quant_error(&path.display().to_string()))?;
    write_config(dir, &config)
}

/// A [`WeightSource`] over a quantized checkpoint: quantized matrices are handed out packed, the rest as f32.
struct QuantizedSource {
    checkpoint: QuantizedCheckpoint,
    path: PathBuf,
}

impl QuantizedSource {
    fn missing(&self, tensor: &TensorSpec) -> ModelError {
        ModelError::MissingTensor {
            name: tensor.name.clone(),
            canonical: tensor.name.clone(),
            dir: self.path.clone(),
        }
    }
}

impl WeightSource for QuantizedSource {
    fn take(&mut self, tensor: &TensorSpec) -> Result<Vec<f32>> {
        let dense = self
            .checkpoint
            .dense
            .remove(&tensor.name)
            .ok_or_else(|| self.missing(tensor))?;
        if dense.shape != tensor.shape {
            return Err(ModelError::ShapeMismatch {
                file: self.path.clone(),
                name: tensor.name.clone(),
                expected: tensor.shape.clone(),
                found: dense.shape,
            });
        }
        Ok(dense.values)
    }

    fn take_quantized(&mut self, tensor: &TensorSpec) -> Result<Option<PackedWeight>> {
        let Some(weight) = self.checkpoint.quantized.remove(&tensor.name) else {
            return Ok(None);
        };
        if weight.shape().as_slice() != tensor.shape.as_slice() {
            return Err(ModelError::ShapeMismatch {
                file: self.path.clone(),
                name: tensor.name.clone(),
                expected: tensor.shape.clone(),
                found: weight.shape().to_vec(),
            });
        }
        Ok(Some(PackedWeight::Codes(weight)))
    }
}

/// Loads the quantized model of `dir` (whose config gave `spec`) onto `device`.
pub(crate) fn load_quantized<B: EmberBackend>(
    dir: &Path,
    spec: &ModelSpec,
    device: &B::Device,
    progress: Option<Progress<'_>>,
) -> Result<Loaded<B>> {
    let path = dir.join(QUANTIZED_FILE);
    let checkpoint =
        QuantizedCheckpoint::load(&path).map_err(quant_error(&path.display().to_string()))?;
    let mut source = QuantizedSource { checkpoint, path };
    let mut model = Transformer::from_source(spec, &mut source, device, progress)?;
    if spec.features.tied_embeddings
        && let Some(head) = source.checkpoint.quantized.remove(LM_HEAD)
    {
        let head = QuantizedLinear::new(&head, None, device).map_err(quant_error(LM_HEAD))?;
        model.lm_head = Some(Linear::Quantized(head));
    }
    let checkpoint = source.checkpoint;
    let unused = checkpoint
        .quantized
        .into_keys()
        .chain(checkpoint.dense.into_keys())
        .collect();
    Ok(Loaded { model, unused })
}
