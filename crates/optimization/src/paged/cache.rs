//! [`PagedKvCache`]: the attention crate's [`KvCache`] trait over a [`PagedKvPool`].

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use ember_attention::{Appended, AttentionError, AttentionOptions, EmberBackend, KvCache};

use crate::error::PoolError;
use crate::paged::blocks::SeqId;
use crate::paged::pool::PagedKvPool;

/// A batch of pool sequences seen as one [`KvCache`]: batch row `i` is sequence `i`.
///
/// Appends write through the block tables and return K/V gathered back through them, so a model
/// decodes against the pool exactly as against a [`ember_attention::ContiguousKvCache`].
///
/// Rows may hold different numbers of positions (a batch of prompts of different lengths, each
/// stored without padding). The view then behaves like a left-padded contiguous batch: its
/// [`len`](KvCache::len) is the longest row's, appends return every row right-aligned on that
/// common position axis, and the caller masks each row's leading padding (`width - seq_len` keys)
/// as key padding. [`with_leading_padding`](Self::with_leading_padding) tells the next step which
/// leading positions of each row's new tokens are padding, so they are never stored.
#[derive(Debug)]
pub struct PagedKvCache<'pool, B: Backend> {
    pool: &'pool mut PagedKvPool<B>,
    seqs: Vec<SeqId>,
    /// Per row: leading positions of the next appends that are padding and are not stored.
    skip: Vec<usize>,
}

impl<B: EmberBackend> PagedKvPool<B> {
    /// A [`KvCache`] over `seqs` (e.g. forks of one prompt, or the rows of a batch). With no
    /// sequences, the first append creates one per batch row.
    pub fn cache(&mut self, seqs: Vec<SeqId>) -> Result<PagedKvCache<'_, B>, PoolError> {
        for &seq in &seqs {
            self.seq_len(seq)?;
        }
        Ok(PagedKvCache {
            pool: self,
            seqs,
            skip: Vec::new(),
        })
    }
}

impl<B: Backend> PagedKvCache<'_, B> {
    /// The sequences behind the batch rows.
    pub fn sequences(&self) -> &[SeqId] {
        &self.seqs
    }

    /// Marks the first `skip[row]` positions of every following append as padding of that row
    /// (left padding of a batched prompt): they are dropped instead of stored. Missing rows skip
    /// nothing.
    pub fn with_leading_padding(mut self, skip: Vec<usize>) -> Self {
        self.skip = skip;
        self
    }
}

impl<B: EmberBackend> PagedKvCache<'_, B> {
    /// Whether every row stores all of a step's new positions (no leading padding to drop).
    fn unpadded(&self) -> bool {
        self.skip.iter().all(|&s| s == 0)
    }

    /// Writes each row's new keys and values (its leading padding dropped) into `layer`; returns the width of
    /// the common position axis after the append (the longest row so far plus the new tokens).
    fn store(
        &mut self,
        layer: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Result<usize, AttentionError> {
        let num_layers = self.pool.config().num_layers;
        if layer >= num_layers {
            return Err(AttentionError::CacheLayer { layer, num_layers });
        }
        let [batch, heads, new, k_dim] = k.dims();
        let [_, v_heads, _, v_dim] = v.dims();
        if self.seqs.is_empty() {
            self.seqs = (0..batch).map(|_| self.pool.add_sequence()).collect();
        }
        if batch != self.seqs.len() {
            return Err(AttentionError::Shape {
                tensor: "key",
                actual: k.dims().to_vec(),
                expected: format!("batch {} (one row per cached sequence)", self.seqs.len()),
            });
        }
        let width = self
            .seqs
            .iter()
            .map(|&seq| self.pool.blocks().layer_len(seq, layer))
            .collect::<Result<Vec<_>, _>>()
            .map_err(cache_error)?
            .into_iter()
            .max()
            .unwrap_or(0)
            + new;
        if self.unpadded() {
            // Every row stores all its new positions: one write per storage tensor for the whole batch.
            self.pool
                .append_rows(&self.seqs, layer, k, v)
                .map_err(cache_error)?;
            return Ok(width);
        }
        for (row, &seq) in self.seqs.iter().enumerate() {
            let skip = self.skip.get(row).copied().unwrap_or(0).min(new);
            if skip == new {
                continue;
            }
            let kept = new - skip;
            let k_row = k
                .clone()
                .slice([row..row + 1, 0..heads, skip..new, 0..k_dim])
                .reshape([heads, kept, k_dim]);
            let v_row = v
                .clone()
                .slice([row..row + 1, 0..v_heads, skip..new, 0..v_dim])
                .reshape([v_heads, kept, v_dim]);
            self.pool
                .append(seq, layer, k_row, v_row)
                .map_err(cache_error)?;
        }
        Ok(width)
    }
}

/// New positions per row up to which an append attends over the pool's blocks in place: a decode step (or a
/// few tokens), where a gathered copy of every row's keys had cost more than the attention itself. Longer runs
/// (prompts) take the gathered copy and the flash kernel's gemm.
const IN_PLACE_QUERIES: usize = 4;

impl<B: EmberBackend> KvCache<B> for PagedKvCache<'_, B> {
    fn num_layers(&self) -> usize {
        self.pool.config().num_layers
    }

    fn len(&self) -> usize {
        let layers = self.pool.config().num_layers;
        // The longest row, counting only positions every layer of it holds (mid-step, earlier
        // layers are ahead).
        self.seqs
            .iter()
            .map(|&seq| {
                (0..layers)
                    .map(|layer| self.pool.blocks().layer_len(seq, layer).unwrap_or(0))
                    .min()
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }

    fn append(
        &mut self,
        layer: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Result<(Tensor<B, 4>, Tensor<B, 4>), AttentionError> {
        let width = self.store(layer, k, v)?;
        let gathered = self
            .pool
            .gather_padded(&self.seqs, layer, width)
            .map_err(cache_error)?;
        Ok((gathered.keys, gathered.values))
    }

    fn append_attend(
        &mut self,
        layer: usize,
        q: &Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        options: &AttentionOptions<B>,
    ) -> Result<Appended<B>, AttentionError> {
        let new = k.dims()[2];
        let width = self.store(layer, k, v)?;
        // Leading padding of this step's tokens is not stored, so the queries would not be each row's last
        // positions: those steps (batched prompts) take the gathered copy.
        if new <= IN_PLACE_QUERIES && self.unpadded() {
            let attended = self
                .pool
                .attend(&self.seqs, layer, q, options)
                .map_err(cache_error)?;
            if let Some(out) = attended {
                return Ok(Appended::Attended(out));
            }
        }
        let gathered = self
            .pool
            .gather_padded(&self.seqs, layer, width)
            .map_err(cache_error)?;
        Ok(Appended::Keys {
            keys: gathered.keys,
            values: gathered.values,
        })
    }

    fn truncate(&mut self, len: usize) {
        for &seq in &self.seqs {
            // Sequences of this view are live by construction; nothing to report otherwise.
            let _ = self.pool.truncate(seq, len);
        }
    }

    fn reset(&mut self) {
        for seq in self.seqs.drain(..) {
            let _ = self.pool.free_sequence(seq);
        }
    }
}

fn cache_error(err: PoolError) -> AttentionError {
    AttentionError::Cache(err.to_string())
}
