//! The interface generation needs from a model: run a batch of new tokens over a KV cache, return the logits of
//! each row's last position.

use ember_attention::EmberBackend;
use ember_optimization::{PagedKvPool, SeqId};

use crate::error::InferenceError;

/// A causal language model that runs incrementally over a batch, its KV cache kept in [`Decoder::State`].
///
/// Rows may be left-padded: a padded position is never attended to, so a row's logits do not depend on how much
/// padding precedes it.
pub trait Decoder {
    /// The per-batch cache (keys and values of every position run so far, and which of them are padding).
    type State;

    /// The number of positions the model can attend over (prompt plus generated tokens).
    fn context_length(&self) -> usize;

    /// An empty cache for `batch` rows.
    fn new_state(&self, batch: usize) -> Result<Self::State, InferenceError>;

    /// Positions already in `state` (padding included).
    fn state_len(&self, state: &Self::State) -> usize;

    /// Appends `tokens` (`[batch][seq]`, every row the same length) to `state` and returns the next-token logits at
    /// the last position of every row, `[batch][vocab]`. `padding[b][t]` marks `tokens[b][t]` as padding.
    fn step(
        &self,
        state: &mut Self::State,
        tokens: &[Vec<u32>],
        padding: &[Vec<bool>],
    ) -> Result<Vec<Vec<f32>>, InferenceError>;

    /// Keeps only the batch rows listed in `rows` (ascending), dropping the others' cached positions: generation
    /// calls it when rows finish, so they stop costing compute and cache memory. Later steps pass one row per kept
    /// row, in this order.
    fn retain_rows(&self, state: &mut Self::State, rows: &[usize]) -> Result<(), InferenceError>;

    /// Bytes of cache storage `state` holds now (0 where the model does not say).
    fn cache_bytes(&self, _state: &Self::State) -> usize {
        0
    }
}

/// A causal language model whose KV cache lives in one shared [`PagedKvPool`] of sequences: what continuous
/// batching needs, since a request joins and leaves the running batch between steps and may start from a prefix
/// another sequence already holds ([`PagedKvPool::fork`] + [`PagedKvPool::truncate`]).
pub trait PooledDecoder {
    /// The backend the pool's storage lives on.
    type Backend: EmberBackend;

    /// The number of positions the model can attend over (prompt plus generated tokens).
    fn context_length(&self) -> usize;

    /// Token ids are below this.
    fn vocab_size(&self) -> usize;

    /// An empty pool of `block_size`-position blocks holding at most `budget_bytes` of K/V (its storage grows on
    /// demand up to that).
    fn new_pool(
        &self,
        block_size: usize,
        budget_bytes: usize,
    ) -> Result<PagedKvPool<Self::Backend>, InferenceError>;

    /// Appends `tokens[i]` to sequence `seqs[i]` of `pool` and returns each row's next-token logits,
    /// `[rows][vocab]`. The rows may hold different numbers of positions and bring different numbers of tokens
    /// (at least one each): a batch of several requests' prompt chunks runs as one step.
    fn step_pooled(
        &self,
        pool: &mut PagedKvPool<Self::Backend>,
        seqs: &[SeqId],
        tokens: &[Vec<u32>],
    ) -> Result<Vec<Vec<f32>>, InferenceError>;
}
