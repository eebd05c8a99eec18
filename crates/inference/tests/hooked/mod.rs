//! A model that runs a hook before each step, to hold a step back or fail it: what the scheduler's and the
//! server's tests use to reach a failed or a slow step without a broken model. Shared by path
//! (`#[path = "../../inference/tests/hooked/mod.rs"]`), as `ember-tokenizer`'s JSON mutator is.

use ember_inference::{InferenceError, PooledDecoder};
use ember_optimization::{PagedKvPool, SeqId};

/// `inner` with `before_step` run ahead of each of its steps, given the step's tokens per row: its error fails
/// the step before `inner` runs.
pub struct Hooked<M, F> {
    pub inner: M,
    pub before_step: F,
}

impl<M, F> PooledDecoder for Hooked<M, F>
where
    M: PooledDecoder,
    F: Fn(&[Vec<u32>]) -> Result<(), InferenceError>,
{
    type Backend = M::Backend;

    fn context_length(&self) -> usize {
        self.inner.context_length()
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn new_pool(
        &self,
        block_size: usize,
        budget_bytes: usize,
    ) -> Result<PagedKvPool<M::Backend>, InferenceError> {
        self.inner.new_pool(block_size, budget_bytes)
    }

    fn step_pooled(
        &self,
        pool: &mut PagedKvPool<M::Backend>,
        seqs: &[SeqId],
        tokens: &[Vec<u32>],
    ) -> Result<Vec<Vec<f32>>, InferenceError> {
        (self.before_step)(tokens)?;
        self.inner.step_pooled(pool, seqs, tokens)
    }
}
