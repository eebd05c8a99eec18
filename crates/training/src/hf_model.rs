//! ember-model's [`Transformer`] as a trainable [`TrainableModel`], checkpointed in the Hugging Face layout.

use std::path::{Path, PathBuf};

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{FloatDType, Int, Tensor};
use ember_model::lora::LoraSettings;
use ember_model::{EmberBackend, ModelDir, Transformer};

use crate::model_io::{BoxError, ModelStore, TrainableModel};
use crate::params::Gradients;

impl<B: EmberBackend> TrainableModel<B> for Transformer<B> {
    fn logits(&self, tokens: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>, BoxError> {
        Ok(self.forward(tokens)?)
    }

    /// ember's one-pass loss ([`ember_attention::cross_entropy`]): one pass over the logits forward and one
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

    fn checkpointed_gradients(
        &self,
        tokens: Tensor<B, 2, Int>,
        targets: Tensor<B, 2, Int>,
        weight: f64,
    ) -> Result<(f64, Gradients<B::InnerBackend>), BoxError>
    where
        B: AutodiffBackend,
        Self: AutodiffModule<B>,
    {
        crate::checkpointing::checkpointed_gradients(self, tokens, targets, weight)
    }

    fn with_compute_dtype(self, dtype: FloatDType) -> Result<Self, BoxError> {
        Ok(Transformer::with_compute_dtype(self, Some(dtype)))
    }
}

/// Saves a [`Transformer`] as `config.json` + `model.safetensors` (what `transformers` and `ember generate` load),
/// plus copies of the run's tokenizer files so the directory is self-contained. A LoRA run's checkpoint holds
/// the merged model there and the adapter alone, in PEFT's format, in `adapter/`.
#[derive(Debug, Clone, Default)]
pub struct HfModelStore {
    files: Vec<PathBuf>,
    lora: Option<(LoraSettings, Option<String>)>,
}

/// The directory inside a LoRA run's checkpoint holding the adapter (PEFT's format).
pub const ADAPTER_DIR: &str = "adapter";

impl HfModelStore {
    /// A store that also copies `tokenizer` (a tokenizer.json) into every checkpoint.
    pub fn with_tokenizer(tokenizer: Option<PathBuf>) -> Self {
        Self::with_files(tokenizer.into_iter().collect())
    }

    /// A store that also copies each of `files` (tokenizer.json, tokenizer_config.json, ...) into every
    /// checkpoint under its own name.
    pub fn with_files(files: Vec<PathBuf>) -> Self {
        HfModelStore { files, lora: None }
    }

    /// The same store for a model carrying LoRA adapters made with `settings`: checkpoints also hold
    /// [`ADAPTER_DIR`], and loading one puts its adapter back onto the (frozen) base model it is given. `base`
    /// is recorded as the adapter's `base_model_name_or_path`.
    pub fn with_lora(mut self, settings: LoraSettings, base: Option<String>) -> Self {
        self.lora = Some((settings, base));
        self
    }
}

impl<B: EmberBackend> ModelStore<Transformer<B>> for HfModelStore {
    fn save(&self, model: &Transformer<B>, dir: &Path) -> Result<(), BoxError> {
        ember_model::save(model, dir)?;
        for file in &self.files {
            let name = file.file_name().unwrap_or(file.as_os_str());
            std::fs::copy(file, dir.join(name))
                .map_err(|e| format!("copying {} into {}: {e}", file.display(), dir.display()))?;
        }
        if let Some((settings, base)) = &self.lora {
            ember_model::lora::save_adapter(
                model,
                settings,
                base.as_deref(),
                &dir.join(ADAPTER_DIR),
            )?;
        }
        Ok(())
    }

    fn load(&self, model: Transformer<B>, dir: &Path) -> Result<Transformer<B>, BoxError> {
        if self.lora.is_some() {
            let adapter = ember_model::lora::read_adapter(&dir.join(ADAPTER_DIR))?;
            return Ok(model.with_adapter(&adapter)?);
        }
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
