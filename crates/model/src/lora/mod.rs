//! LoRA fine-tuning of a loaded model: adapters on the projections a user names by the family's Hugging Face
//! module names (`q_proj`, `down_proj`, GPT-2's `c_fc`), matched as PEFT matches `target_modules` (the module
//! path equals the name or ends with `.name`), and the adapters read and written in PEFT's format ([`save_adapter`], [`read_adapter`]).
//!
//! The base weights are frozen (no gradient, so no optimizer state), and must be dense: a packed GGUF or
//! quantized layer is refused by name (ember does not train QLoRA-style over packed blocks; load the base in f32,
//! as `ember train` does). A stacked checkpoint tensor (Phi-3's `qkv_proj`, GPT-2's `c_attn`, NeoX's
//! `query_key_value`) is split into several of ember's projections, so it is not an adaptable module: PEFT's
//! single `B` over the stacked rows has no place in them.

mod peft;

use burn::module::Module;
use serde::{Deserialize, Serialize};

pub use peft::{
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, PeftAdapter, read_adapter, save_adapter,
};

use crate::arch::{self, Layout};
use crate::error::{ModelError, Result};
use crate::nn::{Linear, LoraAdapter};
use crate::spec::ModelSpec;
use crate::tensors::layer_name;
use crate::{EmberBackend, Transformer};

/// What to adapt and how (the fields of PEFT's `LoraConfig` that ember uses). A run config's `training.lora`
/// deserializes into it directly: an omitted field takes its [`Default`], an unknown one is an error naming it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSettings {
    /// Rank `r` of each update.
    pub rank: usize,
    /// `lora_alpha`: the update is scaled by `alpha / rank`.
    pub alpha: f64,
    /// `lora_dropout`: probability of dropping an input feature of the adapter path while training.
    pub dropout: f64,
    /// Hugging Face module names to adapt (`q_proj`, `v_proj`, ...), matched as PEFT's `target_modules`.
    pub targets: Vec<String>,
}

impl Default for LoraSettings {
    /// PEFT's rank and dropout, alpha twice the rank (the common recipe), on the attention's query and value
    /// projections (PEFT's default targets for the LLaMA lineage).
    fn default() -> Self {
        LoraSettings {
            rank: 8,
            alpha: 16.0,
            dropout: 0.0,
            targets: vec!["q_proj".into(), "v_proj".into()],
        }
    }
}

/// One projection LoRA can adapt in a model of some family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdaptableModule {
    /// ember's canonical module, e.g. `layers.3.attn.q`.
    pub canonical: String,
    /// The Hugging Face module path, e.g. `model.layers.3.self_attn.q_proj` (PEFT's keys are built from it).
    pub hf_path: String,
    /// Whether the checkpoint stores the weight `[in, out]` (GPT-2's `Conv1D`: PEFT's `fan_in_fan_out`).
    pub transposed: bool,
    /// Input features of the projection (columns of `A`).
    pub inputs: usize,
    /// Output features of the projection (rows of `B`).
    pub outputs: usize,
}

impl AdaptableModule {
    /// The last segment of the module path (`q_proj`), the name users list in `targets`.
    pub fn name(&self) -> &str {
        self.hf_path.rsplit('.').next().unwrap_or(&self.hf_path)
    }

    /// Whether PEFT's target `target` selects this module: the path equals it or ends with `.target`.
    pub fn matches(&self, target: &str) -> bool {
        self.hf_path == target
            || self
                .hf_path
                .strip_suffix(target)
                .is_some_and(|head| head.ends_with('.'))
    }
}

/// Every block projection of a model of `spec` that LoRA can adapt, in layer then canonical order.
pub fn adaptable_modules(spec: &ModelSpec) -> Result<Vec<AdaptableModule>> {
    let family = arch::family(&spec.architecture).ok_or_else(|| {
        ModelError::Lora(format!(
            "`{}` is not a supported architecture ({})",
            spec.architecture,
            arch::supported().join(", ")
        ))
    })?;
    let mut out = Vec::new();
    for tensor in spec.tensors() {
        let Some(module) = tensor.name.strip_suffix(".weight") else {
            continue;
        };
        let is_projection = arch::split_layer(module)
            .is_some_and(|(_, suffix)| suffix.starts_with("attn.") || suffix.starts_with("mlp."))
            && tensor.shape.len() == 2;
        if !is_projection {
            continue;
        }
        let source = family.source(spec, &tensor);
        let Some(hf_path) = source.name.strip_suffix(".weight") else {
            continue;
        };
        if source.rows.is_some() {
            continue;
        }
        out.push(AdaptableModule {
            canonical: module.to_string(),
            hf_path: hf_path.to_string(),
            transposed: source.layout == Layout::Transposed,
            inputs: tensor.shape[1],
            outputs: tensor.shape[0],
        });
    }
    Ok(out)
}

/// The modules of `spec` that `targets` select; an empty target list, or a target that selects nothing, is an
/// error listing the family's adaptable module names.
pub fn select_modules(spec: &ModelSpec, targets: &[String]) -> Result<Vec<AdaptableModule>> {
    let all = adaptable_modules(spec)?;
    let mut names: Vec<&str> = all.iter().map(AdaptableModule::name).collect();
    names.sort_unstable();
    names.dedup();
    let valid = names.join(", ");
    if targets.is_empty() {
        return Err(ModelError::Lora(format!(
            "no LoRA targets given; {} has these adaptable modules: {valid}",
            spec.architecture
        )));
    }
    for target in targets {
        if !all.iter().any(|m| m.matches(target)) {
            return Err(ModelError::Lora(format!(
                "LoRA target `{target}` names no adaptable module of {}; valid names: {valid} (stacked \
                 projections such as qkv_proj, c_attn or query_key_value are not adaptable)",
                spec.architecture
            )));
        }
    }
    Ok(all
        .into_iter()
        .filter(|m| targets.iter().any(|t| m.matches(t)))
        .collect())
}

impl<B: EmberBackend> Transformer<B> {
    /// The model with every parameter frozen and a fresh adapter (see [`LoraAdapter::init`]) on each module
    /// `settings.targets` selects; adapter `i` (in [`select_modules`] order) draws from seed `seed + i`.
    pub fn with_lora(self, settings: &LoraSettings, seed: u64) -> Result<Self> {
        check_settings(settings)?;
        let modules = select_modules(self.spec(), &settings.targets)?;
        let device = self.device();
        let mut model = self.no_grad();
        for (i, module) in modules.iter().enumerate() {
            dense_mut(&mut model, &module.canonical)?.lora = Some(LoraAdapter::init(
                module.inputs,
                module.outputs,
                settings.rank,
                settings.alpha,
                settings.dropout,
                seed.wrapping_add(i as u64),
                &device,
            ));
        }
        Ok(model)
    }

    /// The adapters of the model with the modules they sit on, in layer then canonical order.
    pub fn lora_adapters(&self) -> Result<Vec<(AdaptableModule, &LoraAdapter<B>)>> {
        let mut out = Vec::new();
        for module in adaptable_modules(self.spec())? {
            if let Some(crate::nn::BlockModule::Linear(Linear::Dense(dense))) =
                self.block_module(&module.canonical)
                && let Some(lora) = &dense.lora
            {
                out.push((module, lora));
            }
        }
        Ok(out)
    }

    /// Whether any projection carries an adapter.
    pub fn has_lora(&self) -> bool {
        self.lora_adapters().is_ok_and(|a| !a.is_empty())
    }
}

/// Rank, alpha and dropout in range.
pub(crate) fn check_settings(settings: &LoraSettings) -> Result<()> {
    if settings.rank == 0 || settings.rank > MAX_RANK {
        return Err(ModelError::Lora(format!(
            "LoRA rank: expected an integer in 1..={MAX_RANK}, found {}",
            settings.rank
        )));
    }
    if !(settings.alpha.is_finite() && settings.alpha > 0.0) {
        return Err(ModelError::Lora(format!(
            "LoRA alpha: expected a finite value > 0, found {}",
            settings.alpha
        )));
    }
    if !(0.0..1.0).contains(&settings.dropout) {
        return Err(ModelError::Lora(format!(
            "LoRA dropout: expected a value in [0, 1), found {}",
            settings.dropout
        )));
    }
    Ok(())
}

/// The largest rank accepted: far above any LoRA recipe (ranks are 4 to 256), and it keeps `rank × width` of a
/// hostile adapter file or config bounded before anything is allocated.
pub const MAX_RANK: usize = 4096;

/// The dense layer under canonical module `canonical` (`layers.3.attn.q`), or an error naming it when it is
/// packed.
pub(crate) fn dense_mut<'a, B: EmberBackend>(
    model: &'a mut Transformer<B>,
    canonical: &str,
) -> Result<&'a mut crate::nn::DenseLinear<B>> {
    let missing = || ModelError::Lora(format!("the model has no projection `{canonical}`"));
    let (layer, suffix) = arch::split_layer(canonical).ok_or_else(missing)?;
    let block = model.layers.get_mut(layer).ok_or_else(missing)?;
    let linear = block
        .linears_mut()
        .into_iter()
        .find_map(|(name, linear)| (name == suffix).then_some(linear))
        .ok_or_else(missing)?;
    match linear {
        Linear::Dense(dense) => Ok(dense),
        Linear::Quantized(_) | Linear::Ggml(_) => Err(ModelError::Lora(format!(
            "`{}` is quantized; LoRA needs the base weights dense (load the model in f32)",
            layer_name(layer, suffix)
        ))),
    }
}
