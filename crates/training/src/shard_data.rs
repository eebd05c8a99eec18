//! [`TrainData`] over prepared ember-dataset shards: seeded random training windows, sequential validation windows.

use std::sync::Arc;

use ember_dataset::{Batch, EvalBatches, RandomBatches, ReaderState, TokenDataset};

use crate::model_io::{BoxError, TrainData};

/// Training batches from [`RandomBatches`] (resumable through its [`ReaderState`]) and a fixed prefix of the
/// validation split's sequential [`EvalBatches`].
pub struct ShardData {
    train_set: Arc<TokenDataset>,
    train: RandomBatches,
    validation: Vec<Vec<u32>>,
    bytes_per_token: f64,
}

impl ShardData {
    /// Reads `train` with seed `seed` and keeps the first `eval_batches` validation batches of `val`.
    /// `bytes_per_token` converts validation nats/token to bits/byte (see [`ShardData::bytes_per_token_of`]).
    pub fn new(
        train: Arc<TokenDataset>,
        val: Arc<TokenDataset>,
        batch_size: usize,
        block_size: usize,
        eval_batches: usize,
        seed: u64,
    ) -> Result<Self, BoxError> {
        let train_set = train;
        let train = RandomBatches::new(
            train_set.clone(),
            ReaderState::new(seed, batch_size, block_size),
        )?;
        let validation = EvalBatches::new(val, batch_size, block_size, 0, 1)?
            .take(eval_batches)
            .map(|batch| batch.map(|b| rows_of(&b)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ShardData {
            train_set,
            train,
            validation,
            bytes_per_token: 1.0,
        })
    }

    /// Sets the bytes per token used for bits per byte, computed by the caller with `bytes_of`, which returns the
    /// UTF-8 length of the decoded text of some token ids: the ratio over the validation targets.
    pub fn bytes_per_token_of(mut self, bytes_of: impl Fn(&[u32]) -> usize) -> Self {
        let (mut bytes, mut tokens) = (0usize, 0usize);
        for rows in &self.validation {
            let width = self.train.state().block_size + 1;
            for row in rows.chunks_exact(width) {
                bytes += bytes_of(&row[1..]);
                tokens += width - 1;
            }
        }
        if tokens > 0 && bytes > 0 {
            self.bytes_per_token = bytes as f64 / tokens as f64;
        }
        self
    }

    /// The bytes-per-token ratio in use.
    pub fn ratio(&self) -> f64 {
        self.bytes_per_token
    }
}

/// Rows `[batch, block + 1]`: each input row followed by the last target.
fn rows_of(batch: &Batch) -> Vec<u32> {
    let mut rows = Vec::with_capacity(batch.batch_size * (batch.block_size + 1));
    for (inputs, targets) in batch
        .inputs
        .chunks_exact(batch.block_size)
        .zip(batch.targets.chunks_exact(batch.block_size))
    {
        rows.extend_from_slice(inputs);
        rows.push(targets[batch.block_size - 1]);
    }
    rows
}

impl TrainData for ShardData {
    fn next_batch(&mut self) -> Result<Vec<u32>, BoxError> {
        Ok(rows_of(&self.train.next_batch()?))
    }

    fn validation_batches(&mut self) -> Result<Vec<Vec<u32>>, BoxError> {
        Ok(self.validation.clone())
    }

    fn bytes_per_token(&self) -> f64 {
        self.bytes_per_token
    }

    fn state(&self) -> serde_json::Value {
        serde_json::to_value(self.train.state()).unwrap_or_default()
    }

    fn restore(&mut self, state: &serde_json::Value) -> Result<(), BoxError> {
        let state: ReaderState = serde_json::from_value(state.clone())?;
        let current = self.train.state();
        if (state.batch_size, state.block_size) != (current.batch_size, current.block_size) {
            return Err(format!(
                "the checkpoint's reader has batch {} x block {}, the config batch {} x block {}",
                state.batch_size, state.block_size, current.batch_size, current.block_size
            )
            .into());
        }
        self.train = RandomBatches::new(self.train_set.clone(), state)?;
        Ok(())
    }
}
