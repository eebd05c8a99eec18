//! Errors of the attention crate.

use thiserror::Error;

/// What went wrong in attention, RoPE or the KV cache.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum AttentionError {
    /// An input tensor does not have the shape the operation needs.
    #[error("attention: tensor `{tensor}` has shape {actual:?}, expected {expected}")]
    Shape {
        /// Which tensor (`query`, `key`, `value`, `key_padding`, ...).
        tensor: &'static str,
        /// Its actual dimensions.
        actual: Vec<usize>,
        /// The shape that was expected, in words.
        expected: String,
    },
    /// A sliding window of zero positions would hide every key.
    #[error("attention: the sliding window must cover at least 1 position, got 0")]
    EmptyWindow,
    /// A soft cap that is not a positive finite number (the cap divides the scores).
    #[error("attention: the score soft cap must be a positive finite number, got {0}")]
    InvalidSoftcap(f64),
    /// A name that does not denote an attention kernel (see [`crate::AttentionKernel`]).
    #[error("unknown attention kernel `{0}`, expected one of: manual, fused, flash")]
    UnknownKernel(String),
    /// A RoPE configuration value is out of range.
    #[error("rope config: `{key}` {problem}")]
    RopeConfig {
        /// The offending configuration key (e.g. `rotary_dim`, `rope_scaling.factor`).
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A KV-cache operation named a layer the cache does not have.
    #[error("kv cache: layer {layer} out of range, the cache has {num_layers} layers")]
    CacheLayer {
        /// The layer asked for.
        layer: usize,
        /// How many layers the cache holds.
        num_layers: usize,
    },
    /// A cache could not store new positions (a paged pool out of blocks, an unknown sequence), with the
    /// cache's own message.
    #[error("kv cache: {0}")]
    Cache(String),
}
