//! Rotary position embeddings (RoPE) with cos/sin tables cached on the device.

mod cache;
mod config;

pub use cache::RopeCache;
pub use config::{RopeConfig, RopeLayout, RopeScaling};

use burn::tensor::{ElementConversion, Int, Tensor, TensorData, TensorPrimitive, backend::Backend};

use crate::{AttentionError, EmberBackend};

/// RoPE ready to apply: the config plus cos/sin tables for positions `0..max_positions` on one device.
#[derive(Clone, Debug)]
pub struct Rope<B: Backend> {
    config: RopeConfig,
    /// `[max_positions, head_dim]`: each angle's cosine at both dimensions of its pair, 1 on dimensions past
    /// `rotary_dim`.
    pub(crate) cos: Tensor<B, 2>,
    /// `[max_positions, head_dim]`: each angle's sine at both dimensions of its pair, 0 past `rotary_dim`.
    pub(crate) sin: Tensor<B, 2>,
    /// `[head_dim, head_dim]`: the signed permutation that maps each pair `(a, b)` to `(-b, a)` in the
    /// configured layout (zero columns past `rotary_dim`).
    pub(crate) rotation: Tensor<B, 2>,
}

impl<B: Backend> Rope<B> {
    /// Validates `config` and caches tables for `max_positions` positions on `device`.
    ///
    /// Positions beyond the cache still work (tables for them are built on the fly), as do dynamic-NTK
    /// sequences longer than `max_position_embeddings`, whose frequencies depend on the length.
    pub fn new(
        config: RopeConfig,
        max_positions: usize,
        device: &B::Device,
    ) -> Result<Self, AttentionError> {
        config.validate()?;
        let (cos, sin) = tables(&config, 0, max_positions, max_positions, device);
        let rotation = rotation(&config, device);
        Ok(Self {
            config,
            cos,
            sin,
            rotation,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RopeConfig {
        &self.config
    }

    /// Number of positions with cached tables.
    pub fn max_positions(&self) -> usize {
        self.cos.dims()[0]
    }
}

impl<B: EmberBackend> Rope<B> {
    /// Rotates `x` `[batch, heads, seq, head_dim]` whose row `i` sits at position `position_offset + i`.
    ///
    /// # Panics
    /// If `x`'s last dimension is not the configured `head_dim`.
    pub fn apply(&self, x: Tensor<B, 4>, position_offset: usize) -> Tensor<B, 4> {
        let [_, _, seq, head_dim] = x.dims();
        let end = position_offset + seq;
        let (cos, sin) = if end <= self.max_positions() && !self.config.needs_dynamic_tables(end) {
            let rows = [position_offset..end, 0..head_dim];
            (
                self.cos.clone().slice(rows.clone()),
                self.sin.clone().slice(rows),
            )
        } else {
            tables(&self.config, position_offset, end, end, &x.device())
        };
        self.rotate(
            x,
            cos.reshape([1, 1, seq, head_dim]),
            sin.reshape([1, 1, seq, head_dim]),
        )
    }

    /// Rotates `x` `[batch, heads, seq, head_dim]` at explicit `positions` `[batch, seq]` (left-padded batches,
    /// where each row starts at a different position). Dynamic NTK uses the largest position + 1 as the
    /// sequence length, as Hugging Face does.
    ///
    /// # Panics
    /// If `x`'s last dimension is not `head_dim`, or `positions` is not `[batch, seq]` or holds negatives.
    pub fn apply_at(&self, x: Tensor<B, 4>, positions: Tensor<B, 2, Int>) -> Tensor<B, 4> {
        let [batch, seq] = positions.dims();
        let head_dim = self.config.head_dim;
        // One scalar read: it decides whether the cached table covers every position.
        let needed = positions.clone().max().into_scalar().elem::<i64>() + 1;
        let needed = usize::try_from(needed).expect("rope positions must be non-negative");
        let (cos, sin) =
            if needed <= self.max_positions() && !self.config.needs_dynamic_tables(needed) {
                (self.cos.clone(), self.sin.clone())
            } else {
                tables(&self.config, 0, needed, needed, &x.device())
            };
        let flat = positions.reshape([batch * seq]);
        let gather = |table: Tensor<B, 2>| {
            table
                .select(0, flat.clone())
                .reshape([batch, 1, seq, head_dim])
        };
        self.rotate(x, gather(cos), gather(sin))
    }

    /// Rotates `x` by angles whose full-width cos/sin are `[batch | 1, 1, seq, head_dim]`, through the backend's
    /// [`EmberBackend::rope_rotate`].
    fn rotate(&self, x: Tensor<B, 4>, cos: Tensor<B, 4>, sin: Tensor<B, 4>) -> Tensor<B, 4> {
        let head_dim = x.dims()[3];
        assert_eq!(
            head_dim, self.config.head_dim,
            "rope: input has head_dim {head_dim}, the config says {}",
            self.config.head_dim
        );
        let primitive = |t: Tensor<B, 4>| t.into_primitive().tensor();
        let rotated = B::rope_rotate(
            primitive(x),
            primitive(cos),
            primitive(sin),
            self.rotation.clone().into_primitive().tensor(),
            &self.config,
        );
        Tensor::from_primitive(TensorPrimitive::Float(rotated))
    }
}

/// The pairs `(first, second)` of dimensions RoPE rotates together, in the configured layout.
fn pairs(config: &RopeConfig) -> impl Iterator<Item = (usize, usize)> {
    let half = config.rotary_dim / 2;
    let layout = config.layout;
    (0..half).map(move |k| match layout {
        RopeLayout::RotateHalf => (k, k + half),
        RopeLayout::Interleaved => (2 * k, 2 * k + 1),
    })
}

/// `[head_dim, head_dim]` with `(x @ R)` mapping each pair `(a, b)` of `x` to `(-b, a)` and other dimensions to 0.
fn rotation<B: Backend>(config: &RopeConfig, device: &B::Device) -> Tensor<B, 2> {
    let d = config.head_dim;
    let mut r = vec![0f32; d * d];
    for (first, second) in pairs(config) {
        r[second * d + first] = -1.0;
        r[first * d + second] = 1.0;
    }
    Tensor::from_data(TensorData::new(r, [d, d]), device)
}

/// Full-width cos/sin `[end - start, head_dim]` of positions `start..end` (see [`Rope`]'s fields), with
/// frequencies for a sequence of `seq_len` positions. Angles are `f32(position) * f32(inv_freq)` in f32, as
/// Hugging Face computes them, so tables match reference checkpoints' numerics.
fn tables<B: Backend>(
    config: &RopeConfig,
    start: usize,
    end: usize,
    seq_len: usize,
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let inv_freq = config.inv_freq(seq_len);
    let d = config.head_dim;
    let rows = end - start;
    let mut cos = vec![1f32; rows * d];
    let mut sin = vec![0f32; rows * d];
    for (row, pos) in (start..end).enumerate() {
        for ((first, second), f) in pairs(config).zip(&inv_freq) {
            let angle = f64::from(pos as f32 * f);
            let (c, s) = (angle.cos() as f32, angle.sin() as f32);
            for j in [first, second] {
                cos[row * d + j] = c;
                sin[row * d + j] = s;
            }
        }
    }
    let shape = [rows, d];
    (
        Tensor::from_data(TensorData::new(cos, shape), device),
        Tensor::from_data(TensorData::new(sin, shape), device),
    )
}
