//! The model a run trains: `model.from` loaded in f32 (every weight trained, or LoRA adapters on its frozen
//! weights with `training.lora`), or a new model of the config's shape; and the store its checkpoints are written
//! with, which copies what a checkpoint needs to load on its own.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use burn::backend::Autodiff;
use ember_inference::{ModelAssets, WeightFormat};
use ember_model::lora::LoraSettings;
use ember_model::{EmberBackend, ModelSpec, Transformer};
use ember_training::HfModelStore;

use super::JobSettings;
use super::memory::{self, ScratchNeed};
use super::tokenizer::checkpoint_tokenizer;
use crate::backend::is_cpu;
use crate::commands::model_args::load_with_progress;

/// Where a run's weights come from.
// A run holds one plan, so the variants' sizes (opened assets are twice a spec) cost nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub(super) enum ModelPlan {
    /// `model.from`, opened (spec, tokenizer and chat template; the weights are read on the backend), trained
    /// whole or through `lora` adapters.
    Pretrained {
        base: ModelAssets,
        lora: Option<LoraSettings>,
    },
    /// A new model of `spec`, whose checkpoints copy the tokenizer at `tokenizer_path`, and what it needs of
    /// this machine's memory.
    Scratch {
        spec: ModelSpec,
        tokenizer_path: PathBuf,
        memory: ScratchNeed,
    },
}

impl ModelPlan {
    /// The LoRA adapters the run trains, if any.
    pub(super) fn lora(&self) -> Option<&LoraSettings> {
        match self {
            ModelPlan::Pretrained { lora, .. } => lora.as_ref(),
            ModelPlan::Scratch { .. } => None,
        }
    }
}

/// Opens `model.from` (spec, tokenizer and chat template; the weights are read on the backend).
pub(super) fn open_base(from: &Path) -> anyhow::Result<ModelAssets> {
    if !from.exists() {
        bail!("model.from: {} does not exist", from.display());
    }
    ModelAssets::open(from).with_context(|| {
        format!(
            "model.from: {} is not a model ember loads (a Hugging Face directory with config.json, a GGUF file, \
             or an ember run's best/)",
            from.display()
        )
    })
}

/// The model `settings` plan on `device`, with its attention kernel and its weights (or adapters) drawn from its
/// seed, and the store its checkpoints are written with. On the CPU backends a run of `replicas` replicas that
/// would not fit this machine's memory is refused first, before a weight is read.
pub(super) fn build<B: EmberBackend>(
    settings: &JobSettings,
    replicas: usize,
    device: &B::Device,
    quiet: bool,
) -> anyhow::Result<(Transformer<Autodiff<B>>, HfModelStore)> {
    let (model, store) = match &settings.model {
        ModelPlan::Pretrained { base, lora } => {
            if is_cpu::<B>() {
                let trainable = match lora {
                    Some(lora) => lora_parameters(&base.spec, lora)?,
                    None => u128::from(base.spec.parameter_count()),
                };
                memory::check_loaded(base, &settings.train, settings.kernel, replicas, trainable)?;
            }
            let model = load_with_progress::<Autodiff<B>>(base, device, &WeightFormat::F32, quiet)?;
            let store = HfModelStore::with_files(base_files(base, quiet));
            match lora {
                Some(lora) => {
                    let store =
                        store.with_lora(lora.clone(), Some(base.path.display().to_string()));
                    let model = model
                        .with_lora(lora, settings.seed)
                        .map_err(|e| anyhow::anyhow!("training.lora: {e}"))?;
                    (model, store)
                }
                None => (model, store),
            }
        }
        ModelPlan::Scratch {
            spec,
            tokenizer_path,
            memory,
        } => {
            if is_cpu::<B>() {
                memory.check(replicas)?;
            }
            let model = Transformer::<Autodiff<B>>::init(spec, settings.seed, device)
                .context("building the model")?;
            let store = HfModelStore::with_tokenizer(checkpoint_tokenizer(tokenizer_path, quiet));
            (model, store)
        }
    };
    Ok((model.with_kernel(settings.kernel), store))
}

/// Parameters of the LoRA adapters `settings` put on a model of `spec`: `rank × (in + out)` per adapted module.
pub(super) fn lora_parameters(spec: &ModelSpec, settings: &LoraSettings) -> anyhow::Result<u128> {
    let modules = ember_model::lora::select_modules(spec, &settings.targets)
        .map_err(|e| anyhow::anyhow!("training.lora.targets: {e}"))?;
    Ok(modules
        .iter()
        .map(|m| (settings.rank * (m.inputs + m.outputs)) as u128)
        .sum())
}

/// The files of `model.from` each checkpoint copies so that it loads on its own with its tokenizer and chat
/// template (a model directory's tokenizer files; a GGUF file has none, which is said once).
fn base_files(base: &ModelAssets, quiet: bool) -> Vec<PathBuf> {
    if !base.path.is_dir() {
        if !quiet {
            stderr!(
                "note: checkpoints will hold no tokenizer: {} keeps its vocabulary in GGUF metadata; run a \
                 LoRA checkpoint as `--model {} --adapter <checkpoint>/adapter`",
                base.path.display(),
                base.path.display()
            );
        }
        return Vec::new();
    }
    [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ]
    .iter()
    .map(|name| base.path.join(name))
    .filter(|p| p.is_file())
    .collect()
}
