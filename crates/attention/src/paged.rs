//! Attention that reads a paged KV store in place: each batch row's keys and values are rows of one shared
//! `[slots, kv_heads, dim]` storage tensor, found through the row's slot list, instead of a dense copy gathered
//! for every layer of every step.
//!
//! A continuous-batching server's decode step is where it pays: the gathered copy of every row's keys and
//! values had been 7-9% of a SmolLM2 server's time at 8 clients (docs/BENCHMARKS.md), and the copy's left
//! padding made every row as long as the longest.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::{AttentionOptions, EmberBackend};

/// Where each batch row's positions sit in a paged store: row `b` holds `offsets[b + 1] - offsets[b]`
/// positions, position `p` in storage slot `slots[offsets[b] + p]`.
#[derive(Clone, Copy, Debug)]
pub struct PagedRows<'a> {
    /// Every row's slots in position order, the rows one after another.
    pub slots: &'a [usize],
    /// `batch + 1` ascending bounds into `slots`, the first 0.
    pub offsets: &'a [usize],
}

impl<'a> PagedRows<'a> {
    /// Rows in the batch.
    pub fn batch(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Row `b`'s slots, or `None` when `b` is out of range or the bounds are not ascending within `slots`.
    pub fn row(&self, b: usize) -> Option<&'a [usize]> {
        let (&start, &end) = (self.offsets.get(b)?, self.offsets.get(b + 1)?);
        self.slots.get(start..end)
    }
}

/// How a paged attention call masks and scales: causal within each row, optionally to the last `window`
/// positions a query sees (itself included), scores times `scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PagedConfig {
    /// Multiplier of `q·k` before the softmax.
    pub scale: f64,
    /// Sliding window: a query sees at most this many positions, ending at its own.
    pub window: Option<usize>,
}

/// Attention of `q` `[batch, q_heads, q_len, head_dim]` over each row's positions in the paged store `keys`
/// `[slots, kv_heads, head_dim]` / `values` `[slots, kv_heads, v_dim]`, read in place: row `b`'s queries are its
/// last `q_len` positions (appended before the call), each attending causally over the row's own positions.
/// Returns `[batch, q_heads, q_len, v_dim]`, or `None` where the backend has no such kernel or the inputs do
/// not fit it (shapes, slots out of range, a row shorter than `q_len`), and for what it does not cover:
/// non-causal masks and soft-capped scores. The caller then gathers the keys and attends over the copy.
///
/// `options.key_padding` and `options.mask.query_offset` are not read: a row's own positions are its keys,
/// so the left padding a gathered batch needs does not arise. On burn-flex a decode step (one query per row)
/// computes exactly what the flash kernel computes over the gathered keys, bit for bit.
pub fn paged_attention<B: EmberBackend>(
    q: &Tensor<B, 4>,
    keys: &Tensor<B, 3>,
    values: &Tensor<B, 3>,
    rows: PagedRows<'_>,
    options: &AttentionOptions<B>,
) -> Option<Tensor<B, 4>> {
    if !options.mask.causal || options.softcap.is_some() {
        return None;
    }
    let config = PagedConfig {
        scale: options.resolved_scale(q.dims()[3]),
        window: options.mask.window,
    };
    let out = B::paged_attention(
        primitive(q),
        primitive(keys),
        primitive(values),
        rows,
        config,
    )?;
    Some(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

fn primitive<B: Backend, const D: usize>(t: &Tensor<B, D>) -> burn::tensor::ops::FloatTensor<B> {
    t.clone().into_primitive().tensor()
}
