//! Host-side bookkeeping of the paged KV cache: reference-counted blocks and per-sequence block
//! tables. No tensors live here, so the invariants are cheap to property-test.

use std::collections::BTreeMap;

use crate::error::PoolError;

/// Identifies a sequence in a [`BlockManager`] (and in [`crate::PagedKvPool`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u64);

/// A block copy the device storage must perform before a write (copy-on-write of a shared block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    /// Shared block whose content is copied.
    pub src: usize,
    /// Freshly allocated block that replaces `src` in the writer's table.
    pub dst: usize,
}

/// One sequence: its block table and how many positions each layer has written.
#[derive(Clone, Debug)]
struct Sequence {
    /// Physical block of logical block `i` (positions `i * block_size ..`).
    blocks: Vec<usize>,
    /// Positions written per layer; layers advance one after another within a decoding step.
    layer_lens: Vec<usize>,
}

impl Sequence {
    /// Positions held: the furthest any layer has written.
    fn len(&self) -> usize {
        self.layer_lens.iter().copied().max().unwrap_or(0)
    }
}

/// Allocation state of a fixed set of blocks shared by many sequences.
///
/// Blocks are reference counted: [`fork`](Self::fork) shares every block of a sequence with a new
/// one (prefix sharing), and [`prepare_write`](Self::prepare_write) replaces a shared block by a
/// private copy before it is written (copy-on-write). Freed blocks go on a LIFO free list and are
/// reused first.
#[derive(Clone, Debug)]
pub struct BlockManager {
    block_size: usize,
    num_layers: usize,
    refcounts: Vec<u32>,
    free: Vec<usize>,
    sequences: BTreeMap<SeqId, Sequence>,
    next_id: u64,
    peak_used: usize,
}

/// Counters describing a pool at one moment (see [`BlockManager::stats`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolStats {
    /// Blocks the budget holds.
    pub total_blocks: usize,
    /// Blocks referenced by at least one sequence.
    pub used_blocks: usize,
    /// Blocks on the free list.
    pub free_blocks: usize,
    /// Blocks referenced by more than one sequence (shared prefixes).
    pub shared_blocks: usize,
    /// Most blocks ever in use at once.
    pub peak_used_blocks: usize,
    /// Live sequences.
    pub sequences: usize,
    /// Positions held, summed over sequences (a shared prefix counts once per sequence).
    pub logical_tokens: usize,
    /// Distinct physical token slots holding data (a shared prefix counts once).
    pub physical_tokens: usize,
    /// Tokens per block.
    pub block_size: usize,
}

impl PoolStats {
    /// Internal fragmentation: the fraction of slots in used blocks that hold no token
    /// (`1 - physical_tokens / (used_blocks * block_size)`); 0 when nothing is used.
    pub fn fragmentation(&self) -> f64 {
        let slots = self.used_blocks * self.block_size;
        if slots == 0 {
            0.0
        } else {
            1.0 - self.physical_tokens as f64 / slots as f64
        }
    }
}

impl BlockManager {
    /// A manager of `total_blocks` blocks of `block_size` positions for `num_layers` layers.
    pub fn new(total_blocks: usize, block_size: usize, num_layers: usize) -> Self {
        Self {
            block_size,
            num_layers,
            refcounts: vec![0; total_blocks],
            // Reversed so that block 0 is handed out first.
            free: (0..total_blocks).rev().collect(),
            sequences: BTreeMap::new(),
            next_id: 0,
            peak_used: 0,
        }
    }

    /// Adds `count` free blocks (numbered after the existing ones), for a pool whose storage grew.
    /// They are handed out after the blocks already free, so freed blocks are still reused first.
    pub fn add_blocks(&mut self, count: usize) {
        let total = self.total_blocks();
        self.refcounts.resize(total + count, 0);
        self.free.splice(0..0, (total..total + count).rev());
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.refcounts.len()
    }

    /// Starts an empty sequence (no blocks until something is written).
    pub fn add_sequence(&mut self) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        let sequence = Sequence {
            blocks: Vec::new(),
            layer_lens: vec![0; self.num_layers],
        };
        self.sequences.insert(id, sequence);
        id
    }

    /// A new sequence sharing every block (and position) of `seq`: a common prompt prefix is held
    /// once, and whichever sequence writes into a shared block first gets its own copy.
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId, PoolError> {
        let parent = self.sequence(seq)?.clone();
        for &block in &parent.blocks {
            self.refcounts[block] += 1;
        }
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.sequences.insert(id, parent);
        Ok(id)
    }

    /// Ends a sequence, releasing its blocks (a block returns to the free list when its last
    /// sequence lets go).
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<(), PoolError> {
        let sequence = self
            .sequences
            .remove(&seq)
            .ok_or(PoolError::UnknownSequence { seq: seq.0 })?;
        for block in sequence.blocks {
            self.release(block);
        }
        Ok(())
    }

    /// Forgets positions at or after `len` in every layer of `seq`, releasing blocks no longer
    /// needed. A `len` past the end changes nothing.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), PoolError> {
        let block_size = self.block_size;
        let sequence = self.sequence_mut(seq)?;
        sequence
            .layer_lens
            .iter_mut()
            .for_each(|l| *l = (*l).min(len));
        let keep = sequence.len().div_ceil(block_size);
        let dropped = sequence.blocks.split_off(keep.min(sequence.blocks.len()));
        for block in dropped {
            self.release(block);
        }
        Ok(())
    }

    /// Positions `layer` of `seq` has written.
    pub fn layer_len(&self, seq: SeqId, layer: usize) -> Result<usize, PoolError> {
        let sequence = self.sequence(seq)?;
        sequence
            .layer_lens
            .get(layer)
            .copied()
            .ok_or_else(|| bad_layer(seq, layer, self.num_layers))
    }

    /// Positions held by `seq` (the furthest any layer has written).
    pub fn seq_len(&self, seq: SeqId) -> Result<usize, PoolError> {
        Ok(self.sequence(seq)?.len())
    }

    /// The block table of `seq`: physical block of each logical block.
    pub fn block_table(&self, seq: SeqId) -> Result<&[usize], PoolError> {
        Ok(&self.sequence(seq)?.blocks)
    }

    /// Live sequences, oldest first.
    pub fn sequences(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.sequences.keys().copied()
    }

    /// Reference count of a block (0 when free).
    pub fn refcount(&self, block: usize) -> u32 {
        self.refcounts[block]
    }

    /// Blocks on the free list, next to be handed out last.
    pub fn free_list(&self) -> &[usize] {
        &self.free
    }

    /// Makes `layer` of `seq` ready to write `new` positions after its current end: allocates the
    /// blocks that do not exist yet and privately copies shared blocks in the written range.
    /// Returns the copies the storage must perform (before writing) and the first position.
    ///
    /// All-or-nothing: when the free blocks do not suffice, nothing changes and
    /// [`PoolError::OutOfBlocks`] reports how many were needed.
    pub fn prepare_write(
        &mut self,
        seq: SeqId,
        layer: usize,
        new: usize,
    ) -> Result<(usize, Vec<BlockCopy>), PoolError> {
        let start = self.layer_len(seq, layer)?;
        let end = start + new;
        let block_size = self.block_size;
        let sequence = self.sequence(seq)?;
        let first = start / block_size;
        let last = end.div_ceil(block_size);
        let have = sequence.blocks.len();
        let shared = (first..last.min(have))
            .filter(|&i| self.refcounts[sequence.blocks[i]] > 1)
            .count();
        let needed = last.saturating_sub(have) + shared;
        if needed > self.free.len() {
            return Err(PoolError::OutOfBlocks {
                seq: seq.0,
                needed,
                free: self.free.len(),
                total: self.total_blocks(),
                block_size,
            });
        }
        let mut copies = Vec::new();
        for i in first..last {
            let current = self.sequence(seq)?.blocks.get(i).copied();
            match current {
                Some(block) if self.refcounts[block] > 1 => {
                    let copy = self.allocate();
                    self.refcounts[block] -= 1;
                    self.sequence_mut(seq)?.blocks[i] = copy;
                    copies.push(BlockCopy {
                        src: block,
                        dst: copy,
                    });
                }
                Some(_) => {}
                None => {
                    let block = self.allocate();
                    self.sequence_mut(seq)?.blocks.push(block);
                }
            }
        }
        self.sequence_mut(seq)?.layer_lens[layer] = end;
        Ok((start, copies))
    }

    /// Physical slot (`block * block_size + offset`) of position `pos` of `seq`.
    pub fn slot(&self, seq: SeqId, pos: usize) -> Result<usize, PoolError> {
        let sequence = self.sequence(seq)?;
        let block =
            sequence
                .blocks
                .get(pos / self.block_size)
                .ok_or_else(|| PoolError::BadWrite {
                    seq: seq.0,
                    layer: 0,
                    reason: format!("position {pos} is beyond the sequence's blocks"),
                })?;
        Ok(block * self.block_size + pos % self.block_size)
    }

    /// Current counters.
    pub fn stats(&self) -> PoolStats {
        let mut fill = vec![0usize; self.total_blocks()];
        let mut logical_tokens = 0;
        for sequence in self.sequences.values() {
            let len = sequence.len();
            logical_tokens += len;
            for (i, &block) in sequence.blocks.iter().enumerate() {
                let held = len.saturating_sub(i * self.block_size).min(self.block_size);
                fill[block] = fill[block].max(held);
            }
        }
        let used_blocks = self.refcounts.iter().filter(|&&r| r > 0).count();
        PoolStats {
            total_blocks: self.total_blocks(),
            used_blocks,
            free_blocks: self.free.len(),
            shared_blocks: self.refcounts.iter().filter(|&&r| r > 1).count(),
            peak_used_blocks: self.peak_used,
            sequences: self.sequences.len(),
            logical_tokens,
            physical_tokens: fill.iter().sum(),
            block_size: self.block_size,
        }
    }

    /// Takes a block off the free list; callers have checked that one is free.
    fn allocate(&mut self) -> usize {
        let block = self
            .free
            .pop()
            .expect("prepare_write checks the free count before allocating");
        self.refcounts[block] = 1;
        self.peak_used = self.peak_used.max(self.total_blocks() - self.free.len());
        block
    }

    fn release(&mut self, block: usize) {
        self.refcounts[block] -= 1;
        if self.refcounts[block] == 0 {
            self.free.push(block);
        }
    }

    fn sequence(&self, seq: SeqId) -> Result<&Sequence, PoolError> {
        self.sequences
            .get(&seq)
            .ok_or(PoolError::UnknownSequence { seq: seq.0 })
    }

    fn sequence_mut(&mut self, seq: SeqId) -> Result<&mut Sequence, PoolError> {
        self.sequences
            .get_mut(&seq)
            .ok_or(PoolError::UnknownSequence { seq: seq.0 })
    }
}

fn bad_layer(seq: SeqId, layer: usize, num_layers: usize) -> PoolError {
    PoolError::BadWrite {
        seq: seq.0,
        layer,
        reason: format!("layer out of range, the pool has {num_layers} layers"),
    }
}
