//! [`Decoder`] for ember's [`Transformer`]: per-row positions and a key padding mask for left-padded
//! batches, over a contiguous KV cache or the paged block pool.

use burn::tensor::{Bool, Int, Tensor, TensorData};
use ember_attention::{AttentionError, ContiguousKvCache, KvCache};
use ember_model::{EmberBackend, ModelError, Step, Transformer};
use ember_optimization::{PagedKvConfig, PagedKvPool, SeqId};

use crate::error::InferenceError;
use crate::model::{Decoder, PooledDecoder};

/// Where a batch keeps its keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvCacheKind {
    /// One buffer per layer for the whole batch, `[batch, kv_heads, positions, head_dim]`, growing by doubling;
    /// shorter prompts are left-padded to the longest.
    #[default]
    Contiguous,
    /// The paged block pool of `ember-optimization`: each row stores only its own tokens, in blocks of
    /// `block_size` positions allocated as it grows and released when it finishes. The pool's storage grows by
    /// doubling up to `budget_bytes` (default: what a contiguous cache of the whole context would take for the
    /// batch); a batch that outgrows the budget fails with the pool's message.
    Paged {
        /// Positions per block.
        block_size: usize,
        /// Hard cap on the bytes of K/V storage.
        budget_bytes: Option<usize>,
    },
}

impl KvCacheKind {
    /// Paged with 16-position blocks and the default budget.
    pub fn paged() -> Self {
        Self::Paged {
            block_size: 16,
            budget_bytes: None,
        }
    }

    /// The same kind with a hard budget of `bytes` (paged only; a contiguous cache has no budget).
    pub fn with_budget_bytes(self, bytes: usize) -> Self {
        match self {
            Self::Paged { block_size, .. } => Self::Paged {
                block_size,
                budget_bytes: Some(bytes),
            },
            Self::Contiguous => Self::Contiguous,
        }
    }
}

impl std::fmt::Display for KvCacheKind {
    /// `contiguous`, `paged` (16-position blocks) or `paged-N`, the form [`FromStr`](std::str::FromStr) reads.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Contiguous => write!(f, "contiguous"),
            Self::Paged { block_size: 16, .. } => write!(f, "paged"),
            Self::Paged { block_size, .. } => write!(f, "paged-{block_size}"),
        }
    }
}

impl std::str::FromStr for KvCacheKind {
    type Err = String;

    /// `contiguous`, `paged`, or `paged-N` for blocks of `N` positions (the budget is set separately).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let expected = "expected contiguous, paged or paged-N (N positions per block, N >= 1)";
        match s {
            "contiguous" => Ok(Self::Contiguous),
            "paged" => Ok(Self::paged()),
            _ => match s.strip_prefix("paged-").map(str::parse::<usize>) {
                Some(Ok(block_size)) if block_size > 0 => Ok(Self::Paged {
                    block_size,
                    budget_bytes: None,
                }),
                _ => Err(format!("unknown KV cache `{s}`: {expected}")),
            },
        }
    }
}

/// A [`Transformer`] on a device, run step by step.
#[derive(Debug)]
pub struct TransformerLm<B: EmberBackend> {
    model: Transformer<B>,
    device: B::Device,
    cache: KvCacheKind,
}

/// The cache of a batch: keys and values of every layer and each row's next position (its count of real tokens,
/// so padding does not shift a row's positions).
#[derive(Debug)]
pub struct TransformerState<B: EmberBackend> {
    cache: Cache<B>,
    next_position: Vec<i64>,
}

#[derive(Debug)]
enum Cache<B: EmberBackend> {
    Contiguous {
        cache: ContiguousKvCache<B>,
        /// `[batch][positions]`, `true` = padding.
        padding: Vec<Vec<bool>>,
    },
    Paged {
        pool: PagedKvPool<B>,
        /// The pool sequence of every batch row.
        seqs: Vec<SeqId>,
    },
}

impl<B: EmberBackend> TransformerLm<B> {
    /// Wraps `model`, whose parameters live on `device`, with a contiguous KV cache.
    pub fn new(model: Transformer<B>, device: B::Device) -> Self {
        Self {
            model,
            device,
            cache: KvCacheKind::Contiguous,
        }
    }

    /// Uses `cache` for the batches generated from now on.
    pub fn with_kv_cache(mut self, cache: KvCacheKind) -> Self {
        self.cache = cache;
        self
    }

    /// The wrapped model.
    pub fn model(&self) -> &Transformer<B> {
        &self.model
    }

    /// The KV cache batches use.
    pub fn kv_cache(&self) -> KvCacheKind {
        self.cache
    }

    fn paged_pool(
        &self,
        batch: usize,
        block_size: usize,
        budget_bytes: Option<usize>,
    ) -> Result<PagedKvPool<B>, InferenceError> {
        let spec = self.model.spec();
        let config = PagedKvConfig::new(spec.num_layers, spec.num_kv_heads, spec.head_dim)
            .with_block_size(block_size)
            .with_initial_blocks(1);
        let elem_bytes = PagedKvPool::<B>::elem_bytes(&self.device);
        // Without a budget the pool may grow to what a contiguous cache would hold. It grows block by block, so
        // this is a cap, not an allocation: saturating keeps a huge batch times context a cap of "no limit".
        let contiguous_worst = batch
            .max(1)
            .saturating_mul(spec.context_length)
            .saturating_mul(config.token_bytes(elem_bytes));
        let config = config.with_budget_bytes(budget_bytes.unwrap_or(contiguous_worst));
        PagedKvPool::new(config, &self.device).map_err(kv_cache_error)
    }
}

fn kv_cache_error(e: impl std::error::Error + Send + Sync + 'static) -> InferenceError {
    InferenceError::KvCache(Box::new(e))
}

/// A model failure, with a KV cache that could not hold the batch (a paged pool out of budget) reported as such.
fn forward_error(e: ModelError) -> InferenceError {
    match e {
        ModelError::Attention(cache @ AttentionError::Cache(_)) => kv_cache_error(cache),
        other => InferenceError::Model(other),
    }
}

/// The batch's token ids as a device tensor.
fn token_tensor<B: EmberBackend>(tokens: &[Vec<u32>], device: &B::Device) -> Tensor<B, 2, Int> {
    let batch = tokens.len();
    let seq = tokens.first().map_or(0, Vec::len);
    let ids: Vec<i64> = tokens.iter().flatten().map(|&t| i64::from(t)).collect();
    Tensor::from_data(TensorData::new(ids, [batch, seq]), device)
}

impl<B: EmberBackend> Decoder for TransformerLm<B> {
    type State = TransformerState<B>;

    fn context_length(&self) -> usize {
        self.model.spec().context_length
    }

    fn new_state(&self, batch: usize) -> Result<Self::State, InferenceError> {
        let cache = match self.cache {
            KvCacheKind::Contiguous => Cache::Contiguous {
                cache: ContiguousKvCache::new(self.model.spec().num_layers),
                padding: vec![Vec::new(); batch],
            },
            KvCacheKind::Paged {
                block_size,
                budget_bytes,
            } => {
                let mut pool = self.paged_pool(batch, block_size, budget_bytes)?;
                let seqs = (0..batch).map(|_| pool.add_sequence()).collect();
                Cache::Paged { pool, seqs }
            }
        };
        Ok(TransformerState {
            cache,
            next_position: vec![0; batch],
        })
    }

    fn state_len(&self, state: &Self::State) -> usize {
        match &state.cache {
            Cache::Contiguous { cache, .. } => cache.len(),
            Cache::Paged { .. } => state.next_position.iter().copied().max().unwrap_or(0) as usize,
        }
    }

    fn step(
        &self,
        state: &mut Self::State,
        tokens: &[Vec<u32>],
        padding: &[Vec<bool>],
    ) -> Result<Vec<Vec<f32>>, InferenceError> {
        let flat: Vec<u32> = tokens.iter().flatten().copied().collect();
        self.model.check_tokens(&flat)?;
        let ids = token_tensor::<B>(tokens, &self.device);
        let logits = match &mut state.cache {
            Cache::Contiguous {
                cache,
                padding: held,
            } => step_contiguous(
                &self.model,
                &self.device,
                cache,
                held,
                &mut state.next_position,
                ids,
                padding,
            )?,
            Cache::Paged { pool, seqs } => step_paged(
                &self.model,
                &self.device,
                pool,
                seqs,
                &mut state.next_position,
                ids,
                padding,
            )?,
        };
        logit_rows(logits)
    }

    fn retain_rows(&self, state: &mut Self::State, rows: &[usize]) -> Result<(), InferenceError> {
        let batch = state.next_position.len();
        if let Some(&row) = rows.iter().find(|&&row| row >= batch) {
            return Err(InferenceError::InvalidBatch(format!(
                "cannot keep row {row} of a batch of {batch}"
            )));
        }
        let keep = |row: usize| rows.contains(&row);
        match &mut state.cache {
            Cache::Contiguous { cache, padding } => {
                cache
                    .retain_rows(rows)
                    .map_err(|e| InferenceError::Model(e.into()))?;
                *padding = rows
                    .iter()
                    .map(|&r| std::mem::take(&mut padding[r]))
                    .collect();
            }
            Cache::Paged { pool, seqs } => {
                for (row, &seq) in seqs.iter().enumerate() {
                    if !keep(row) {
                        pool.free_sequence(seq).map_err(kv_cache_error)?;
                    }
                }
                *seqs = rows.iter().map(|&r| seqs[r]).collect();
            }
        }
        state.next_position = rows.iter().map(|&r| state.next_position[r]).collect();
        Ok(())
    }

    fn cache_bytes(&self, state: &Self::State) -> usize {
        match &state.cache {
            Cache::Contiguous { cache, .. } => cache.allocated_bytes(),
            Cache::Paged { pool, .. } => pool.allocated_bytes(),
        }
    }
}

impl<B: EmberBackend> PooledDecoder for TransformerLm<B> {
    type Backend = B;

    fn context_length(&self) -> usize {
        self.model.spec().context_length
    }

    fn vocab_size(&self) -> usize {
        self.model.spec().vocab_size
    }

    fn new_pool(
        &self,
        block_size: usize,
        budget_bytes: usize,
    ) -> Result<PagedKvPool<B>, InferenceError> {
        self.paged_pool(1, block_size, Some(budget_bytes))
    }

    fn step_pooled(
        &self,
        pool: &mut PagedKvPool<B>,
        seqs: &[SeqId],
        tokens: &[Vec<u32>],
    ) -> Result<Vec<Vec<f32>>, InferenceError> {
        let seq = tokens.iter().map(Vec::len).max().unwrap_or(0);
        if tokens.len() != seqs.len() || tokens.iter().any(Vec::is_empty) {
            return Err(InferenceError::InvalidBatch(format!(
                "{} sequences and {} token rows: expected one non-empty row per sequence",
                seqs.len(),
                tokens.len()
            )));
        }
        let flat: Vec<u32> = tokens.iter().flatten().copied().collect();
        self.model.check_tokens(&flat)?;
        let mut next_position = seqs
            .iter()
            .map(|&s| pool.seq_len(s).map(|len| len as i64))
            .collect::<Result<Vec<_>, _>>()
            .map_err(kv_cache_error)?;
        // Shorter rows are left-padded to the longest: the padding is neither stored nor attended to.
        let padded: Vec<Vec<u32>> = tokens
            .iter()
            .map(|t| {
                let mut row = vec![0; seq - t.len()];
                row.extend_from_slice(t);
                row
            })
            .collect();
        let padding: Vec<Vec<bool>> = tokens
            .iter()
            .map(|t| (0..seq).map(|i| i < seq - t.len()).collect())
            .collect();
        let ids = token_tensor::<B>(&padded, &self.device);
        let logits = step_paged(
            &self.model,
            &self.device,
            pool,
            seqs,
            &mut next_position,
            ids,
            &padding,
        )?;
        logit_rows(logits)
    }
}

/// `[batch, vocab]` logits as one vector per row.
fn logit_rows<B: EmberBackend>(logits: Tensor<B, 2>) -> Result<Vec<Vec<f32>>, InferenceError> {
    let [_, vocab] = logits.dims();
    let last: Vec<f32> = logits
        .into_data()
        .convert::<f32>()
        .into_vec()
        .map_err(|e| InferenceError::Backend(format!("reading the logits back: {e:?}")))?;
    Ok(last.chunks(vocab).map(<[f32]>::to_vec).collect())
}

/// One step over the contiguous cache: every row holds the same number of positions, padding included.
fn step_contiguous<B: EmberBackend>(
    model: &Transformer<B>,
    device: &B::Device,
    cache: &mut ContiguousKvCache<B>,
    held: &mut [Vec<bool>],
    next_position: &mut [i64],
    ids: Tensor<B, 2, Int>,
    padding: &[Vec<bool>],
) -> Result<Tensor<B, 2>, InferenceError> {
    let [batch, seq] = ids.dims();
    let mut positions = Vec::with_capacity(batch * seq);
    for (b, row_pad) in padding.iter().enumerate() {
        for &pad in row_pad {
            // A padding position is never attended to; position 0 keeps it inside every rotary table.
            positions.push(if pad { 0 } else { next_position[b] });
            if !pad {
                next_position[b] += 1;
            }
        }
        held[b].extend_from_slice(row_pad);
    }
    let step = if held.iter().flatten().any(|&p| p) {
        let total = held[0].len();
        let mask: Vec<bool> = held.iter().flatten().copied().collect();
        Step {
            cache: Some(cache as &mut dyn KvCache<B>),
            positions: Some(Tensor::from_data(
                TensorData::new(positions, [batch, seq]),
                device,
            )),
            key_padding: Some(Tensor::<B, 2, Bool>::from_data(
                TensorData::new(mask, [batch, total]),
                device,
            )),
        }
    } else {
        // Without padding every row's positions continue from the cache length, the model's default.
        Step {
            cache: Some(cache as &mut dyn KvCache<B>),
            positions: None,
            key_padding: None,
        }
    };
    model.forward_last(ids, step).map_err(forward_error)
}

/// One step over the paged pool: each row stores only its real tokens, so rows hold different numbers of
/// positions. The pool's view right-aligns them on a common axis of `longest + seq` positions; each row's leading
/// gap is masked as key padding.
fn step_paged<B: EmberBackend>(
    model: &Transformer<B>,
    device: &B::Device,
    pool: &mut PagedKvPool<B>,
    seqs: &[SeqId],
    next_position: &mut [i64],
    ids: Tensor<B, 2, Int>,
    padding: &[Vec<bool>],
) -> Result<Tensor<B, 2>, InferenceError> {
    let [batch, seq] = ids.dims();
    let mut skip = Vec::with_capacity(batch);
    for (b, row_pad) in padding.iter().enumerate() {
        let leading = row_pad.iter().take_while(|&&p| p).count();
        if row_pad[leading..].iter().any(|&p| p) {
            return Err(InferenceError::InvalidBatch(format!(
                "row {b}: the paged KV cache takes padding only before a row's tokens (left padding)"
            )));
        }
        skip.push(leading);
    }
    let before = next_position.iter().copied().max().unwrap_or(0) as usize;
    let width = before + seq;
    let mut positions = Vec::with_capacity(batch * seq);
    let mut mask = Vec::with_capacity(batch * width);
    for b in 0..batch {
        let start = next_position[b];
        positions.extend((0..seq).map(|t| {
            if t < skip[b] {
                0
            } else {
                start + (t - skip[b]) as i64
            }
        }));
        next_position[b] += (seq - skip[b]) as i64;
        let gap = width - next_position[b] as usize;
        mask.extend((0..width).map(|t| t < gap));
    }
    let key_padding = mask
        .iter()
        .any(|&m| m)
        .then(|| Tensor::<B, 2, Bool>::from_data(TensorData::new(mask, [batch, width]), device));
    let mut view = pool
        .cache(seqs.to_vec())
        .map_err(kv_cache_error)?
        .with_leading_padding(skip);
    let step = Step {
        cache: Some(&mut view as &mut dyn KvCache<B>),
        positions: Some(Tensor::from_data(
            TensorData::new(positions, [batch, seq]),
            device,
        )),
        key_padding,
    };
    model.forward_last(ids, step).map_err(forward_error)
}
