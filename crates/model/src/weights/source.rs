//! [`CheckpointSource`]: canonical tensors cut out of a checkpoint through a family's name mapper.

use std::collections::BTreeSet;

use super::{Checkpoint, WeightSource};
use crate::arch::{Family, Layout, TensorSource};
use crate::error::{ModelError, Result};
use crate::spec::ModelSpec;
use crate::tensors::TensorSpec;

/// Reads canonical tensors from a [`Checkpoint`], checking presence and shape and remembering what was used.
pub struct CheckpointSource<'a> {
    checkpoint: &'a Checkpoint,
    family: &'static dyn Family,
    spec: &'a ModelSpec,
    used: BTreeSet<String>,
}

impl<'a> CheckpointSource<'a> {
    /// A source for a model of `spec` whose weights are named as `family` names them.
    pub fn new(
        checkpoint: &'a Checkpoint,
        family: &'static dyn Family,
        spec: &'a ModelSpec,
    ) -> Self {
        CheckpointSource {
            checkpoint,
            family,
            spec,
            used: BTreeSet::new(),
        }
    }

    /// Checkpoint tensors no canonical tensor was read from (sorted), e.g. GPT-2's stored attention masks.
    pub fn unused(&self) -> Vec<String> {
        self.checkpoint
            .names()
            .filter(|n| !self.used.contains(*n))
            .map(str::to_string)
            .collect()
    }

    /// The stored name, accepting checkpoints saved from the base model class (no `model.` / `transformer.` /
    /// `gpt_neox.` prefix).
    fn resolve(&self, source: &TensorSource, canonical: &str) -> Result<String> {
        if self.checkpoint.contains(&source.name) {
            return Ok(source.name.clone());
        }
        if let Some((_, bare)) = source.name.split_once('.')
            && self.checkpoint.contains(bare)
        {
            return Ok(bare.to_string());
        }
        Err(ModelError::MissingTensor {
            name: source.name.clone(),
            canonical: canonical.to_string(),
            dir: self.checkpoint.dir().to_path_buf(),
        })
    }
}

/// Transposes a row-major `[rows, cols]` matrix.
pub(crate) fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    // Blocked so both reads and writes stay in cache lines for large matrices.
    const BLOCK: usize = 32;
    for r0 in (0..rows).step_by(BLOCK) {
        for c0 in (0..cols).step_by(BLOCK) {
            for r in r0..(r0 + BLOCK).min(rows) {
                for c in c0..(c0 + BLOCK).min(cols) {
                    out[c * rows + r] = data[r * cols + c];
                }
            }
        }
    }
    out
}

impl WeightSource for CheckpointSource<'_> {
    fn take(&mut self, tensor: &TensorSpec) -> Result<Vec<f32>> {
        let source = self.family.source(self.spec, tensor);
        let name = self.resolve(&source, &tensor.name)?;
        let found = self.checkpoint.shape(&name).unwrap_or_default().to_vec();
        if found != source.stored_shape {
            return Err(ModelError::ShapeMismatch {
                file: self.checkpoint.file_of(&name).to_path_buf(),
                name,
                expected: source.stored_shape,
                found,
            });
        }
        let mut data = self.checkpoint.read_f32(&name)?;
        // Canonical orientation of the stored tensor: `[out, in]` for weights.
        let mut shape = source.stored_shape.clone();
        if source.layout == Layout::Transposed {
            data = transpose(&data, shape[0], shape[1]);
            shape.swap(0, 1);
        }
        if let Some(ranges) = &source.rows {
            let row_len: usize = shape[1..].iter().product();
            data = ranges
                .iter()
                .flat_map(|r| data[r.start * row_len..r.end * row_len].iter().copied())
                .collect();
        }
        if data.len() != tensor.numel() {
            return Err(ModelError::ShapeMismatch {
                file: self.checkpoint.file_of(&name).to_path_buf(),
                name: format!("{name} (as {})", tensor.name),
                expected: tensor.shape.clone(),
                found: vec![data.len()],
            });
        }
        self.used.insert(name);
        Ok(data)
    }
}
