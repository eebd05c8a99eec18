//! Run configuration: a YAML file parsed into typed sections with defaults and validation.
//!
//! Every key has a default (see `configs/default.yaml`, which lists them all), so a config file only states what it
//! changes. Unknown keys are errors, and every error names the file and the dotted key path.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use ember_model::AttentionKernel;

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
    /// JSONL field holding the document text.
    pub text_field: String,
    /// Fraction of the corpus held out for validation, in (0, 1).
    pub val_fraction: f64,
    /// Where prepared shards are cached (relative to the config file's directory).
    pub cache_dir: PathBuf,
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

/// Model shape of a model trained from scratch (a LLaMA-style decoder: RMSNorm, RoPE, SwiGLU, GQA).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
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
    /// Data-parallel replicas on this machine; `batch_size` is split evenly across them.
    pub devices: Devices,
    /// Several machines joined through a burn-collective orchestrator (`ember orchestrator`).
    pub nodes: Option<NodesConfig>,
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

/// This machine's place in a multi-machine data-parallel run.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodesConfig {
    /// Machines taking part (each runs `ember train` with the same config except `address`, `data_port` and
    /// `rank`).
    pub count: u32,
    /// The orchestrator every machine registers with, e.g. `ws://10.0.0.1:3000`.
    pub orchestrator: String,
    /// This machine's address as the others reach it, e.g. `ws://10.0.0.2:3001`.
    pub address: String,
    /// Port of this machine's tensor data service: the port of `address`.
    pub data_port: u16,
    /// This machine's index, `0..count`: every machine draws the same global batch of `batch_size` rows and trains
    /// on share `rank` of it.
    pub rank: u32,
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

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
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
            devices: Devices::default(),
            nodes: None,
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
        let deserializer = serde_yaml::Deserializer::from_str(text);
        let config: RunConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Parse {
                path: path.to_path_buf(),
                key,
                message: e.into_inner().to_string(),
            }
        })?;
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
    }

    /// Checks ranges and cross-key consistency.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key: key.to_string(),
            message,
        };
        let positive = [
            ("model.hidden_size", self.model.hidden_size),
            ("model.num_layers", self.model.num_layers),
            ("model.num_heads", self.model.num_heads),
            ("model.num_kv_heads", self.model.num_kv_heads),
            ("model.intermediate_size", self.model.intermediate_size),
            ("model.block_size", self.model.block_size),
            ("training.batch_size", self.training.batch_size),
            ("training.grad_accum_steps", self.training.grad_accum_steps),
            ("training.max_steps", self.training.max_steps),
            ("training.log_interval", self.training.log_interval),
            ("training.eval_interval", self.training.eval_interval),
            ("training.eval_batches", self.training.eval_batches),
            (
                "training.checkpoint_interval",
                self.training.checkpoint_interval,
            ),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(invalid(key, "expected a positive integer, found 0".into()));
            }
        }
        let m = &self.model;
        if !m.hidden_size.is_multiple_of(m.num_heads) {
            return Err(invalid(
                "model.num_heads",
                format!(
                    "must divide model.hidden_size ({}), found {}",
                    m.hidden_size, m.num_heads
                ),
            ));
        }
        if !m.num_heads.is_multiple_of(m.num_kv_heads) {
            return Err(invalid(
                "model.num_kv_heads",
                format!(
                    "must divide model.num_heads ({}), found {}",
                    m.num_heads, m.num_kv_heads
                ),
            ));
        }
        if !(self.data.val_fraction > 0.0 && self.data.val_fraction < 1.0) {
            return Err(invalid(
                "data.val_fraction",
                format!(
                    "expected a value in (0, 1), found {}",
                    self.data.val_fraction
                ),
            ));
        }
        let t = &self.training;
        let replicas = t.devices.indices(t.batch_size, None).len();
        if replicas == 0 || replicas > u16::MAX as usize {
            return Err(invalid(
                "training.devices",
                "expected a positive count or a non-empty list of device indices".into(),
            ));
        }
        if !t.batch_size.is_multiple_of(replicas) {
            return Err(invalid(
                "training.devices",
                format!(
                    "{replicas} data-parallel replicas must divide training.batch_size ({})",
                    t.batch_size
                ),
            ));
        }
        if let Some(nodes) = &t.nodes {
            if nodes.count == 0 {
                return Err(invalid(
                    "training.nodes.count",
                    "expected a positive number of machines, found 0".into(),
                ));
            }
            if nodes.rank >= nodes.count {
                return Err(invalid(
                    "training.nodes.rank",
                    format!(
                        "expected this machine's index below training.nodes.count ({}), found {}",
                        nodes.count, nodes.rank
                    ),
                ));
            }
            let shares = replicas * nodes.count as usize;
            if !t.batch_size.is_multiple_of(shares) {
                return Err(invalid(
                    "training.batch_size",
                    format!(
                        "{replicas} data-parallel replicas on each of {} machines must divide training.batch_size ({})",
                        nodes.count, t.batch_size
                    ),
                ));
            }
        }
        for (key, value) in [
            ("training.learning_rate", t.learning_rate),
            ("training.eps", t.eps),
        ] {
            if !(value > 0.0 && value.is_finite()) {
                return Err(invalid(
                    key,
                    format!("expected a positive number, found {value}"),
                ));
            }
        }
        if !(0.0..=t.learning_rate).contains(&t.min_learning_rate) {
            return Err(invalid(
                "training.min_learning_rate",
                format!(
                    "expected 0 <= min_learning_rate <= learning_rate ({}), found {}",
                    t.learning_rate, t.min_learning_rate
                ),
            ));
        }
        for (key, value) in [("training.beta1", t.beta1), ("training.beta2", t.beta2)] {
            if !(0.0..1.0).contains(&value) {
                return Err(invalid(
                    key,
                    format!("expected a value in [0, 1), found {value}"),
                ));
            }
        }
        if t.weight_decay < 0.0 || t.grad_clip < 0.0 {
            return Err(invalid(
                "training.weight_decay",
                "weight_decay and grad_clip must be >= 0".into(),
            ));
        }
        if t.warmup_steps > t.max_steps {
            return Err(invalid(
                "training.warmup_steps",
                format!(
                    "expected at most training.max_steps ({}), found {}",
                    t.max_steps, t.warmup_steps
                ),
            ));
        }
        if let Some(minutes) = t.time_limit_min
            && (minutes.is_nan() || minutes <= 0.0)
        {
            return Err(invalid(
                "training.time_limit_min",
                format!("expected a positive number, found {minutes}"),
            ));
        }
        if self.tokenizer.path.is_none() {
            if self.tokenizer.vocab_size < 256 + self.tokenizer.special_tokens.len() {
                return Err(invalid(
                    "tokenizer.vocab_size",
                    format!(
                        "a byte-level BPE needs at least 256 + {} special tokens, found {}",
                        self.tokenizer.special_tokens.len(),
                        self.tokenizer.vocab_size
                    ),
                ));
            }
            if self.tokenizer.special_tokens.is_empty() {
                return Err(invalid(
                    "tokenizer.special_tokens",
                    "expected at least an end-of-document token".into(),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
