//! The reference kernel: scores, scale, mask, softmax, weighted sum, exactly as written in the papers.

use burn::tensor::{Tensor, backend::Backend};

use crate::AttentionOptions;
use crate::mask::{mask_scores, tile_mask};

/// Attention with the whole `[q_len, kv_len]` score matrix materialised (memory O(q_len * kv_len)).
///
/// q `[batch, q_heads, q_len, head_dim]`, k `[batch, kv_heads, kv_len, head_dim]`,
/// v `[batch, kv_heads, kv_len, v_dim]` -> `[batch, q_heads, q_len, v_dim]`. Runs in whatever float dtype the
/// inputs have, so the same code in f64 is the oracle of the tests. Rows whose keys are all hidden yield 0.
pub(crate) fn manual_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    options: &AttentionOptions<B>,
) -> Tensor<B, 4> {
    let [batch, q_heads, q_len, head_dim] = q.dims();
    let [_, kv_heads, kv_len, _] = k.dims();
    let v_dim = v.dims()[3];
    let group = q_heads / kv_heads;
    let scale = options.resolved_scale(head_dim);

    // Grouped-query attention without repeating K/V: query head h = kv * group + g reads KV head kv, so
    // stacking the group's rows makes one matmul per KV head.
    let q = q.reshape([batch, kv_heads, group * q_len, head_dim]);
    let scores = soft_cap(
        q.matmul(k.swap_dims(2, 3)).mul_scalar(scale),
        options.softcap,
    );
    let mask = tile_mask(
        &options.mask,
        0..q_len,
        0..kv_len,
        options.key_padding.as_ref(),
        &scores.device(),
    );
    let probs = masked_softmax(mask_scores(scores, mask, group));
    probs.matmul(v).reshape([batch, q_heads, q_len, v_dim])
}

/// `cap * tanh(scores / cap)` (Gemma 2's attention-logit capping), or `scores` unchanged without a cap. Applied
/// before masking: a capped `-inf` would turn into the finite `-cap` and unmask the key.
pub(crate) fn soft_cap<B: Backend>(scores: Tensor<B, 4>, cap: Option<f64>) -> Tensor<B, 4> {
    match cap {
        Some(cap) => scores.div_scalar(cap).tanh().mul_scalar(cap),
        None => scores,
    }
}

/// Softmax over the last axis that maps rows of only `-inf` to zeros instead of NaN.
///
/// The row maximum is detached: softmax does not depend on it, so no gradient needs to flow through it.
pub(crate) fn masked_softmax<B: Backend>(scores: Tensor<B, 4>) -> Tensor<B, 4> {
    let limits = FloatLimits::of(&scores);
    let max = scores.clone().max_dim(3).detach().clamp_min(limits.lowest);
    let numerator = scores.sub(max).exp();
    let denominator = numerator.clone().sum_dim(3).clamp_min(limits.min_positive);
    numerator.div(denominator)
}

/// The two float limits NaN-free masking needs, for the tensor's dtype.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FloatLimits {
    /// Most negative finite value: the floor of a running maximum, so `-inf - max` stays `-inf`.
    pub lowest: f64,
    /// Smallest positive normal value: the floor of a softmax denominator, so empty rows give 0, not 0/0.
    pub min_positive: f64,
}

impl FloatLimits {
    /// Limits of `tensor`'s dtype (f32 limits for dtypes burn does not describe).
    pub fn of<B: Backend, const D: usize>(tensor: &Tensor<B, D>) -> Self {
        match tensor.dtype().finfo() {
            Some(info) => Self {
                lowest: info.min,
                min_positive: info.min_positive,
            },
            None => Self {
                lowest: f64::from(f32::MIN),
                min_positive: f64::from(f32::MIN_POSITIVE),
            },
        }
    }
}
