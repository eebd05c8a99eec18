//! An in-memory [`TrainData`]: random training windows from one token array, fixed validation windows from another.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::model_io::{BoxError, TrainData};

/// Token windows sampled from in-memory splits with a seeded ChaCha8 generator, whose stream position is the whole
/// reader state (so a checkpoint restores the exact sequence of batches).
#[derive(Debug, Clone)]
pub struct InMemoryData {
    train: Vec<u32>,
    val: Vec<u32>,
    batch_size: usize,
    block_size: usize,
    eval_batches: usize,
    bytes_per_token: f64,
    seed: u64,
    rng: ChaCha8Rng,
}

impl InMemoryData {
    /// Windows of `block_size + 1` tokens, `batch_size` per batch; validation uses the first
    /// `eval_batches * batch_size` non-overlapping windows of `val` (fewer if `val` is short).
    /// `bytes_per_token` is the validation split's text bytes divided by its token count.
    pub fn new(
        train: Vec<u32>,
        val: Vec<u32>,
        batch_size: usize,
        block_size: usize,
        eval_batches: usize,
        bytes_per_token: f64,
        seed: u64,
    ) -> Result<Self, BoxError> {
        if train.len() <= block_size + 1 {
            return Err(format!(
                "the training split has {} tokens, fewer than one window of block_size + 1 = {}",
                train.len(),
                block_size + 1
            )
            .into());
        }
        Ok(InMemoryData {
            train,
            val,
            batch_size,
            block_size,
            eval_batches,
            bytes_per_token,
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }
}

impl TrainData for InMemoryData {
    fn next_batch(&mut self) -> Result<Vec<u32>, BoxError> {
        let width = self.block_size + 1;
        let mut rows = Vec::with_capacity(self.batch_size * width);
        for _ in 0..self.batch_size {
            let start = self.rng.random_range(0..=self.train.len() - width);
            rows.extend_from_slice(&self.train[start..start + width]);
        }
        Ok(rows)
    }

    fn validation_batches(&mut self) -> Result<Vec<Vec<u32>>, BoxError> {
        let width = self.block_size + 1;
        let windows: Vec<&[u32]> = self
            .val
            .chunks_exact(width)
            .take(self.eval_batches * self.batch_size)
            .collect();
        Ok(windows
            .chunks_exact(self.batch_size)
            .map(|batch| batch.concat())
            .collect())
    }

    fn bytes_per_token(&self) -> f64 {
        self.bytes_per_token
    }

    fn state(&self) -> serde_json::Value {
        serde_json::json!({ "seed": self.seed, "word_pos": self.rng.get_word_pos().to_string() })
    }

    fn restore(&mut self, state: &serde_json::Value) -> Result<(), BoxError> {
        let seed = state["seed"].as_u64().ok_or("data state: `seed` missing")?;
        let word_pos: u128 = state["word_pos"]
            .as_str()
            .ok_or("data state: `word_pos` missing")?
            .parse()?;
        self.seed = seed;
        self.rng = ChaCha8Rng::seed_from_u64(seed);
        self.rng.set_word_pos(word_pos);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restoring_a_state_replays_the_same_batches() {
        let tokens: Vec<u32> = (0..1000).collect();
        let mut a = InMemoryData::new(tokens.clone(), tokens.clone(), 4, 8, 2, 4.0, 7).unwrap();
        a.next_batch().unwrap();
        let saved = a.state();
        let expected: Vec<Vec<u32>> = (0..3).map(|_| a.next_batch().unwrap()).collect();
        let mut b = InMemoryData::new(tokens.clone(), tokens, 4, 8, 2, 4.0, 99).unwrap();
        b.restore(&saved).unwrap();
        let replayed: Vec<Vec<u32>> = (0..3).map(|_| b.next_batch().unwrap()).collect();
        assert_eq!(replayed, expected);
    }

    #[test]
    fn validation_windows_are_fixed_and_contiguous() {
        let tokens: Vec<u32> = (0..100).collect();
        let mut data = InMemoryData::new(tokens.clone(), tokens, 2, 4, 3, 4.0, 1).unwrap();
        let batches = data.validation_batches().unwrap();
        assert_eq!(batches.len(), 3);
        assert_eq!(batches[0], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(data.validation_batches().unwrap(), batches);
    }
}
