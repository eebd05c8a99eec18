//! Which key positions each query may attend to, and the softmax scale.

use burn::tensor::{Bool, Tensor, backend::Backend};

/// The position-based part of an attention mask: plain data, shared by every kernel and backend.
///
/// Query row `i` sits at absolute position `p = query_offset + i`; key column `j` sits at position `j`.
/// A key is visible when all enabled rules allow it:
/// - `causal`: `j <= p`;
/// - `window = Some(w)`: `j > p - w`, i.e. the `w` most recent positions including the query's own
///   (Mistral `sliding_window`, GPT-Neo local layers `window_size`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaskSpec {
    /// Mask keys after the query's position.
    pub causal: bool,
    /// Absolute position of the first query row; with a KV cache this is the number of cached positions.
    pub query_offset: usize,
    /// Sliding-window length in positions (`None`: unlimited).
    pub window: Option<usize>,
}

impl MaskSpec {
    /// Whether the key at position `key` is visible from the query at absolute position `query_pos`.
    pub fn allows(&self, query_pos: usize, key: usize) -> bool {
        let causal_ok = !self.causal || key <= query_pos;
        let window_ok = self.window.is_none_or(|w| key + w > query_pos);
        causal_ok && window_ok
    }

    /// Whether no key in `keys` is visible from any query row in `rows` (relative row indices): such a
    /// tile can be skipped without computing it.
    pub fn tile_fully_masked(
        &self,
        rows: std::ops::Range<usize>,
        keys: std::ops::Range<usize>,
    ) -> bool {
        if rows.is_empty() || keys.is_empty() {
            return true;
        }
        let first_pos = self.query_offset + rows.start;
        let last_pos = self.query_offset + rows.end - 1;
        // The first query sees the earliest keys and the last query the latest ones.
        let after_causal = self.causal && keys.start > last_pos;
        let before_window = self.window.is_some_and(|w| keys.end - 1 + w <= first_pos);
        after_causal || before_window
    }

    /// Whether every key in `keys` is visible from every query row in `rows`: such a tile needs no mask.
    pub fn tile_fully_visible(
        &self,
        rows: std::ops::Range<usize>,
        keys: std::ops::Range<usize>,
    ) -> bool {
        if rows.is_empty() || keys.is_empty() {
            return true;
        }
        let first_pos = self.query_offset + rows.start;
        let last_pos = self.query_offset + rows.end - 1;
        self.allows(first_pos, keys.end - 1) && self.allows(last_pos, keys.start)
    }
}

/// Everything an attention call needs besides `q`, `k` and `v`.
///
/// ```
/// use burn::backend::Flex;
/// use ember_attention::AttentionOptions;
/// // Decoding with 10 cached positions, Mistral-style 4096-token window.
/// let opts = AttentionOptions::<Flex>::causal().with_offset(10).with_window(4096);
/// assert!(opts.mask.causal && opts.mask.query_offset == 10);
/// ```
#[derive(Clone, Debug)]
pub struct AttentionOptions<B: Backend> {
    /// Causal / offset / window rules.
    pub mask: MaskSpec,
    /// Padded keys of a left-padded batch, `[batch, kv_len]`, `true` = padding (never attended to).
    pub key_padding: Option<Tensor<B, 2, Bool>>,
    /// Multiplier of `q·k` before the softmax; `None` means `1 / sqrt(head_dim)`.
    pub scale: Option<f64>,
    /// Soft cap `c` of the scaled scores, `c * tanh(s / c)` before masking and softmax (Gemma 2's
    /// `attn_logit_softcapping`); `None` leaves scores unbounded. Must be positive and finite.
    pub softcap: Option<f64>,
}

impl<B: Backend> Default for AttentionOptions<B> {
    fn default() -> Self {
        Self {
            mask: MaskSpec::default(),
            key_padding: None,
            scale: None,
            softcap: None,
        }
    }
}

impl<B: Backend> AttentionOptions<B> {
    /// Bidirectional attention: every key visible, default scale.
    pub fn full() -> Self {
        Self::default()
    }

    /// Causal attention with query offset 0 and default scale.
    pub fn causal() -> Self {
        Self {
            mask: MaskSpec {
                causal: true,
                ..MaskSpec::default()
            },
            ..Self::default()
        }
    }

    /// Sets the absolute position of the first query row (the number of cached positions).
    pub fn with_offset(mut self, query_offset: usize) -> Self {
        self.mask.query_offset = query_offset;
        self
    }

    /// Restricts each query to the `window` most recent positions (including its own).
    pub fn with_window(mut self, window: usize) -> Self {
        self.mask.window = Some(window);
        self
    }

    /// Sets or clears the sliding window (per-layer local/global attention).
    pub fn with_window_opt(mut self, window: Option<usize>) -> Self {
        self.mask.window = window;
        self
    }

    /// Masks padded keys: `key_padding` is `[batch, kv_len]`, `true` marks padding.
    pub fn with_key_padding(mut self, key_padding: Tensor<B, 2, Bool>) -> Self {
        self.key_padding = Some(key_padding);
        self
    }

    /// Overrides the softmax scale (default `1 / sqrt(head_dim)`).
    pub fn with_scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Caps the scaled scores at `±softcap` with `softcap * tanh(s / softcap)` (see [`Self::softcap`]).
    pub fn with_softcap(mut self, softcap: f64) -> Self {
        self.softcap = Some(softcap);
        self
    }

    /// The scale actually used for a given head dimension.
    pub fn resolved_scale(&self, head_dim: usize) -> f64 {
        self.scale.unwrap_or_else(|| 1.0 / (head_dim as f64).sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tile shortcuts must agree with the per-element rule on every tile of small grids, or the flash
    /// kernel would skip visible keys or leave hidden ones unmasked.
    #[test]
    fn tile_shortcuts_agree_with_the_elementwise_rule() {
        for causal in [false, true] {
            for window in [None, Some(1), Some(3), Some(7)] {
                for query_offset in [0, 2, 9] {
                    let spec = MaskSpec {
                        causal,
                        query_offset,
                        window,
                    };
                    for rows in (0..8).flat_map(|s| (s + 1..=8).map(move |e| s..e)) {
                        for keys in (0..14).flat_map(|s| (s + 1..=14).map(move |e| s..e)) {
                            let visible = rows.clone().flat_map(|r| {
                                keys.clone().map(move |k| spec.allows(query_offset + r, k))
                            });
                            let (any, all) =
                                visible.fold((false, true), |(any, all), v| (any || v, all && v));
                            assert_eq!(
                                spec.tile_fully_masked(rows.clone(), keys.clone()),
                                !any,
                                "{spec:?} {rows:?} {keys:?}"
                            );
                            assert_eq!(
                                spec.tile_fully_visible(rows.clone(), keys.clone()),
                                all,
                                "{spec:?} {rows:?} {keys:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
