//! Upper bounds of the run configuration's sizes, and the memory a configuration would need.
//!
//! Each bound is far above any model or run ember is meant for, so nothing real is refused; what they stop is a
//! typo or a fuzzed value (`hidden_size: 1e12`) reaching an allocation, where it aborts the process (or, on
//! Linux with overcommit, hands it to the OOM killer minutes later) instead of being an error naming the key.
//! The per-key bounds also keep every product below in `u128` range, so the estimate itself cannot overflow.

use ember_model::AttentionKernel;

use super::RunConfig;

/// `model.hidden_size`: 4x LLaMA 3 405B's 16,384.
pub const MAX_HIDDEN: usize = 65_536;
/// `model.num_layers`: 8x the deepest public models (LLaMA 3 405B has 126).
pub const MAX_LAYERS: usize = 1_024;
/// `model.intermediate_size`: 16x LLaMA 3 405B's 53,248, rounded to a power of two.
pub const MAX_INTERMEDIATE: usize = 1 << 20;
/// `model.block_size`: 8x the longest context ember loads (128k), the same bound as the token-count flags.
pub const MAX_BLOCK: usize = crate::flags::MAX_TOKENS;
/// `tokenizer.vocab_size` (and `train-tokenizer --vocab-size`): 4x the largest vocabulary in use (Gemma's
/// 262,144).
pub const MAX_VOCAB: usize = 1 << 20;
/// `training.batch_size` and `training.grad_accum_steps`: a micro-batch of 65,536 sequences, or as many
/// accumulated micro-batches, is past any optimiser recipe; the tokens per step are bounded below as well.
pub const MAX_BATCH: usize = 65_536;
/// Tokens per optimiser step (`batch_size × block_size × grad_accum_steps`): 2^30, 250x the 4M tokens of a
/// LLaMA step. The trainer counts tokens seen as this product, which must not overflow.
pub const MAX_TOKENS_PER_STEP: u128 = 1 << 30;
/// The memory a run may need by [`estimate`]: 1 TiB, more than the host or device memory of any single machine
/// ember trains on. `ember train` also compares the estimate with this machine's memory on the CPU backends.
pub const MAX_TRAINING_BYTES: u128 = 1 << 40;

/// About how much memory training a configuration takes, in bytes, split into what the parameters cost and what
/// a micro-batch's activations cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Parameters of the model.
    pub parameters: u128,
    /// Weights and gradients of every replica plus AdamW's two moments, f32.
    pub state_bytes: u128,
    /// Activations kept for the backward pass of one micro-batch (all replicas together), f32.
    pub activation_bytes: u128,
}

impl MemoryEstimate {
    /// Both parts together.
    pub fn total(&self) -> u128 {
        self.state_bytes + self.activation_bytes
    }

    /// The estimate in words, for error messages.
    pub fn describe(&self) -> String {
        format!(
            "about {} ({} for the weights, gradients and AdamW state of {} parameters, {} for a micro-batch's \
             activations)",
            gib(self.total()),
            gib(self.state_bytes),
            self.parameters,
            gib(self.activation_bytes)
        )
    }
}

/// `bytes` in GiB with one decimal.
pub fn gib(bytes: u128) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// The memory `config` would take to train with a vocabulary of `vocab` tokens and `replicas` data-parallel
/// replicas. An estimate (within a small factor), not an accounting: it counts the LLaMA-style model's
/// parameters exactly and the activations a backward pass keeps per token and layer (normalised inputs, q/k/v,
/// the attention output, the three MLP projections, and for the manual and fused kernels the
/// `[heads, seq, seq]` scores), plus the logits and their gradient.
pub fn estimate(config: &RunConfig, vocab: usize, replicas: usize) -> MemoryEstimate {
    let m = &config.model;
    let (h, i, layers, v) = (
        m.hidden_size as u128,
        m.intermediate_size as u128,
        m.num_layers as u128,
        vocab as u128,
    );
    let kv = h / m.num_heads.max(1) as u128 * m.num_kv_heads as u128;
    let embeddings = if m.tie_embeddings { v * h } else { 2 * v * h };
    let per_layer = h * (h + 2 * kv) + h * h + 3 * h * i + 2 * h;
    let parameters = embeddings + layers * per_layer + h;
    // Every replica holds weights and gradients; the optimiser's m and v exist once.
    let state_bytes = 4 * parameters * (2 * replicas.max(1) as u128 + 2);
    let tokens = config.training.batch_size as u128 * m.block_size as u128;
    let scores = match m.attention {
        AttentionKernel::Flash => 0,
        _ => 2 * m.num_heads as u128 * m.block_size as u128,
    };
    let per_token = layers * (8 * h + 2 * kv + 4 * i + scores) + 2 * v;
    MemoryEstimate {
        parameters,
        state_bytes,
        activation_bytes: 4 * tokens * per_token,
    }
}

/// [`estimate`] for a loaded model of `spec` (`model.from`), trained on `batch_size` windows of `block_size`
/// tokens with `kernel`; `trainable` parameters get gradients and AdamW state (all of them in full fine-tuning,
/// the adapters' under LoRA, whose frozen base is held once per replica and has neither).
pub fn estimate_loaded(
    spec: &ember_model::ModelSpec,
    batch_size: usize,
    block_size: usize,
    kernel: AttentionKernel,
    replicas: usize,
    trainable: u128,
) -> MemoryEstimate {
    let (h, i, layers, v) = (
        spec.hidden_size as u128,
        spec.intermediate_size as u128,
        spec.num_layers as u128,
        spec.vocab_size as u128,
    );
    let q = (spec.num_heads * spec.head_dim) as u128;
    let kv = (spec.num_kv_heads * spec.head_dim) as u128;
    let parameters = u128::from(spec.parameter_count());
    let frozen = parameters.saturating_sub(trainable);
    let replicas = replicas.max(1) as u128;
    let state_bytes = 4 * (frozen * replicas + trainable * (2 * replicas + 2));
    let tokens = batch_size as u128 * block_size as u128;
    let scores = match kernel {
        AttentionKernel::Flash => 0,
        _ => 2 * spec.num_heads as u128 * block_size as u128,
    };
    let per_token = layers * (6 * h + 2 * q + 2 * kv + 4 * i + scores) + 2 * v;
    MemoryEstimate {
        parameters,
        state_bytes,
        activation_bytes: 4 * tokens * per_token,
    }
}
