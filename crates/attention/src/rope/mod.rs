//! Rotary position embeddings (RoPE) with cos/sin tables cached on the device.

mod cache;
mod config;

pub use cache::RopeCache;
pub use config::{RopeConfig, RopeLayout, RopeScaling};

use burn::tensor::{ElementConversion, Int, Tensor, TensorData, backend::Backend};

use crate::AttentionError;

/// RoPE ready to apply: the config plus cos/sin tables for positions `0..max_positions` on one device.
#[derive(Clone, Debug)]
pub struct Rope<B: Backend> {
    config: RopeConfig,
    /// `[max_positions, rotary_dim / 2]`.
    cos: Tensor<B, 2>,
    /// `[max_positions, rotary_dim / 2]`.
    sin: Tensor<B, 2>,
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
        Ok(Self { config, cos, sin })
    }

    /// The configuration.
    pub fn config(&self) -> &RopeConfig {
        &self.config
    }

    /// Number of positions with cached tables.
    pub fn max_positions(&self) -> usize {
        self.cos.dims()[0]
    }

    /// Rotates `x` `[batch, heads, seq, head_dim]` whose row `i` sits at position `position_offset + i`.
    ///
    /// # Panics
    /// If `x`'s last dimension is not the configured `head_dim`.
    pub fn apply(&self, x: Tensor<B, 4>, position_offset: usize) -> Tensor<B, 4> {
        let [_, _, seq, _] = x.dims();
        let end = position_offset + seq;
        let half = self.config.rotary_dim / 2;
        let (cos, sin) = if end <= self.max_positions() && !self.config.needs_dynamic_tables(end) {
            let rows = [position_offset..end, 0..half];
            (
                self.cos.clone().slice(rows.clone()),
                self.sin.clone().slice(rows),
            )
        } else {
            tables(&self.config, position_offset, end, end, &x.device())
        };
        self.rotate(
            x,
            cos.reshape([1, 1, seq, half]),
            sin.reshape([1, 1, seq, half]),
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
        let half = self.config.rotary_dim / 2;
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
        let gather =
            |table: Tensor<B, 2>| table.select(0, flat.clone()).reshape([batch, 1, seq, half]);
        self.rotate(x, gather(cos), gather(sin))
    }

    /// Rotates the first `rotary_dim` dimensions of `x` by angles whose cos/sin are `[batch | 1, 1, seq, half]`.
    fn rotate(&self, x: Tensor<B, 4>, cos: Tensor<B, 4>, sin: Tensor<B, 4>) -> Tensor<B, 4> {
        let [batch, heads, seq, head_dim] = x.dims();
        assert_eq!(
            head_dim, self.config.head_dim,
            "rope: input has head_dim {head_dim}, the config says {}",
            self.config.head_dim
        );
        let (cos, sin) = (cos.cast(x.dtype()), sin.cast(x.dtype()));
        let rot = self.config.rotary_dim;
        let half = rot / 2;
        let x_rot = x.clone().slice([0..batch, 0..heads, 0..seq, 0..rot]);
        let rotated = match self.config.layout {
            RopeLayout::RotateHalf => {
                let x1 = x_rot.clone().slice([0..batch, 0..heads, 0..seq, 0..half]);
                let x2 = x_rot.slice([0..batch, 0..heads, 0..seq, half..rot]);
                let out1 = x1.clone().mul(cos.clone()).sub(x2.clone().mul(sin.clone()));
                let out2 = x2.mul(cos).add(x1.mul(sin));
                Tensor::cat(vec![out1, out2], 3)
            }
            RopeLayout::Interleaved => {
                let pairs = x_rot.reshape([batch, heads, seq, half, 2]);
                let pick = |i: usize| {
                    pairs
                        .clone()
                        .slice([0..batch, 0..heads, 0..seq, 0..half, i..i + 1])
                        .reshape([batch, heads, seq, half])
                };
                let (even, odd) = (pick(0), pick(1));
                let out_even = even
                    .clone()
                    .mul(cos.clone())
                    .sub(odd.clone().mul(sin.clone()));
                let out_odd = odd.mul(cos).add(even.mul(sin));
                Tensor::stack::<5>(vec![out_even, out_odd], 4).reshape([batch, heads, seq, rot])
            }
        };
        if rot == head_dim {
            rotated
        } else {
            let pass = x.slice([0..batch, 0..heads, 0..seq, rot..head_dim]);
            Tensor::cat(vec![rotated, pass], 3)
        }
    }
}

/// cos/sin `[end - start, rotary_dim / 2]` of positions `start..end`, with frequencies for a sequence of
/// `seq_len` positions. Angles are `f32(position) * f32(inv_freq)` in f32, as Hugging Face computes them,
/// so tables match reference checkpoints' numerics.
fn tables<B: Backend>(
    config: &RopeConfig,
    start: usize,
    end: usize,
    seq_len: usize,
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let inv_freq = config.inv_freq(seq_len);
    let half = inv_freq.len();
    let angles: Vec<f32> = (start..end)
        .flat_map(|pos| inv_freq.iter().map(move |f| pos as f32 * f))
        .collect();
    let cos: Vec<f32> = angles.iter().map(|a| f64::from(*a).cos() as f32).collect();
    let sin: Vec<f32> = angles.iter().map(|a| f64::from(*a).sin() as f32).collect();
    let shape = [end - start, half];
    (
        Tensor::from_data(TensorData::new(cos, shape), device),
        Tensor::from_data(TensorData::new(sin, shape), device),
    )
}
