//! [`TrainData`] over chat rows: one conversation per row of `block_size + 1` tokens, right-padded, its
//! untrained positions marked with [`NO_LOSS`] (see `ember_dataset::chat_row`).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use ember_dataset::NO_LOSS;

use crate::model_io::{BoxError, TrainData};

/// Training batches of rows drawn uniformly (with replacement) by a ChaCha8 generator keyed by the seed, on
/// stream `batch index`, so the position in the sequence is the whole reader state; validation batches are the
/// validation rows in order, `batch_size` at a time (the last batch may be short).
#[derive(Debug, Clone)]
pub struct ChatData {
    train: Vec<u32>,
    validation: Vec<Vec<u32>>,
    width: usize,
    batch_size: usize,
    state: ChatReaderState,
    bytes_per_token: f64,
}

/// Where a [`ChatData`] reader stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct ChatReaderState {
    seed: u64,
    rows: usize,
    next_batch: u64,
}

impl ChatData {
    /// The reader over `train` and `val` rows (each `block_size + 1` tokens), keeping at most `eval_batches`
    /// validation batches.
    pub fn new(
        train: Vec<Vec<u32>>,
        val: Vec<Vec<u32>>,
        batch_size: usize,
        block_size: usize,
        eval_batches: usize,
        seed: u64,
    ) -> Result<Self, BoxError> {
        let width = block_size + 1;
        if train.is_empty() {
            return Err("the chat data has no training conversation".into());
        }
        if let Some(row) = train.iter().chain(&val).find(|r| r.len() != width) {
            return Err(format!(
                "a chat row has {} tokens, expected block_size + 1 = {width}",
                row.len()
            )
            .into());
        }
        let validation = val
            .chunks(batch_size.max(1))
            .take(eval_batches)
            .map(|rows| rows.concat())
            .collect();
        Ok(ChatData {
            state: ChatReaderState {
                seed,
                rows: train.len(),
                next_batch: 0,
            },
            train: train.concat(),
            validation,
            width,
            batch_size,
            bytes_per_token: 1.0,
        })
    }

    /// Sets the bytes per token used for bits per byte from `bytes_of` (the UTF-8 length of the decoded text of
    /// some token ids), over the validation rows' trained targets: the assistant's replies.
    pub fn bytes_per_token_of(mut self, bytes_of: impl Fn(&[u32]) -> usize) -> Self {
        let targets: Vec<u32> = self
            .validation
            .iter()
            .flat_map(|rows| rows.chunks_exact(self.width))
            .flat_map(|row| row[1..].iter().copied())
            .filter(|t| t & NO_LOSS == 0)
            .collect();
        let bytes = bytes_of(&targets);
        if !targets.is_empty() && bytes > 0 {
            self.bytes_per_token = bytes as f64 / targets.len() as f64;
        }
        self
    }
}

impl TrainData for ChatData {
    fn next_batch(&mut self) -> Result<Vec<u32>, BoxError> {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&self.state.seed.to_le_bytes());
        let mut rng = ChaCha8Rng::from_seed(key);
        rng.set_stream(self.state.next_batch);
        self.state.next_batch += 1;
        let mut rows = Vec::with_capacity(self.batch_size * self.width);
        for _ in 0..self.batch_size {
            let r = rng.random_range(0..self.state.rows);
            rows.extend_from_slice(&self.train[r * self.width..(r + 1) * self.width]);
        }
        Ok(rows)
    }

    fn validation_batches(&mut self) -> Result<Vec<Vec<u32>>, BoxError> {
        Ok(self.validation.clone())
    }

    fn bytes_per_token(&self) -> f64 {
        self.bytes_per_token
    }

    fn state(&self) -> serde_json::Value {
        serde_json::to_value(self.state).unwrap_or_default()
    }

    fn restore(&mut self, state: &serde_json::Value) -> Result<(), BoxError> {
        let state: ChatReaderState = serde_json::from_value(state.clone())
            .map_err(|e| format!("the checkpoint's reader state is not a chat reader's: {e}"))?;
        if state.rows != self.state.rows {
            return Err(format!(
                "the checkpoint was trained on {} chat conversations, the data now holds {}",
                state.rows, self.state.rows
            )
            .into());
        }
        self.state = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize, width: usize) -> Vec<Vec<u32>> {
        (0..n)
            .map(|i| (0..width as u32).map(|t| t + 100 * i as u32).collect())
            .collect()
    }

    #[test]
    fn batches_are_whole_rows_and_resume_exactly() {
        let mut data = ChatData::new(rows(5, 4), rows(3, 4), 2, 3, 10, 7).unwrap();
        let first: Vec<Vec<u32>> = (0..3).map(|_| data.next_batch().unwrap()).collect();
        for batch in &first {
            assert_eq!(batch.len(), 8);
            for row in batch.chunks_exact(4) {
                assert_eq!(
                    row[0] % 100,
                    0,
                    "a batch row starts mid-conversation: {row:?}"
                );
            }
        }
        let saved = data.state();
        let next = data.next_batch().unwrap();
        let mut resumed = ChatData::new(rows(5, 4), rows(3, 4), 2, 3, 10, 7).unwrap();
        resumed.restore(&saved).unwrap();
        assert_eq!(resumed.next_batch().unwrap(), next);
        // Validation: 3 rows in batches of 2, the last one short.
        let val = data.validation_batches().unwrap();
        assert_eq!(val.iter().map(Vec::len).collect::<Vec<_>>(), [8, 4]);
        let mut other = ChatData::new(rows(4, 4), rows(3, 4), 2, 3, 10, 7).unwrap();
        let err = other.restore(&saved).unwrap_err().to_string();
        assert!(
            err.contains("5 chat conversations") && err.contains("4"),
            "{err}"
        );
    }

    #[test]
    fn bytes_per_token_counts_only_trained_targets() {
        // Targets 1 (trained) and 2 | NO_LOSS; the decoder sees only the trained ones.
        let val = vec![vec![NO_LOSS, 1, 2 | NO_LOSS]];
        let data = ChatData::new(rows(1, 3), val, 1, 2, 1, 0)
            .unwrap()
            .bytes_per_token_of(|ids| {
                assert_eq!(ids, [1]);
                5
            });
        assert_eq!(data.bytes_per_token(), 5.0);
        assert!(ChatData::new(vec![vec![1, 2]], vec![], 1, 2, 1, 0).is_err());
    }
}
