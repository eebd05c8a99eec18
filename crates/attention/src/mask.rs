//! Materialises the boolean mask of one tile of the score matrix (`true` = hidden key).

use std::ops::Range;

use burn::tensor::{Bool, Tensor, TensorData, backend::Backend};

use crate::MaskSpec;

/// The mask of score rows `rows` (relative query indices) against key columns `keys`, shaped
/// `[batch, 1, rows, keys]` (`[1, 1, rows, keys]` without padding) so it broadcasts over heads after an
/// `expand`. `None` when no entry of the tile is hidden, so callers skip the masking op entirely.
pub(crate) fn tile_mask<B: Backend>(
    spec: &MaskSpec,
    rows: Range<usize>,
    keys: Range<usize>,
    key_padding: Option<&Tensor<B, 2, Bool>>,
    device: &B::Device,
) -> Option<Tensor<B, 4, Bool>> {
    let (n_rows, n_keys) = (rows.len(), keys.len());
    let positional = (!spec.tile_fully_visible(rows.clone(), keys.clone())).then(|| {
        // Built on the host: a tile is at most block_q x block_k, and the rule is a few integer compares.
        let hidden: Vec<bool> = rows
            .flat_map(|r| {
                let pos = spec.query_offset + r;
                keys.clone().map(move |k| !spec.allows(pos, k))
            })
            .collect();
        Tensor::<B, 4, Bool>::from_data(TensorData::new(hidden, [1, 1, n_rows, n_keys]), device)
    });
    let padding = key_padding.map(|pad| {
        let batch = pad.dims()[0];
        pad.clone()
            .slice([0..batch, keys.clone()])
            .reshape([batch, 1, 1, n_keys])
            .expand([batch, 1, n_rows, n_keys])
    });
    match (positional, padding) {
        (Some(pos), Some(pad)) => {
            let batch = pad.dims()[0];
            Some(pos.expand([batch, 1, n_rows, n_keys]).bool_or(pad))
        }
        (pos, pad) => pos.or(pad),
    }
}

/// Applies a `[batch | 1, 1, rows, keys]` tile mask to scores laid out `[batch, kv_heads, group * rows, keys]`
/// (the grouped-query layout: the `group` query heads sharing a KV head are stacked along the row axis).
pub(crate) fn mask_scores<B: Backend>(
    scores: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    group: usize,
) -> Tensor<B, 4> {
    let Some(mask) = mask else {
        return scores;
    };
    let [batch, kv_heads, grouped_rows, keys] = scores.dims();
    let rows = grouped_rows / group;
    let [mask_batch, _, _, _] = mask.dims();
    let mask = mask
        .reshape([mask_batch, 1, 1, rows, keys])
        .expand([batch, kv_heads, group, rows, keys]);
    scores
        .reshape([batch, kv_heads, group, rows, keys])
        .mask_fill(mask, f32::NEG_INFINITY)
        .reshape([batch, kv_heads, grouped_rows, keys])
}
