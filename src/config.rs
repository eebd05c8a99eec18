//! Run configuration: a YAML file parsed into typed sections with defaults and validation.
//!
//! Every key has a default (see `configs/default.yaml`, which lists them all), so a config file only states what it
//! changes. Unknown keys are errors, and every error names the file and the dotted key path.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use ember_model::AttentionKernel;
use ember_model::lora::LoraSettings;
use ember_training::NodeSettings;

use crate::backend::BackendRequest;

/// A whole run: what to train on, what to train, and how.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Run name; outputs go to `runs/<name>/` unless `--out` says otherwise.
    pub name: String,
    /// Backend for this run (the `--backend` flag overrides it).
    pub backend: Option<BackendRequest>,
    /// Seed for weight initialisation and the order training windows are drawn in.
    pub seed: u64,
    /// Corpus and split.
    pub data: DataConfig,
    /// Tokenizer to train or reuse.
    pub tokenizer: TokenizerConfig,
    /// Model shape.
    pub model: ModelConfig,
    /// Optimisation and schedule.
    pub training: TrainingConfig,
}

/// The corpus and how it is split.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Text files, directories or JSONL files to train on (relative paths are relative to the config file).
    pub inputs: Vec<PathBuf>,
    /// Documents of plain text, or chat conversations (JSONL `messages`) trained on the assistant's replies.
    pub format: DataFormat,
    /// JSONL field holding the document text.
    pub text_field: String,
    /// Fraction of the corpus held out for validation, in (0, 1).
    pub val_fraction: f64,
    /// Where prepared shards are cached (relative to the config file's directory).
    pub cache_dir: PathBuf,
}

/// What `data.inputs` hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    /// Text files or JSONL documents: every token is trained on.
    #[default]
    Text,
    /// JSONL conversations (`{"messages": [{"role", "content"}, ...]}` per line), rendered with the model's chat
    /// template: only the assistant's replies are trained on.
    Chat,
}

/// The tokenizer: an existing file, or one trained on the corpus and cached.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenizerConfig {
    /// An existing tokenizer.json; when absent a byte-level BPE is trained on `data.inputs`.
    pub path: Option<PathBuf>,
    /// Vocabulary size of a trained tokenizer (including special tokens).
    pub vocab_size: usize,
    /// Special tokens of a trained tokenizer; the first is the end-of-document token.
    pub special_tokens: Vec<String>,
}

/// The model: a pretrained checkpoint to start from (`from`), or the shape of a model trained from scratch (a
/// LLaMA-style decoder: RMSNorm, RoPE, SwiGLU, GQA; or any registered family named by `architecture`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// A model to fine-tune: a Hugging Face directory, a GGUF file (its quantized tensors dequantized to f32) or
    /// an ember run's `best/`. Its architecture, shape and tokenizer are the model's own, so the shape keys below
    /// and the `tokenizer` section are errors next to it; `block_size` and `attention` still apply.
    pub from: Option<PathBuf>,
    /// The family of a model trained from scratch, as its Hugging Face architecture name (`GPT2LMHeadModel`,
    /// `Qwen3ForCausalLM`, ...: any `ember info` lists); the shape keys below become that family's config.json
    /// keys and every other knob is the family's default. Unset: ember's LLaMA-style decoder.
    pub architecture: Option<String>,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Number of transformer blocks.
    pub num_layers: usize,
    /// Query heads per layer.
    pub num_heads: usize,
    /// Key/value heads per layer (grouped-query attention); must divide `num_heads`.
    pub num_kv_heads: usize,
    /// Width of the gated MLP.
    pub intermediate_size: usize,
    /// Context length in tokens.
    pub block_size: usize,
    /// RoPE base frequency.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub norm_eps: f64,
    /// Share the token embedding with the output projection.
    pub tie_embeddings: bool,
    /// Attention kernel: manual, fused or flash.
    pub attention: AttentionKernel,
}

/// Optimiser, schedule and loop settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainingConfig {
    /// Sequences per micro-batch.
    pub batch_size: usize,
    /// Micro-batches accumulated into one optimiser step.
    pub grad_accum_steps: usize,
    /// Optimiser steps to run.
    pub max_steps: usize,
    /// Stop after this many minutes of wall time, whatever the step.
    pub time_limit_min: Option<f64>,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// Learning rate at the end of the cosine decay.
    pub min_learning_rate: f64,
    /// Linear warm-up steps.
    pub warmup_steps: usize,
    /// AdamW decoupled weight decay (not applied to norms, biases and embeddings).
    pub weight_decay: f64,
    /// AdamW beta1.
    pub beta1: f64,
    /// AdamW beta2.
    pub beta2: f64,
    /// AdamW epsilon.
    pub eps: f64,
    /// Global gradient-norm clip (0 disables clipping).
    pub grad_clip: f64,
    /// Steps between log lines.
    pub log_interval: usize,
    /// Steps between validation passes.
    pub eval_interval: usize,
    /// Validation windows per validation pass.
    pub eval_batches: usize,
    /// Steps between checkpoints.
    pub checkpoint_interval: usize,
    /// Validation passes without improvement before stopping early (none: never stop early).
    pub patience: Option<usize>,
    /// Compute precision: f32, or bf16 with f32 master weights where the backend supports it.
    pub precision: Precision,
    /// Recompute each block's activations during the backward pass instead of keeping them from the forward
    /// pass: memory for one block's activations instead of every block's, for about a third more compute.
    pub checkpoint_activations: bool,
    /// Data-parallel replicas on this machine; `batch_size` is split evenly across them.
    pub devices: Devices,
    /// Several machines joined through a burn-collective orchestrator (`ember orchestrator`); every machine
    /// draws the same global batch of `batch_size` rows and trains on share `rank` of it.
    pub nodes: Option<NodeSettings>,
    /// Train LoRA adapters on the frozen `model.from` instead of every weight, on the projections `targets` names
    /// (the family's Hugging Face module names); saved in PEFT's format under each checkpoint's `adapter/`.
    pub lora: Option<LoraSettings>,
}

/// Data-parallel replicas on this machine: a count (`devices: 2` is devices 0 and 1 of the backend, or two
/// threads on the one CPU device), explicit device indices (`devices: [0, 2]`), or `auto`: one replica per CPU
/// thread on the CPU backends (the most that divide `batch_size`), one device on GPU backends.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Devices {
    /// This many replicas, on device indices `0..count`.
    Count(usize),
    /// One replica per listed device index.
    Indices(Vec<u16>),
    /// Chosen from the backend (see [`Devices`]).
    Auto(Auto),
}

/// The word `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Auto {
    /// Chosen from the backend.
    Auto,
}

impl Default for Devices {
    fn default() -> Self {
        Devices::Count(1)
    }
}

impl Devices {
    /// The device index of every replica; `auto` resolves to `cpu_threads` replicas (the largest count not above
    /// it that divides `batch_size`) when given, else to device 0.
    pub fn indices(&self, batch_size: usize, cpu_threads: Option<usize>) -> Vec<u16> {
        let count = match self {
            Devices::Count(n) => *n,
            Devices::Indices(list) => return list.clone(),
            Devices::Auto(_) => cpu_threads.map_or(1, |threads| {
                (1..=threads.min(batch_size).min(usize::from(u16::MAX)))
                    .rev()
                    .find(|n| batch_size.is_multiple_of(*n))
                    .unwrap_or(1)
            }),
        };
        (0..count).map(|i| i as u16).collect()
    }
}

/// `training.precision`: `f32`, or `bf16` (bf16 compute with f32 master weights).
pub use ember_training::Precision;

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            name: "run".into(),
            backend: None,
            seed: 1337,
            data: DataConfig::default(),
            tokenizer: TokenizerConfig::default(),
            model: ModelConfig::default(),
            training: TrainingConfig::default(),
        }
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            inputs: Vec::new(),
            format: DataFormat::Text,
            text_field: "text".into(),
            val_fraction: 0.1,
            cache_dir: ".cache/data".into(),
        }
    }
}

impl Default for TokenizerConfig {
    fn default() -> Self {
        Self {
            path: None,
            vocab_size: 4096,
            special_tokens: vec!["<|endoftext|>".into()],
        }
    }
}

impl ModelConfig {
    /// The spec these keys describe (LLaMA-style, or `architecture`'s family), with a vocabulary of `vocab_size`
    /// (the tokenizer's), or an error naming the key the family cannot honour. `ember train`, `ember bench --suite
    /// train` and the config fuzzer all build the model from this one conversion.
    pub fn spec(&self, vocab_size: usize) -> Result<ember_model::ModelSpec, String> {
        if let Some(architecture) = &self.architecture {
            let shape = ember_model::arch::ScratchShape {
                vocab_size,
                hidden_size: self.hidden_size,
                num_layers: self.num_layers,
                num_heads: self.num_heads,
                num_kv_heads: self.num_kv_heads,
                intermediate_size: self.intermediate_size,
                context_length: self.block_size,
                rope_theta: self.rope_theta,
                norm_eps: self.norm_eps,
                tie_embeddings: self.tie_embeddings,
            };
            return ember_model::arch::scratch_spec(architecture, &shape);
        }
        let mut spec = ember_model::ModelSpec::llama_style(
            vocab_size,
            self.hidden_size,
            self.num_layers,
            self.num_heads,
            self.num_kv_heads,
            self.intermediate_size,
            self.block_size,
        );
        spec.features.tied_embeddings = self.tie_embeddings;
        spec.features.norm.eps = self.norm_eps;
        if let ember_model::Positions::Rope(rope) = &mut spec.positions {
            rope.theta = self.rope_theta;
        }
        Ok(spec)
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            from: None,
            architecture: None,
            hidden_size: 256,
            num_layers: 4,
            num_heads: 8,
            num_kv_heads: 4,
            intermediate_size: 688,
            block_size: 256,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            tie_embeddings: true,
            attention: AttentionKernel::Flash,
        }
    }
}

impl Default for TrainingConfig {
    fn default() -> Self {
        Self {
            batch_size: 16,
            grad_accum_steps: 1,
            max_steps: 2000,
            time_limit_min: None,
            learning_rate: 1e-3,
            min_learning_rate: 1e-4,
            warmup_steps: 100,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            grad_clip: 1.0,
            log_interval: 10,
            eval_interval: 250,
            eval_batches: 20,
            checkpoint_interval: 500,
            patience: None,
            precision: Precision::F32,
            checkpoint_activations: false,
            devices: Devices::default(),
            nodes: None,
            lora: None,
        }
    }
}

/// A config file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The YAML is malformed, has an unknown key, or a value of the wrong type.
    #[error("{path}: key `{key}`: {message}")]
    Parse {
        /// The config file.
        path: PathBuf,
        /// Dotted path of the offending key (`.` for the document itself).
        key: String,
        /// What serde_yaml reported, including line and column.
        message: String,
    },
    /// A value parsed but is out of range or inconsistent with another.
    #[error("{path}: key `{key}`: {message}")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// Dotted path of the offending key.
        key: String,
        /// What was expected.
        message: String,
    },
}

impl RunConfig {
    /// Reads, parses and validates a config file. Relative paths inside it are resolved against its directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config = Self::parse(&text, path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        config.resolve_paths(base);
        Ok(config)
    }

    /// Parses and validates YAML text; `path` only labels errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let raw: serde_yaml::Value = serde_yaml::from_str(text).unwrap_or(serde_yaml::Value::Null);
        let deserializer = serde_yaml::Deserializer::from_str(text);
        let config: RunConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Parse {
                path: path.to_path_buf(),
                key,
                message: e.into_inner().to_string(),
            }
        })?;
        if config.model.from.is_some() {
            refuse_shape_keys(&raw, path)?;
        }
        config.validate(path)?;
        Ok(config)
    }

    fn resolve_paths(&mut self, base: &Path) {
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        self.data.inputs.iter_mut().for_each(resolve);
        resolve(&mut self.data.cache_dir);
        if let Some(p) = self.tokenizer.path.as_mut() {
            resolve(p);
        }
        if let Some(p) = self.model.from.as_mut() {
            resolve(p);
        }
    }
}

/// The `model` keys that describe a shape, which a model loaded with `model.from` already has.
const SHAPE_KEYS: [&str; 9] = [
    "architecture",
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "intermediate_size",
    "rope_theta",
    "norm_eps",
    "tie_embeddings",
];

/// With `model.from`, a shape key or a `tokenizer` key in the file would be silently overridden by the
/// checkpoint's own: each is an error naming it.
fn refuse_shape_keys(raw: &serde_yaml::Value, path: &Path) -> Result<(), ConfigError> {
    let invalid = |key: String, message: &str| ConfigError::Invalid {
        path: path.to_path_buf(),
        key,
        message: message.to_string(),
    };
    if let Some(model) = raw.get("model").and_then(serde_yaml::Value::as_mapping) {
        for key in SHAPE_KEYS {
            if model.contains_key(key) {
                return Err(invalid(
                    format!("model.{key}"),
                    "the model given by model.from has its own shape; remove this key",
                ));
            }
        }
    }
    if let Some(tokenizer) = raw.get("tokenizer").and_then(serde_yaml::Value::as_mapping)
        && let Some(key) = tokenizer.keys().next()
    {
        let key = key.as_str().unwrap_or("?");
        return Err(invalid(
            format!("tokenizer.{key}"),
            "the model given by model.from brings its own tokenizer; remove the tokenizer section",
        ));
    }
    Ok(())
}

pub mod limits;
mod validate;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
