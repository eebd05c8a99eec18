//! [`PagedKvCache`]: the attention crate's [`KvCache`] trait over a [`PagedKvPool`].

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use ember_attention::{AttentionError, KvCache};

use crate::error::PoolError;
use crate::paged::blocks::SeqId;
use crate::paged::pool::PagedKvPool;

/// A batch of pool sequences seen as one [`KvCache`]: batch row `i` is sequence `i`.
///
/// Appends write through the block tables and return K/V gathered back through them, so a model
/// decodes against the pool exactly as against a [`ember_attention::ContiguousKvCache`]. The
/// sequences must hold equally many positions (the trait has one length); ragged batches use
/// [`PagedKvPool::gather`] and its padding mask directly.
#[derive(Debug)]
pub struct PagedKvCache<'pool, B: Backend> {
    pool: &'pool mut PagedKvPool<B>,
    seqs: Vec<SeqId>,
}

impl<B: Backend> PagedKvPool<B> {
    /// A [`KvCache`] over `seqs` (e.g. forks of one prompt). With no sequences, the first append
    /// creates one per batch row.
    pub fn cache(&mut self, seqs: Vec<SeqId>) -> Result<PagedKvCache<'_, B>, PoolError> {
        let lens = seqs
            .iter()
            .map(|&seq| self.seq_len(seq))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(pos) = lens.iter().position(|&len| len != lens[0]) {
            return Err(PoolError::BadWrite {
                seq: seqs[pos].0,
                layer: 0,
                reason: format!(
                    "a cache view needs sequences of equal length, found {} and {}",
                    lens[0], lens[pos]
                ),
            });
        }
        Ok(PagedKvCache { pool: self, seqs })
    }
}

impl<B: Backend> PagedKvCache<'_, B> {
    /// The sequences behind the batch rows.
    pub fn sequences(&self) -> &[SeqId] {
        &self.seqs
    }
}

impl<B: Backend> KvCache<B> for PagedKvCache<'_, B> {
    fn num_layers(&self) -> usize {
        self.pool.config().num_layers
    }

    fn len(&self) -> usize {
        let layers = self.pool.config().num_layers;
        self.seqs
            .iter()
            .flat_map(|&seq| (0..layers).map(move |layer| (seq, layer)))
            .map(|(seq, layer)| self.pool.blocks().layer_len(seq, layer).unwrap_or(0))
            .min()
            .unwrap_or(0)
    }

    fn append(
        &mut self,
        layer: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Result<(Tensor<B, 4>, Tensor<B, 4>), AttentionError> {
        let num_layers = self.pool.config().num_layers;
        if layer >= num_layers {
            return Err(AttentionError::CacheLayer { layer, num_layers });
        }
        let [batch, heads, new, k_dim] = k.dims();
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
        for (row, &seq) in self.seqs.iter().enumerate() {
            let k_row = k.clone().narrow(0, row, 1).reshape([heads, new, k_dim]);
            let v_dims = v.dims();
            let v_row = v
                .clone()
                .narrow(0, row, 1)
                .reshape([v_dims[1], v_dims[2], v_dims[3]]);
            self.pool
                .append(seq, layer, k_row, v_row)
                .map_err(|err| pool_error(err, &k))?;
        }
        let gathered = self
            .pool
            .gather(&self.seqs, layer)
            .map_err(|err| pool_error(err, &k))?;
        Ok((gathered.keys, gathered.values))
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

/// The trait's error type has no pool variant; pool failures are reported against the key tensor
/// with the pool's full message.
fn pool_error<B: Backend>(err: PoolError, k: &Tensor<B, 4>) -> AttentionError {
    AttentionError::Shape {
        tensor: "key",
        actual: k.dims().to_vec(),
        expected: format!("a write the KV-cache pool accepts: {err}"),
    }
}
