//! FlashAttention-2 in tensor ops: tiles of queries against tiles of keys with a running maximum and sum,
//! so no `[q_len, kv_len]` score matrix ever exists; the backward pass recomputes each tile's
//! probabilities from the saved log-sum-exp instead of storing them. Memory is O(q_len + kv_len) per
//! (batch, head) on top of the inputs, plus one tile.

use std::ops::Range;

use burn::tensor::{Bool, Tensor, backend::Backend};

use crate::MaskSpec;
use crate::manual::{FloatLimits, soft_cap};
use crate::mask::{mask_scores, tile_mask};

/// Tile sizes of the flash kernel, in rows (queries) and columns (keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashBlocks {
    /// Query rows per tile (per query head).
    pub query: usize,
    /// Keys per tile.
    pub key: usize,
}

impl Default for FlashBlocks {
    /// 64 x 64: a tile of scores for a 32-head batch stays in the low megabytes, while tensor-op overhead per
    /// tile is amortised over 4096 scores.
    fn default() -> Self {
        Self { query: 64, key: 64 }
    }
}

/// The non-tensor inputs of one flash-attention call, as [`crate::EmberBackend`] receives them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlashConfig {
    /// Causal / offset / window rules.
    pub mask: MaskSpec,
    /// Multiplier of `q·k` (already resolved, e.g. `1 / sqrt(head_dim)`).
    pub scale: f64,
    /// Soft cap of the scaled scores (see [`crate::AttentionOptions::softcap`]).
    pub softcap: Option<f64>,
    /// Tile sizes.
    pub blocks: FlashBlocks,
}

/// `0..len` cut into consecutive ranges of `size` (the last one shorter).
fn tiles(len: usize, size: usize) -> impl Iterator<Item = Range<usize>> {
    let size = size.max(1);
    (0..len)
        .step_by(size)
        .map(move |start| start..(start + size).min(len))
}

/// Shapes shared by the forward and backward passes.
#[derive(Clone, Copy)]
struct Dims {
    batch: usize,
    kv_heads: usize,
    group: usize,
    q_len: usize,
    kv_len: usize,
    head_dim: usize,
    v_dim: usize,
}

impl Dims {
    fn of<B: Backend>(q: &Tensor<B, 4>, k: &Tensor<B, 4>, v: &Tensor<B, 4>) -> Self {
        let [batch, q_heads, q_len, head_dim] = q.dims();
        let [_, kv_heads, kv_len, _] = k.dims();
        Self {
            batch,
            kv_heads,
            group: q_heads / kv_heads,
            q_len,
            kv_len,
            head_dim,
            v_dim: v.dims()[3],
        }
    }

    /// Rows `rows` of a `[batch, kv_heads, group, q_len, width]` tensor, as the grouped-query layout
    /// `[batch, kv_heads, group * rows, width]` that multiplies a KV head's tile in one matmul.
    fn row_tile<B: Backend>(&self, x: &Tensor<B, 5>, rows: &Range<usize>) -> Tensor<B, 4> {
        let width = x.dims()[4];
        x.clone()
            .slice([
                0..self.batch,
                0..self.kv_heads,
                0..self.group,
                rows.clone(),
                0..width,
            ])
            .reshape([self.batch, self.kv_heads, self.group * rows.len(), width])
    }

    /// Keys `keys` of a `[batch, kv_heads, kv_len, width]` tensor.
    fn key_tile<B: Backend>(&self, x: &Tensor<B, 4>, keys: &Range<usize>) -> Tensor<B, 4> {
        let width = x.dims()[3];
        x.clone()
            .slice([0..self.batch, 0..self.kv_heads, keys.clone(), 0..width])
    }

    /// Concatenates row tiles `[batch, kv_heads, group * rows, width]` back into `[batch, q_heads, q_len, width]`.
    fn join_rows<B: Backend>(
        &self,
        parts: Vec<(Tensor<B, 4>, usize)>,
        width: usize,
    ) -> Tensor<B, 4> {
        let parts: Vec<Tensor<B, 5>> = parts
            .into_iter()
            .map(|(t, rows)| t.reshape([self.batch, self.kv_heads, self.group, rows, width]))
            .collect();
        Tensor::cat(parts, 3).reshape([self.batch, self.kv_heads * self.group, self.q_len, width])
    }
}

/// Forward pass: returns the output `[batch, q_heads, q_len, v_dim]` and the log-sum-exp of each score row
/// `[batch, q_heads, q_len]` (what the backward pass needs to rebuild probabilities).
///
/// Shapes as in [`crate::attention`]; `q_len` and `kv_len` must be non-zero. Rows whose keys are all hidden
/// output 0 and get a log-sum-exp near the dtype's lowest value, so recomputed probabilities are 0 too.
pub fn flash_forward<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    key_padding: Option<Tensor<B, 2, Bool>>,
    config: &FlashConfig,
) -> (Tensor<B, 4>, Tensor<B, 3>) {
    let dims = Dims::of(&q, &k, &v);
    let device = q.device();
    let dtype = q.dtype();
    let limits = FloatLimits::of(&q);
    let q = q.mul_scalar(config.scale).reshape([
        dims.batch,
        dims.kv_heads,
        dims.group,
        dims.q_len,
        dims.head_dim,
    ]);

    let mut outputs = Vec::new();
    let mut lses = Vec::new();
    for rows in tiles(dims.q_len, config.blocks.query) {
        let q_tile = dims.row_tile(&q, &rows);
        let stats = [dims.batch, dims.kv_heads, dims.group * rows.len(), 1];
        let mut max = Tensor::<B, 4>::full(stats, limits.lowest, (&device, dtype));
        let mut sum = Tensor::<B, 4>::zeros(stats, (&device, dtype));
        let mut acc = Tensor::<B, 4>::zeros(
            [
                dims.batch,
                dims.kv_heads,
                dims.group * rows.len(),
                dims.v_dim,
            ],
            (&device, dtype),
        );
        for keys in tiles(dims.kv_len, config.blocks.key) {
            if config.mask.tile_fully_masked(rows.clone(), keys.clone()) {
                continue;
            }
            let scores = soft_cap(
                q_tile
                    .clone()
                    .matmul(dims.key_tile(&k, &keys).swap_dims(2, 3)),
                config.softcap,
            );
            let mask = tile_mask(
                &config.mask,
                rows.clone(),
                keys.clone(),
                key_padding.as_ref(),
                &device,
            );
            let scores = mask_scores(scores, mask, dims.group);
            // max starts at the lowest finite value, so a tile of only -inf keeps it finite and exp() gives 0.
            let new_max = max.clone().max_pair(scores.clone().max_dim(3));
            let probs = scores.sub(new_max.clone()).exp();
            let rescale = max.sub(new_max.clone()).exp();
            sum = sum.mul(rescale.clone()).add(probs.clone().sum_dim(3));
            acc = acc.mul(rescale).add(probs.matmul(dims.key_tile(&v, &keys)));
            max = new_max;
        }
        let sum = sum.clamp_min(limits.min_positive);
        outputs.push((acc.div(sum.clone()), rows.len()));
        lses.push((max.add(sum.log()), rows.len()));
    }
    let output = dims.join_rows(outputs, dims.v_dim);
    let lse = dims.join_rows(lses, 1).squeeze_dim::<3>(3);
    (output, lse)
}

/// Backward pass: gradients `(dq, dk, dv)` of the loss given `grad_output = dL/d output`.
///
/// FlashAttention-2 order: the outer loop walks key tiles (so `dk`, `dv` of a tile are finished before the
/// next), the inner loop walks query tiles and accumulates into `dq`. With `P = exp(S - lse)`,
/// `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ∘ (dP - rowsum(dO ∘ O))`, `dQ = scale · dS K`, `dK = scale · dSᵀ Q`;
/// with a soft cap, `dS` is multiplied by the cap's slope `1 - (S / cap)²` of the capped scores `S`. Grouped
/// query heads sum into their shared KV head through the stacked row layout.
#[allow(clippy::too_many_arguments)]
pub fn flash_backward<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    key_padding: Option<Tensor<B, 2, Bool>>,
    output: Tensor<B, 4>,
    lse: Tensor<B, 3>,
    grad_output: Tensor<B, 4>,
    config: &FlashConfig,
) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
    let dims = Dims::of(&q, &k, &v);
    let device = q.device();
    let dtype = q.dtype();
    let stats = [dims.batch, dims.kv_heads, dims.group, dims.q_len, 1];
    let delta = grad_output.clone().mul(output).sum_dim(3).reshape(stats);
    let lse = lse.reshape(stats);
    let q = q.reshape([
        dims.batch,
        dims.kv_heads,
        dims.group,
        dims.q_len,
        dims.head_dim,
    ]);
    let grad_output = grad_output.reshape([
        dims.batch,
        dims.kv_heads,
        dims.group,
        dims.q_len,
        dims.v_dim,
    ]);

    struct RowTile<B: Backend> {
        rows: Range<usize>,
        q: Tensor<B, 4>,
        grad_output: Tensor<B, 4>,
        lse: Tensor<B, 4>,
        delta: Tensor<B, 4>,
        grad_q: Option<Tensor<B, 4>>,
    }
    let mut row_tiles: Vec<RowTile<B>> = tiles(dims.q_len, config.blocks.query)
        .map(|rows| RowTile {
            q: dims.row_tile(&q, &rows),
            grad_output: dims.row_tile(&grad_output, &rows),
            lse: dims.row_tile(&lse, &rows),
            delta: dims.row_tile(&delta, &rows),
            grad_q: None,
            rows,
        })
        .collect();

    let mut grad_k = Vec::new();
    let mut grad_v = Vec::new();
    for keys in tiles(dims.kv_len, config.blocks.key) {
        let k_tile = dims.key_tile(&k, &keys);
        let v_tile = dims.key_tile(&v, &keys);
        let mut grad_k_tile = Tensor::<B, 4>::zeros(k_tile.shape(), (&device, dtype));
        let mut grad_v_tile = Tensor::<B, 4>::zeros(v_tile.shape(), (&device, dtype));
        for tile in row_tiles.iter_mut() {
            if config
                .mask
                .tile_fully_masked(tile.rows.clone(), keys.clone())
            {
                continue;
            }
            let scores = soft_cap(
                tile.q
                    .clone()
                    .matmul(k_tile.clone().swap_dims(2, 3))
                    .mul_scalar(config.scale),
                config.softcap,
            );
            let mask = tile_mask(
                &config.mask,
                tile.rows.clone(),
                keys.clone(),
                key_padding.as_ref(),
                &device,
            );
            // With a cap, the scores' gradient passes through `d(c tanh(s/c))/ds = 1 - (capped/c)²`.
            let cap_slope = config.softcap.map(|cap| {
                let t = scores.clone().div_scalar(cap);
                t.clone().mul(t).neg().add_scalar(1.0)
            });
            let probs = mask_scores(scores, mask, dims.group)
                .sub(tile.lse.clone())
                .exp();
            grad_v_tile = grad_v_tile.add(
                probs
                    .clone()
                    .swap_dims(2, 3)
                    .matmul(tile.grad_output.clone()),
            );
            let grad_probs = tile
                .grad_output
                .clone()
                .matmul(v_tile.clone().swap_dims(2, 3));
            let grad_scores = probs.mul(grad_probs.sub(tile.delta.clone()));
            let grad_scores = match cap_slope {
                Some(slope) => grad_scores.mul(slope),
                None => grad_scores,
            };
            let grad_q_part = grad_scores.clone().matmul(k_tile.clone());
            tile.grad_q = Some(match tile.grad_q.take() {
                Some(acc) => acc.add(grad_q_part),
                None => grad_q_part,
            });
            grad_k_tile = grad_k_tile.add(grad_scores.swap_dims(2, 3).matmul(tile.q.clone()));
        }
        grad_k.push(grad_k_tile.mul_scalar(config.scale));
        grad_v.push(grad_v_tile);
    }
    let grad_q_parts = row_tiles
        .into_iter()
        .map(|tile| {
            let shape = [
                dims.batch,
                dims.kv_heads,
                dims.group * tile.rows.len(),
                dims.head_dim,
            ];
            let grad = tile
                .grad_q
                .unwrap_or_else(|| Tensor::zeros(shape, (&device, dtype)));
            (grad.mul_scalar(config.scale), tile.rows.len())
        })
        .collect();
    let grad_q = dims.join_rows(grad_q_parts, dims.head_dim);
    (grad_q, Tensor::cat(grad_k, 2), Tensor::cat(grad_v, 2))
}
