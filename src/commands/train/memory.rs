//! On the CPU backends the model, its optimiser state and its activations live in this machine's memory: a run
//! that would need more than all of it is refused before the first tensor is allocated (where it would abort, or
//! be killed by the OOM killer minutes later). The config itself was already bounded by
//! [`limits::MAX_TRAINING_BYTES`]; GPU backends report their own out-of-memory.
//!
//! The estimate depends on the number of data-parallel replicas, which only the backend decides (`auto` is one
//! per CPU thread); everything else is resolved from the config before the backend is chosen.

use std::path::{Path, PathBuf};

use anyhow::bail;
use ember_inference::ModelAssets;
use ember_model::AttentionKernel;
use ember_training::TrainSettings;

use crate::config::RunConfig;
use crate::config::limits::{self, MemoryEstimate};

/// What a model built from the config's shape needs: [`limits::estimate`] of its `model.*` keys and
/// `training.batch_size`, waiting for the replica count.
pub(super) struct ScratchNeed {
    /// The config file, which a refusal names with the keys to change.
    config_path: PathBuf,
    /// The estimate for a replica count (0 or 1 for one replica).
    estimate: Box<dyn Fn(usize) -> MemoryEstimate>,
}

impl ScratchNeed {
    /// The need of `config` (loaded from `config_path`) with a vocabulary of `vocab` tokens.
    pub(super) fn new(config_path: &Path, config: &RunConfig, vocab: usize) -> Self {
        let config = config.clone();
        ScratchNeed {
            config_path: config_path.to_path_buf(),
            estimate: Box::new(move |replicas| limits::estimate(&config, vocab, replicas)),
        }
    }

    /// Refuses training with `replicas` replicas when it would not fit this machine's memory.
    pub(super) fn check(&self, replicas: usize) -> anyhow::Result<()> {
        let estimate = (self.estimate)(replicas);
        if let Some(memory) = too_little_memory(&estimate) {
            bail!(
                "{}: keys `model.*` and `training.batch_size`: training this would need {}, but this machine has \
                 {memory} of memory; shrink the model or the batch",
                self.config_path.display(),
                estimate.describe(),
            );
        }
        Ok(())
    }
}

/// Refuses fine-tuning `base` (`model.from`) with `settings`' batch, attention `kernel` and `replicas` replicas,
/// of which `trainable` parameters train, when it would not fit this machine's memory.
pub(super) fn check_loaded(
    base: &ModelAssets,
    settings: &TrainSettings,
    kernel: AttentionKernel,
    replicas: usize,
    trainable: u128,
) -> anyhow::Result<()> {
    let estimate = limits::estimate_loaded(
        &base.spec,
        settings.batch_size,
        settings.block_size,
        kernel,
        replicas,
        trainable,
    );
    if let Some(memory) = too_little_memory(&estimate) {
        bail!(
            "model.from and training.batch_size: fine-tuning {} would need {}, but this machine has {memory} of \
             memory; shrink the batch or model.block_size, or train LoRA adapters (training.lora)",
            base.path.display(),
            estimate.describe(),
        );
    }
    Ok(())
}

/// This machine's memory, in words, when `estimate` is more than all of it (`None` where it cannot be read).
fn too_little_memory(estimate: &MemoryEstimate) -> Option<String> {
    let memory = u128::from(ember_bench::Machine::detect().memory_bytes?);
    (estimate.total() > memory).then(|| limits::gib(memory))
}
