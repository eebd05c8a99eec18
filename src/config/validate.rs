//! [`RunConfig::validate`]: every value's range and every cross-key constraint, checked once the YAML has
//! parsed and before anything is allocated. Each error names the file, the dotted key and what was expected.
//!
//! Single values are checked first, so that the products checked after them (tokens per step, memory) are of
//! bounded factors and cannot overflow.

use std::path::Path;

use ember_training::{AdamWConfig, CosineSchedule, DecayPolicy, TrainError};

use super::limits::{self, MAX_TOKENS_PER_STEP, MAX_TRAINING_BYTES};
use super::{ConfigError, DataFormat, Devices, RunConfig};

/// Builds the errors of one file.
struct Check<'a> {
    path: &'a Path,
}

impl Check<'_> {
    fn invalid(&self, key: &str, message: String) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            message,
        }
    }

    /// `value` must be in `min..=max`; `why` (may be empty) says where the bound comes from.
    fn int_in(
        &self,
        key: &str,
        value: usize,
        min: usize,
        max: usize,
        why: &str,
    ) -> Result<(), ConfigError> {
        if (min..=max).contains(&value) {
            return Ok(());
        }
        let range = if max == usize::MAX {
            format!("an integer >= {min}")
        } else {
            format!("an integer in {min}..={max}")
        };
        let why = if why.is_empty() {
            String::new()
        } else {
            format!(" ({why})")
        };
        Err(self.invalid(key, format!("expected {range}{why}, found {value}")))
    }

    /// `ok` must hold for float `value`; `expected` is the range in words.
    fn float(&self, key: &str, value: f64, expected: &str, ok: bool) -> Result<(), ConfigError> {
        if ok {
            Ok(())
        } else {
            // Debug writes `1e300`, not 301 digits.
            Err(self.invalid(key, format!("expected {expected}, found {value:?}")))
        }
    }

    /// A training-crate refusal (its own field names) as an error on config key `training.<config_key>`.
    fn training(&self, error: TrainError, keys: &[(&str, &str)]) -> ConfigError {
        match error {
            TrainError::Unsupported { key, message } => {
                let config_key = keys
                    .iter()
                    .find(|(field, _)| *field == key)
                    .map_or(key.as_str(), |(_, config)| config);
                self.invalid(&format!("training.{config_key}"), message)
            }
            other => self.invalid("training", other.to_string()),
        }
    }
}

impl RunConfig {
    /// Checks ranges and cross-key consistency.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let c = Check { path };
        if self.name.is_empty() {
            return Err(c.invalid(
                "name",
                "expected a non-empty run name (it names the output directory runs/<name>)".into(),
            ));
        }
        self.validate_tokenizer(&c)?;
        self.validate_model(&c)?;
        self.validate_training(&c)?;
        if self.data.format == DataFormat::Chat && self.model.from.is_none() {
            return Err(c.invalid(
                "data.format",
                "chat data is rendered with a model's chat template: set model.from to a pretrained model".into(),
            ));
        }
        let fraction = self.data.val_fraction;
        c.float(
            "data.val_fraction",
            fraction,
            "a value in (0, 1)",
            fraction > 0.0 && fraction < 1.0,
        )?;
        self.validate_memory(&c)
    }

    fn validate_tokenizer(&self, c: &Check) -> Result<(), ConfigError> {
        let t = &self.tokenizer;
        // With `path`, the file's own vocabulary is used and this key only sizes the memory estimate.
        c.int_in(
            "tokenizer.vocab_size",
            t.vocab_size,
            0,
            limits::MAX_VOCAB,
            "4x the largest vocabulary in use",
        )?;
        if t.path.is_some() {
            return Ok(());
        }
        if t.special_tokens.is_empty() {
            return Err(c.invalid(
                "tokenizer.special_tokens",
                "expected at least an end-of-document token".into(),
            ));
        }
        if t.vocab_size < 256 + t.special_tokens.len() {
            return Err(c.invalid(
                "tokenizer.vocab_size",
                format!(
                    "a byte-level BPE needs at least 256 + {} special tokens, found {}",
                    t.special_tokens.len(),
                    t.vocab_size
                ),
            ));
        }
        for (i, token) in t.special_tokens.iter().enumerate() {
            // An empty special token matches everywhere, and a repeated one would take two ids for one string.
            if token.is_empty() || t.special_tokens[..i].contains(token) {
                return Err(c.invalid(
                    &format!("tokenizer.special_tokens[{i}]"),
                    format!("expected a non-empty token distinct from the others, found {token:?}"),
                ));
            }
        }
        Ok(())
    }

    fn validate_model(&self, c: &Check) -> Result<(), ConfigError> {
        let m = &self.model;
        c.int_in(
            "model.hidden_size",
            m.hidden_size,
            1,
            limits::MAX_HIDDEN,
            "4x the widest public model",
        )?;
        c.int_in(
            "model.num_layers",
            m.num_layers,
            1,
            limits::MAX_LAYERS,
            "8x the deepest public model",
        )?;
        c.int_in("model.num_heads", m.num_heads, 1, m.hidden_size, "")?;
        c.int_in("model.num_kv_heads", m.num_kv_heads, 1, m.num_heads, "")?;
        c.int_in(
            "model.intermediate_size",
            m.intermediate_size,
            1,
            limits::MAX_INTERMEDIATE,
            "16x the widest public MLP",
        )?;
        c.int_in(
            "model.block_size",
            m.block_size,
            1,
            limits::MAX_BLOCK,
            "8x the longest context ember loads",
        )?;
        if !m.hidden_size.is_multiple_of(m.num_heads) {
            return Err(c.invalid(
                "model.num_heads",
                format!(
                    "must divide model.hidden_size ({}), found {}",
                    m.hidden_size, m.num_heads
                ),
            ));
        }
        // RoPE rotates dimensions in pairs, so every head needs an even width.
        if !(m.hidden_size / m.num_heads).is_multiple_of(2) {
            return Err(c.invalid(
                "model.num_heads",
                format!(
                    "model.hidden_size / num_heads (the head width) must be even for RoPE, found {} / {} = {}",
                    m.hidden_size,
                    m.num_heads,
                    m.hidden_size / m.num_heads
                ),
            ));
        }
        if !m.num_heads.is_multiple_of(m.num_kv_heads) {
            return Err(c.invalid(
                "model.num_kv_heads",
                format!(
                    "must divide model.num_heads ({}), found {}",
                    m.num_heads, m.num_kv_heads
                ),
            ));
        }
        // Below 1 the inverse frequencies theta^(-2i/d) grow with i, and a tiny base overflows them to infinity
        // (the fuzzer found 4.6e-102); every published base is far above 1 (10^4 to 10^6).
        c.float(
            "model.rope_theta",
            m.rope_theta,
            "a finite number >= 1",
            m.rope_theta.is_finite() && m.rope_theta >= 1.0,
        )?;
        // 0, negative, NaN or infinite epsilons make RMSNorm's output NaN (or divide by zero on a zero row).
        // The model computes in f32: an epsilon that rounds to 0 there (the fuzzer found 1e-300) is 0.
        c.float(
            "model.norm_eps",
            m.norm_eps,
            "a number in (0, 1) that f32 can hold (>= 1.5e-45)",
            (m.norm_eps as f32) > 0.0 && m.norm_eps < 1.0,
        )?;
        // The spec's own checks, as a backstop: a shape the model would refuse is refused here, where the error
        // can name the file, whatever rule the checks above do not repeat.
        let spec = m.spec(self.tokenizer.vocab_size.max(1)).map_err(|e| {
            let (key, message) = split_key(&e);
            c.invalid(key, message.to_string())
        })?;
        spec.validate()
            .map_err(|e| c.invalid("model", e.to_string()))
    }

    fn validate_lora(&self, c: &Check) -> Result<(), ConfigError> {
        let Some(lora) = &self.training.lora else {
            return Ok(());
        };
        if self.model.from.is_none() {
            return Err(c.invalid(
                "training.lora",
                "LoRA adapts a pretrained model: set model.from to the model to adapt".into(),
            ));
        }
        c.int_in(
            "training.lora.rank",
            lora.rank,
            1,
            ember_model::lora::MAX_RANK,
            "",
        )?;
        c.float(
            "training.lora.alpha",
            lora.alpha,
            "a finite value > 0",
            lora.alpha.is_finite() && lora.alpha > 0.0,
        )?;
        c.float(
            "training.lora.dropout",
            lora.dropout,
            "a value in [0, 1)",
            (0.0..1.0).contains(&lora.dropout),
        )?;
        if lora.targets.is_empty() {
            return Err(c.invalid(
                "training.lora.targets",
                "expected at least one module name, e.g. [q_proj, v_proj]".into(),
            ));
        }
        if self.training.checkpoint_activations && lora.dropout > 0.0 {
            return Err(c.invalid(
                "training.checkpoint_activations",
                format!(
                    "cannot recompute blocks with training.lora.dropout {} (a recomputed block would draw \
                     new dropout masks, so its gradients would not be the forward pass's): set the dropout \
                     to 0 or checkpoint_activations to false",
                    lora.dropout
                ),
            ));
        }
        Ok(())
    }

    fn validate_training(&self, c: &Check) -> Result<(), ConfigError> {
        self.validate_lora(c)?;
        let t = &self.training;
        c.int_in(
            "training.batch_size",
            t.batch_size,
            1,
            limits::MAX_BATCH,
            "",
        )?;
        c.int_in(
            "training.grad_accum_steps",
            t.grad_accum_steps,
            1,
            limits::MAX_BATCH,
            "",
        )?;
        for (key, value) in [
            ("training.max_steps", t.max_steps),
            ("training.log_interval", t.log_interval),
            ("training.eval_interval", t.eval_interval),
            ("training.eval_batches", t.eval_batches),
            ("training.checkpoint_interval", t.checkpoint_interval),
        ] {
            c.int_in(key, value, 1, usize::MAX, "")?;
        }
        if let Some(patience) = t.patience {
            // 0 would stop at the first validation pass, improved or not.
            c.int_in(
                "training.patience",
                patience,
                1,
                usize::MAX,
                "null never stops early",
            )?;
        }
        let tokens =
            t.batch_size as u128 * self.model.block_size as u128 * t.grad_accum_steps as u128;
        if tokens > MAX_TOKENS_PER_STEP {
            return Err(c.invalid(
                "training.batch_size",
                format!(
                    "batch_size × model.block_size × grad_accum_steps is {tokens} tokens per optimiser step, \
                     above the limit of {MAX_TOKENS_PER_STEP} (250x a LLaMA step)"
                ),
            ));
        }
        self.validate_devices(c)?;
        let schedule = CosineSchedule {
            peak: t.learning_rate,
            floor: t.min_learning_rate,
            warmup_steps: t.warmup_steps,
            total_steps: t.max_steps,
        };
        schedule.validate().map_err(|e| {
            c.training(
                e,
                &[
                    ("peak", "learning_rate"),
                    ("floor", "min_learning_rate"),
                    ("warmup_steps", "warmup_steps"),
                ],
            )
        })?;
        let optimizer = AdamWConfig {
            beta1: t.beta1,
            beta2: t.beta2,
            eps: t.eps,
            weight_decay: t.weight_decay,
            decay_policy: DecayPolicy::MatricesExceptEmbeddings,
        };
        optimizer.validate().map_err(|e| c.training(e, &[]))?;
        // Decoupled decay multiplies each weight by (1 - lr × weight_decay) every step: at 1 or more it zeroes
        // or flips the sign of every decayed weight.
        if t.learning_rate * t.weight_decay >= 1.0 {
            return Err(c.invalid(
                "training.weight_decay",
                format!(
                    "expected learning_rate × weight_decay < 1, found {:?} × {:?}",
                    t.learning_rate, t.weight_decay
                ),
            ));
        }
        c.float(
            "training.grad_clip",
            t.grad_clip,
            "a finite number >= 0 (0 disables clipping)",
            t.grad_clip.is_finite() && t.grad_clip >= 0.0,
        )?;
        if let Some(minutes) = t.time_limit_min {
            c.float(
                "training.time_limit_min",
                minutes,
                crate::flags::MINUTES_RANGE,
                minutes > 0.0 && minutes <= crate::flags::MAX_MINUTES,
            )?;
        }
        Ok(())
    }

    fn validate_devices(&self, c: &Check) -> Result<(), ConfigError> {
        let t = &self.training;
        // Checked before `indices`, which builds the list of a count.
        if let Devices::Count(n) = t.devices {
            c.int_in(
                "training.devices",
                n,
                1,
                t.batch_size,
                "one replica per device or thread, each with a share of training.batch_size",
            )?;
        }
        let replicas = t.devices.indices(t.batch_size, None).len();
        if replicas == 0 || replicas > t.batch_size {
            return Err(c.invalid(
                "training.devices",
                format!(
                    "expected a positive count or a non-empty list of at most training.batch_size ({}) device \
                     indices, found {replicas}",
                    t.batch_size
                ),
            ));
        }
        if !t.batch_size.is_multiple_of(replicas) {
            return Err(c.invalid(
                "training.devices",
                format!(
                    "{replicas} data-parallel replicas must divide training.batch_size ({})",
                    t.batch_size
                ),
            ));
        }
        let Some(nodes) = &t.nodes else {
            return Ok(());
        };
        if nodes.count == 0 {
            return Err(c.invalid(
                "training.nodes.count",
                "expected a positive number of machines, found 0".into(),
            ));
        }
        if nodes.rank >= nodes.count {
            return Err(c.invalid(
                "training.nodes.rank",
                format!(
                    "expected this machine's index below training.nodes.count ({}), found {}",
                    nodes.count, nodes.rank
                ),
            ));
        }
        let shares = replicas as u128 * u128::from(nodes.count);
        if !(t.batch_size as u128).is_multiple_of(shares) {
            return Err(c.invalid(
                "training.batch_size",
                format!(
                    "{replicas} data-parallel replicas on each of {} machines must divide training.batch_size ({})",
                    nodes.count, t.batch_size
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a configuration whose training would need more than [`MAX_TRAINING_BYTES`], saying how much.
    fn validate_memory(&self, c: &Check) -> Result<(), ConfigError> {
        let replicas = self
            .training
            .devices
            .indices(self.training.batch_size, None)
            .len();
        let estimate = limits::estimate(self, self.tokenizer.vocab_size, replicas);
        if estimate.total() <= MAX_TRAINING_BYTES {
            return Ok(());
        }
        // Name the key whose part dominates: the model's shape, or the batch.
        let key = if estimate.state_bytes >= estimate.activation_bytes {
            "model"
        } else {
            "training.batch_size"
        };
        Err(c.invalid(
            key,
            format!(
                "training this would need {}, above the limit of {} (more than one machine holds); \
                 shrink the model or the batch",
                estimate.describe(),
                limits::gib(MAX_TRAINING_BYTES)
            ),
        ))
    }
}

/// The dotted key a `model.*: ...` message from the spec conversion starts with, and the rest of it (`model`
/// and the whole message when it names none).
fn split_key(message: &str) -> (&str, &str) {
    match message.split_once(": ") {
        Some((key, rest)) if key.starts_with("model.") && !key.contains(' ') => (key, rest),
        _ => ("model", message),
    }
}
