//! Multi-head / grouped-query self-attention: projections, optional Q/K norm, RoPE, KV cache, and the
//! selected attention kernel from `ember-attention`.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};
use ember_attention::{
    Appended, AttentionKernel, AttentionOptions, EmberBackend, KvCache, Rope, attention,
};

use super::{Linear, Norm};
use crate::error::Result;

/// Self-attention of one block.
#[derive(Module, Debug)]
pub struct SelfAttention<B: Backend> {
    /// `[heads * head_dim, hidden]`.
    pub q: Linear<B>,
    /// `[kv_heads * head_dim, hidden]`.
    pub k: Linear<B>,
    /// `[kv_heads * head_dim, hidden]`.
    pub v: Linear<B>,
    /// `[hidden, heads * head_dim]`.
    pub o: Linear<B>,
    /// RMSNorm over each query head (Qwen3).
    pub q_norm: Option<Norm<B>>,
    /// RMSNorm over each key head (Qwen3).
    pub k_norm: Option<Norm<B>>,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Cap of the scaled scores (Gemma 2, see [`ember_attention::AttentionOptions::softcap`]).
    #[module(skip)]
    pub softcap: Option<f64>,
}

/// Where the tokens of one forward call sit, shared by every layer.
pub struct CallPositions<'a, B: EmberBackend> {
    /// Rotary tables, for RoPE models.
    pub rope: Option<&'a Rope<B>>,
    /// Rotary tables of the sliding-window layers when they differ from `rope` (Gemma 3).
    pub local_rope: Option<&'a Rope<B>>,
    /// Absolute position of the first new token (the number of cached positions).
    pub offset: usize,
    /// Per-row positions `[batch, seq]` for left-padded batches; `None`: `offset..offset + seq` for every row.
    pub explicit: Option<Tensor<B, 2, Int>>,
    /// `[batch, cached + seq]`, `true` = padding key.
    pub key_padding: Option<Tensor<B, 2, Bool>>,
    /// The attention kernel.
    pub kernel: AttentionKernel,
}

impl<B: EmberBackend> SelfAttention<B> {
    /// `x` `[batch, seq, hidden]` to `[batch, seq, hidden]`, appending this layer's keys and values to `cache`.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        layer: usize,
        window: Option<usize>,
        scale: Option<f64>,
        at: &CallPositions<'_, B>,
        cache: Option<&mut (dyn KvCache<B> + '_)>,
    ) -> Result<Tensor<B, 3>> {
        let [batch, seq, _] = x.dims();
        let heads =
            |t: Tensor<B, 3>, n: usize| t.reshape([batch, seq, n, self.head_dim]).swap_dims(1, 2);
        let [q, k, v] = Linear::forward_many([&self.q, &self.k, &self.v], x);
        let mut q = heads(q, self.num_heads);
        let mut k = heads(k, self.num_kv_heads);
        let v = heads(v, self.num_kv_heads);
        if let (Some(q_norm), Some(k_norm)) = (&self.q_norm, &self.k_norm) {
            q = q_norm.forward(q);
            k = k_norm.forward(k);
        }
        let rope = match window {
            Some(_) => at.local_rope.or(at.rope),
            None => at.rope,
        };
        if let Some(rope) = rope {
            (q, k) = match &at.explicit {
                Some(positions) => (
                    rope.apply_at(q, positions.clone()),
                    rope.apply_at(k, positions.clone()),
                ),
                None => (rope.apply(q, at.offset), rope.apply(k, at.offset)),
            };
        }
        let mut options = AttentionOptions::causal()
            .with_offset(at.offset)
            .with_window_opt(window);
        if let Some(scale) = scale {
            options = options.with_scale(scale);
        }
        if let Some(cap) = self.softcap {
            options = options.with_softcap(cap);
        }
        if let Some(padding) = &at.key_padding {
            options = options.with_key_padding(padding.clone());
        }
        let (k, v) = match cache {
            // Only the flash kernel may be replaced by the cache's own (the paged pool's in-place reads
            // compute what it computes): a chosen reference kernel keeps attending over the copy.
            Some(cache) if at.kernel == AttentionKernel::Flash => {
                match cache.append_attend(layer, &q, k, v, &options)? {
                    Appended::Attended(out) => return Ok(self.output(out, batch, seq)),
                    Appended::Keys { keys, values } => (keys, values),
                }
            }
            Some(cache) => cache.append(layer, k, v)?,
            None => (k, v),
        };
        ember_attention::check_shapes(&q, &k, &v, &options)?;
        let out = attention(at.kernel, q, k, v, &options);
        Ok(self.output(out, batch, seq))
    }

    /// Heads `[batch, heads, seq, head_dim]` merged and projected back to `[batch, seq, hidden]`.
    fn output(&self, out: Tensor<B, 4>, batch: usize, seq: usize) -> Tensor<B, 3> {
        let out = out
            .swap_dims(1, 2)
            .reshape([batch, seq, self.num_heads * self.head_dim]);
        self.o.forward(out)
    }
}
