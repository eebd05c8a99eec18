//! Key/value caches for incremental decoding.

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

use crate::{AttentionError, AttentionOptions, EmberBackend, write_block};

/// Per-layer storage of past keys and values.
///
/// A decoding step runs layer 0, 1, ... in order; each layer appends its new keys/values and attends over
/// everything returned. Keys and values are `[batch, kv_heads, positions, head_dim]` (values may have their own
/// last dimension). The paged pool of `ember-optimization` implements this trait with a block table, so
/// callers must rely only on what it specifies.
pub trait KvCache<B: Backend> {
    /// Number of layers.
    fn num_layers(&self) -> usize;

    /// Positions cached in every layer: the position offset of the tokens the next step feeds in. For a batch
    /// whose rows hold different numbers of positions (the paged pool), the longest row's: the width of the
    /// common, right-aligned position axis that appends return.
    fn len(&self) -> usize;

    /// Whether no position is cached.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `k` `[batch, kv_heads, new, head_dim]` and `v` `[batch, kv_heads, new, v_dim]` to `layer` and
    /// returns all keys and values of that layer so far, `[batch, kv_heads, cached + new, _]`.
    ///
    /// Errors if `layer` is out of range or the shapes disagree with what the layer already holds.
    fn append(
        &mut self,
        layer: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Result<(Tensor<B, 4>, Tensor<B, 4>), AttentionError>;

    /// Forgets every position at or after `len` in all layers (speculative-decoding rollback,
    /// prompt reuse). A `len` past the end changes nothing.
    fn truncate(&mut self, len: usize);

    /// Forgets everything, so the next append may use another batch size.
    fn reset(&mut self);

    /// Appends as [`append`](Self::append) does, then attends `q` `[batch, q_heads, new, head_dim]` over the
    /// layer's positions with `options` where the cache can without handing out a copy of them (the paged
    /// pool reads its blocks in place: [`crate::paged_attention`]); otherwise returns the keys and values
    /// `append` returns, for the caller to attend over. The default always does the latter.
    fn append_attend(
        &mut self,
        layer: usize,
        q: &Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        options: &AttentionOptions<B>,
    ) -> Result<Appended<B>, AttentionError> {
        let _ = (q, options);
        let (keys, values) = self.append(layer, k, v)?;
        Ok(Appended::Keys { keys, values })
    }
}

/// What [`KvCache::append_attend`] returns.
#[derive(Clone, Debug)]
pub enum Appended<B: Backend> {
    /// The cache attended: the output `[batch, q_heads, new, v_dim]`.
    Attended(Tensor<B, 4>),
    /// The layer's keys and values so far, as [`KvCache::append`] returns them.
    Keys {
        /// `[batch, kv_heads, positions, head_dim]`.
        keys: Tensor<B, 4>,
        /// `[batch, kv_heads, positions, v_dim]`.
        values: Tensor<B, 4>,
    },
}

/// One layer's buffers: `[batch, kv_heads, capacity, dim]`, of which the first `len` positions are valid.
#[derive(Clone, Debug)]
struct LayerBuffers<B: Backend> {
    keys: Tensor<B, 4>,
    values: Tensor<B, 4>,
    len: usize,
}

/// The straightforward cache: per layer, one contiguous buffer that grows by doubling, so appending one
/// token is amortised O(1) copies of the cache.
#[derive(Clone, Debug)]
pub struct ContiguousKvCache<B: Backend> {
    layers: Vec<Option<LayerBuffers<B>>>,
    initial_capacity: usize,
}

impl<B: Backend> ContiguousKvCache<B> {
    /// An empty cache for `num_layers` layers; buffers are allocated on first append.
    pub fn new(num_layers: usize) -> Self {
        Self::with_capacity(num_layers, 0)
    }

    /// An empty cache whose buffers start with room for `capacity` positions (e.g. prompt + max new tokens),
    /// so decoding never reallocates.
    pub fn with_capacity(num_layers: usize, capacity: usize) -> Self {
        Self {
            layers: vec![None; num_layers],
            initial_capacity: capacity,
        }
    }
}

impl<B: Backend> ContiguousKvCache<B> {
    /// Keeps only the batch rows listed in `rows` (in that order), so finished rows of a batch stop costing
    /// memory and compute.
    ///
    /// Errors if a row index is out of range.
    pub fn retain_rows(&mut self, rows: &[usize]) -> Result<(), AttentionError> {
        for buffers in self.layers.iter_mut().flatten() {
            let [batch, ..] = buffers.keys.dims();
            if let Some(&row) = rows.iter().find(|&&row| row >= batch) {
                return Err(AttentionError::Shape {
                    tensor: "key",
                    actual: buffers.keys.dims().to_vec(),
                    expected: format!("a batch holding row {row}"),
                });
            }
            let index = Tensor::<B, 1, Int>::from_data(
                TensorData::new(
                    rows.iter().map(|&r| r as i64).collect::<Vec<_>>(),
                    [rows.len()],
                ),
                &buffers.keys.device(),
            );
            buffers.keys = buffers.keys.clone().select(0, index.clone());
            buffers.values = buffers.values.clone().select(0, index);
        }
        Ok(())
    }

    /// Bytes of key and value storage allocated (the buffers' full capacity, not just the valid positions).
    pub fn allocated_bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|buffers| {
                let bytes =
                    |t: &Tensor<B, 4>| t.dims().iter().product::<usize>() * t.dtype().size();
                bytes(&buffers.keys) + bytes(&buffers.values)
            })
            .sum()
    }
}

impl<B: EmberBackend> KvCache<B> for ContiguousKvCache<B> {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn len(&self) -> usize {
        self.layers
            .iter()
            .map(|layer| layer.as_ref().map_or(0, |buffers| buffers.len))
            .min()
            .unwrap_or(0)
    }

    fn append(
        &mut self,
        layer: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Result<(Tensor<B, 4>, Tensor<B, 4>), AttentionError> {
        let num_layers = self.layers.len();
        let initial_capacity = self.initial_capacity;
        let slot = self
            .layers
            .get_mut(layer)
            .ok_or(AttentionError::CacheLayer { layer, num_layers })?;
        let [batch, heads, new, k_dim] = k.dims();
        let [v_batch, v_heads, v_new, v_dim] = v.dims();
        if [v_batch, v_heads, v_new] != [batch, heads, new] {
            return Err(AttentionError::Shape {
                tensor: "value",
                actual: v.dims().to_vec(),
                expected: format!("[{batch}, {heads}, {new}, v_dim] like the keys"),
            });
        }
        let buffers = match slot.take() {
            Some(buffers) if buffers.len > 0 => {
                let [b, h, _, d] = buffers.keys.dims();
                let vd = buffers.values.dims()[3];
                if [b, h, d, vd] != [batch, heads, k_dim, v_dim] {
                    let expected = format!(
                        "[{b}, {h}, new, {d}] (values [.., {vd}]) as cached in layer {layer}"
                    );
                    *slot = Some(buffers);
                    return Err(AttentionError::Shape {
                        tensor: "key",
                        actual: k.dims().to_vec(),
                        expected,
                    });
                }
                buffers
            }
            // Empty (new, reset or truncated to 0): adopt whatever shape arrives.
            _ => LayerBuffers {
                keys: Tensor::zeros(
                    [batch, heads, initial_capacity, k_dim],
                    (&k.device(), k.dtype()),
                ),
                values: Tensor::zeros(
                    [batch, heads, initial_capacity, v_dim],
                    (&v.device(), v.dtype()),
                ),
                len: 0,
            },
        };
        let buffers = append_to(buffers, k, v);
        let end = buffers.len;
        let keys = buffers
            .keys
            .clone()
            .slice([0..batch, 0..heads, 0..end, 0..k_dim]);
        let values = buffers
            .values
            .clone()
            .slice([0..batch, 0..heads, 0..end, 0..v_dim]);
        *slot = Some(buffers);
        Ok((keys, values))
    }

    fn truncate(&mut self, len: usize) {
        for buffers in self.layers.iter_mut().flatten() {
            buffers.len = buffers.len.min(len);
        }
    }

    fn reset(&mut self) {
        self.layers.iter_mut().for_each(|slot| *slot = None);
    }
}

/// Writes `k`, `v` after the valid positions, doubling the capacity first if they do not fit.
fn append_to<B: EmberBackend>(
    buffers: LayerBuffers<B>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> LayerBuffers<B> {
    let [batch, heads, new, k_dim] = k.dims();
    let v_dim = v.dims()[3];
    let LayerBuffers {
        mut keys,
        mut values,
        len,
    } = buffers;
    let capacity = keys.dims()[2];
    let end = len + new;
    if end > capacity {
        let grown = end.max(2 * capacity);
        let grow = |buffer: Tensor<B, 4>, dim: usize| {
            let extra = Tensor::zeros(
                [batch, heads, grown - len, dim],
                (&buffer.device(), buffer.dtype()),
            );
            let valid = buffer.slice([0..batch, 0..heads, 0..len, 0..dim]);
            Tensor::cat(vec![valid, extra], 2)
        };
        keys = grow(keys, k_dim);
        values = grow(values, v_dim);
    }
    LayerBuffers {
        keys: write_block(keys, [0..batch, 0..heads, len..end, 0..k_dim], k),
        values: write_block(values, [0..batch, 0..heads, len..end, 0..v_dim], v),
        len: end,
    }
}
