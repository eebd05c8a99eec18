//! Training and evaluation batches drawn from a [`TokenDataset`].

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::dataset::TokenDataset;
use crate::error::{DatasetError, Result};

/// A batch of next-token-prediction examples, row-major `[batch_size, block_size]`: row `r` holds the window's
/// tokens `0..block_size` in `inputs` and tokens `1..=block_size` in `targets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Input ids, `[batch_size, block_size]`.
    pub inputs: Vec<u32>,
    /// Target ids (inputs shifted left by one), `[batch_size, block_size]`.
    pub targets: Vec<u32>,
    /// Rows in the batch.
    pub batch_size: usize,
    /// Tokens per row.
    pub block_size: usize,
}

impl Batch {
    /// Builds a batch from windows of `block_size + 1` tokens starting at `starts`.
    fn gather(dataset: &TokenDataset, starts: &[u64], block_size: usize) -> Result<Self> {
        let mut inputs = Vec::with_capacity(starts.len() * block_size);
        let mut targets = Vec::with_capacity(starts.len() * block_size);
        let mut window = vec![0u32; block_size + 1];
        for &start in starts {
            dataset.read(start, &mut window)?;
            inputs.extend_from_slice(&window[..block_size]);
            targets.extend_from_slice(&window[1..]);
        }
        Ok(Self {
            inputs,
            targets,
            batch_size: starts.len(),
            block_size,
        })
    }
}

/// Where a reader is in its batch sequence: everything needed to resume it exactly. Stored in training
/// checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaderState {
    /// Seed of the window sampler.
    pub seed: u64,
    /// This reader's data-parallel rank, `< world_size`.
    pub rank: usize,
    /// Number of data-parallel ranks.
    pub world_size: usize,
    /// Rows per batch.
    pub batch_size: usize,
    /// Tokens per row (a window is `block_size + 1` tokens).
    pub block_size: usize,
    /// Index of the next batch to hand out.
    pub next_batch: u64,
}

impl ReaderState {
    /// A fresh single-rank reader state.
    pub fn new(seed: u64, batch_size: usize, block_size: usize) -> Self {
        Self {
            seed,
            rank: 0,
            world_size: 1,
            batch_size,
            block_size,
            next_batch: 0,
        }
    }

    /// The same state for rank `rank` of `world_size`.
    pub fn with_rank(self, rank: usize, world_size: usize) -> Self {
        Self {
            rank,
            world_size,
            ..self
        }
    }
}

/// The part of a split that one data-parallel rank reads: ranks get disjoint, contiguous, near-equal token ranges,
/// and windows never leave their rank's range.
fn rank_range(
    dataset: &TokenDataset,
    rank: usize,
    world_size: usize,
    block_size: usize,
) -> Result<(u64, u64)> {
    if world_size == 0 || rank >= world_size {
        return Err(DatasetError::InvalidOption(format!(
            "rank {rank} of world size {world_size}"
        )));
    }
    if block_size == 0 {
        return Err(DatasetError::InvalidOption(
            "block_size must be at least 1".into(),
        ));
    }
    let total = u128::from(dataset.len());
    let lo = (total * rank as u128 / world_size as u128) as u64;
    let hi = (total * (rank as u128 + 1) / world_size as u128) as u64;
    let needed = block_size as u64 + 1;
    if hi - lo < needed {
        return Err(DatasetError::SplitTooShort {
            dir: dataset.dir().to_path_buf(),
            split: dataset.split().to_string(),
            tokens: hi - lo,
            needed,
        });
    }
    Ok((lo, hi))
}

/// An endless sequence of training batches whose windows start at uniformly random positions.
///
/// Batch `i` is a pure function of `(seed, rank, world_size, batch shape, i)`: its RNG is ChaCha8 keyed by the
/// seed, rank and world size, on stream `i`. So the same seed gives the same batches, a reader resumed from a
/// [`ReaderState`] continues exactly where it stopped, and batches can be built ahead of time on another thread.
#[derive(Debug, Clone)]
pub struct RandomBatches {
    dataset: Arc<TokenDataset>,
    state: ReaderState,
    lo: u64,
    windows: u64,
}

impl RandomBatches {
    /// A reader over `dataset` positioned at `state` (a fresh [`ReaderState::new`] or one saved by
    /// [`RandomBatches::state`]).
    pub fn new(dataset: Arc<TokenDataset>, state: ReaderState) -> Result<Self> {
        if state.batch_size == 0 {
            return Err(DatasetError::InvalidOption(
                "batch_size must be at least 1".into(),
            ));
        }
        let (lo, hi) = rank_range(&dataset, state.rank, state.world_size, state.block_size)
            .map_err(|e| match e {
                DatasetError::InvalidOption(m) => DatasetError::StateMismatch(m),
                other => other,
            })?;
        Ok(Self {
            dataset,
            state,
            lo,
            windows: hi - lo - state.block_size as u64,
        })
    }

    /// The position to save in a checkpoint: resuming from it yields the batches not yet handed out.
    pub fn state(&self) -> ReaderState {
        self.state
    }

    /// Number of distinct window start positions this rank samples from.
    pub fn windows(&self) -> u64 {
        self.windows
    }

    /// Batch number `index` of this reader's sequence, without moving the reader.
    pub fn batch_at(&self, index: u64) -> Result<Batch> {
        let mut key = [0u8; 32];
        key[0..8].copy_from_slice(&self.state.seed.to_le_bytes());
        key[8..16].copy_from_slice(&(self.state.rank as u64).to_le_bytes());
        key[16..24].copy_from_slice(&(self.state.world_size as u64).to_le_bytes());
        let mut rng = ChaCha8Rng::from_seed(key);
        rng.set_stream(index);
        let starts: Vec<u64> = (0..self.state.batch_size)
            .map(|_| self.lo + rng.random_range(0..self.windows))
            .collect();
        Batch::gather(&self.dataset, &starts, self.state.block_size)
    }

    /// The next batch; advances the reader.
    pub fn next_batch(&mut self) -> Result<Batch> {
        let batch = self.batch_at(self.state.next_batch)?;
        self.advance();
        Ok(batch)
    }

    /// Moves past the current batch without building it.
    pub(crate) fn advance(&mut self) {
        self.state.next_batch += 1;
    }
}

/// Sequential, non-overlapping evaluation windows over a rank's part of a split, in batches.
///
/// Window `j` starts at token `j * block_size`, so consecutive windows share one token and every token after the
/// first is a target exactly once. The last batch may hold fewer than `batch_size` rows.
#[derive(Debug)]
pub struct EvalBatches {
    dataset: Arc<TokenDataset>,
    batch_size: usize,
    block_size: usize,
    next_start: u64,
    hi: u64,
}

impl EvalBatches {
    /// Evaluation batches of `batch_size` windows of `block_size + 1` tokens over rank `rank` of `world_size`.
    pub fn new(
        dataset: Arc<TokenDataset>,
        batch_size: usize,
        block_size: usize,
        rank: usize,
        world_size: usize,
    ) -> Result<Self> {
        if batch_size == 0 {
            return Err(DatasetError::InvalidOption(
                "batch_size must be at least 1".into(),
            ));
        }
        let (lo, hi) = rank_range(&dataset, rank, world_size, block_size)?;
        Ok(Self {
            dataset,
            batch_size,
            block_size,
            next_start: lo,
            hi,
        })
    }
}

impl Iterator for EvalBatches {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        let span = self.block_size as u64;
        let mut starts = Vec::with_capacity(self.batch_size);
        while starts.len() < self.batch_size && self.next_start + span < self.hi {
            starts.push(self.next_start);
            self.next_start += span;
        }
        (!starts.is_empty()).then(|| Batch::gather(&self.dataset, &starts, self.block_size))
    }
}
