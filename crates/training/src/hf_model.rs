//! ember-model's [`Transformer`] as a trainable [`TrainableModel`], checkpointed in the Hugging Face layout.

use std::path::{Path, PathBuf};

use burn::tensor::{FloatDType, Int, Tensor};
use ember_model::{EmberBackend, ModelDir, Transformer};

use crate::model_io::{BoxError, ModelStore, TrainableModel};

impl<B: EmberBackend> TrainableModel<B> for Transformer<B> {
    fn logits(&self, tokens: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>, BoxError> {
        Ok(self.forward(tokens)?)
    }

    /// ember's fused loss ([`ember_attention::cross_entropy`]): one pass over the logits forward and one
    /// backward, instead of a log-softmax graph over `[tokens, vocab]`.
    fn loss(
        &self,
        tokens: Tensor<B, 2, Int>,
        targets: Tensor<B, 2, Int>,
    ) -> Result<Tensor<B, 1>, BoxError> {
        Ok(ember_attention::cross_entropy(
            self.forward(tokens)?,
            targets,
        ))
    }

    fn with_compute_dtype(self, dtype: FloatDType) -> Result<Self, BoxError> {
        Ok(Transformer::with_compute_dtype(self, Some(dtype)))
    }
}

/// Saves a [`Transformer`] as `config.json` + `model.safetensors` (what `transformers` and `ember generate` load),
/// plus a copy of the run's `tokenizer.json` so the directory is self-contained.
#[derive(Debug, Clone, Default)]
pub struct HfModelStore {
    tokenizer: Option<PathBuf>,
}

impl HfModelStore {
    /// A store that also copies `tokenizer` (a tokenizer.json) into every checkpoint.
    pub fn with_tokenizer(tokenizer: Option<PathBuf>) -> Self {
        HfModelStore { tokenizer }
    }
}

impl<B: EmberBackend> ModelStore<Transformer<B>> for HfModelStore {
    fn save(&self, model: &Transformer<B>, dir: &Path) -> Result<(), BoxError> {
        ember_model::save(model, dir)?;
        if let Some(tokenizer) = &self.tokenizer {
            std::fs::copy(tokenizer, dir.join("tokenizer.json")).map_err(|e| {
                format!(
                    "copying {} into {}: {e}",
                    tokenizer.display(),
                    dir.display()
                )
            })?;
        }
        Ok(())
    }

    fn load(&self, model: Transformer<B>, dir: &Path) -> Result<Transformer<B>, BoxError> {
        let device = model.device();
        let loaded = ModelDir::open(dir)?.load::<B>(&device, None)?.model;
        if loaded.spec() != model.spec() {
            return Err(format!(
                "{}: the saved model's config differs from the run config's model",
                dir.display()
            )
            .into());
        }
        Ok(loaded
            .with_kernel(model.kernel())
            .with_compute_dtype(model.compute_dtype()))
    }
}
