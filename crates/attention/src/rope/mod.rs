//! Rotary position embeddings (RoPE) with cos/sin tables cached on the device.

mod cache;
mod config;

pub use cache::RopeCache;
pub use config::{RopeConfig, RopeLayout, RopeScaling};

use burn::tensor::{ElementConversion, Int, Tensor, TensorData, TensorPrimitive, backend::Backend};

use crate::{AttentionError, EmberBackend};

/// The most bytes of cos/sin tables [`Rope::new`] builds up front (64 MiB: 64k positions at head_dim 128).
///
/// A config's context length comes from a file and may claim billions of positions; building tables for all of
/// them at the first forward pass would allocate terabytes. Positions past the cached rows still work: their
/// rows are computed for the call that uses them, at a cost proportional to that call's tokens.
pub(crate) const MAX_CACHED_TABLE_BYTES: usize = 64 << 20;

/// How many positions [`Rope::new`] caches at most for heads `head_dim` wide (see [`MAX_CACHED_TABLE_BYTES`]).
pub(crate) fn max_cached_positions(head_dim: usize) -> usize {
    (MAX_CACHED_TABLE_BYTES / (2 * 4 * head_dim.max(1))).max(1)
}

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
    /// Validates `config` and caches tables for `max_positions` positions on `device`, or for as many as fit
    /// in 64 MiB when that is fewer (65536 positions at head_dim 128).
    ///
    /// Positions beyond the cache still work (tables for them are built on the fly), as do dynamic-NTK and
    /// LongRoPE sequences longer than their static range, whose frequencies depend on the length (the cache
    /// stops there).
    pub fn new(
        config: RopeConfig,
        max_positions: usize,
        device: &B::Device,
    ) -> Result<Self, AttentionError> {
        config.validate()?;
        // Past its static range a length-dependent scaling's rows are built per call; cached rows must be the
        // ones every length within that range uses.
        let fixed = config.static_positions().unwrap_or(usize::MAX);
        let cached = max_positions
            .min(fixed)
            .clamp(1, max_cached_positions(config.head_dim));
        let (cos, sin) = tables(&config, start_rows(0, cached), cached, device);
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
            tables(
                &self.config,
                start_rows(position_offset, end),
                end,
                &x.device(),
            )
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
        let flat = positions.reshape([batch * seq]);
        if needed <= self.max_positions() && !self.config.needs_dynamic_tables(needed) {
            let gather = |table: Tensor<B, 2>| {
                table
                    .select(0, flat.clone())
                    .reshape([batch, 1, seq, head_dim])
            };
            return self.rotate(x, gather(self.cos.clone()), gather(self.sin.clone()));
        }
        // Past the cache: rows for exactly these positions, not a table up to the largest of them (which a
        // long context would make huge for every decode step).
        let at: Vec<usize> = flat
            .into_data()
            .convert::<i64>()
            .into_vec::<i64>()
            .expect("positions convert to i64")
            .into_iter()
            .map(|p| usize::try_from(p).expect("rope positions must be non-negative"))
            .collect();
        let (cos, sin) = tables(&self.config, at, needed, &x.device());
        let shape = [batch, 1, seq, head_dim];
        self.rotate(x, cos.reshape(shape), sin.reshape(shape))
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

/// Positions `start..end` as the rows of a table.
fn start_rows(start: usize, end: usize) -> Vec<usize> {
    (start..end).collect()
}

/// Full-width cos/sin `[positions.len(), head_dim]`, one row per position (see [`Rope`]'s fields), with
/// frequencies for a sequence of `seq_len` positions. Angles are `f32(position) * f32(inv_freq)` in f32, as
/// Hugging Face computes them, so tables match reference checkpoints' numerics.
fn tables<B: Backend>(
    config: &RopeConfig,
    positions: Vec<usize>,
    seq_len: usize,
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let inv_freq = config.inv_freq(seq_len);
    let scale = config.attention_factor();
    let d = config.head_dim;
    let rows = positions.len();
    let mut cos = vec![1f32; rows * d];
    let mut sin = vec![0f32; rows * d];
    for (row, pos) in positions.into_iter().enumerate() {
        for ((first, second), f) in pairs(config).zip(&inv_freq) {
            let angle = f64::from(pos as f32 * f);
            let (c, s) = (angle.cos() as f32 * scale, angle.sin() as f32 * scale);
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

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{Distribution, Int, Tensor, TensorData};

    use super::*;

    fn values(t: Tensor<Flex, 4>) -> Vec<f32> {
        t.into_data().into_vec().unwrap()
    }

    #[test]
    fn a_huge_claimed_context_caches_a_bounded_table() {
        // usize::MAX positions used to overflow the table size (a capacity-overflow panic); 2^31 to abort.
        let rope = Rope::<Flex>::new(RopeConfig::new(64), usize::MAX, &Default::default()).unwrap();
        assert_eq!(rope.max_positions(), max_cached_positions(64));
        assert!(2 * 4 * 64 * rope.max_positions() <= MAX_CACHED_TABLE_BYTES);
        let cache = RopeCache::new();
        for _ in 0..3 {
            cache
                .get::<Flex>(&RopeConfig::new(64), usize::MAX, &Default::default())
                .unwrap();
        }
        assert_eq!(cache.builds(), 1, "a capped table serves every later call");
    }

    #[test]
    fn rows_past_the_cache_match_the_cached_rows_by_either_path() {
        let device = Default::default();
        let config = RopeConfig::new(16).with_theta(500.0);
        let small = Rope::<Flex>::new(config.clone(), 8, &device).unwrap();
        let large = Rope::<Flex>::new(config, 4096, &device).unwrap();
        let x = Tensor::<Flex, 4>::random([2, 3, 5, 16], Distribution::Default, &device);
        let offset = 1000;
        let positions: Vec<i64> = (0..2)
            .flat_map(|row| (0..5).map(move |i| offset + 7 * row + i))
            .collect();
        let at = Tensor::<Flex, 2, Int>::from_data(TensorData::new(positions, [2, 5]), &device);
        // Past `small`'s 8 cached rows both paths compute rows for the call; `large` reads its cache.
        assert_eq!(
            values(small.apply(x.clone(), offset as usize)),
            values(large.apply(x.clone(), offset as usize))
        );
        assert_eq!(
            values(small.apply_at(x.clone(), at.clone())),
            values(large.apply_at(x, at))
        );
    }
}
