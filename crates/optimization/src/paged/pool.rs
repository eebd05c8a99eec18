//! [`PagedKvPool`]: device storage for the K/V of many sequences, in fixed-size blocks.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};

use ember_attention::{
    AttentionOptions, EmberBackend, PagedRows, paged_attention, select_rows, write_block,
    write_rows,
};

use crate::error::PoolError;
use crate::paged::blocks::{BlockCopy, BlockManager, PoolStats, SeqId};

/// Shape and budget of a [`PagedKvPool`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedKvConfig {
    /// Transformer layers (every block holds all of them).
    pub num_layers: usize,
    /// Key/value heads per layer.
    pub kv_heads: usize,
    /// Key dimension per head.
    pub head_dim: usize,
    /// Value dimension per head (usually `head_dim`).
    pub v_dim: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Hard cap on the bytes of K/V storage; the pool holds at most `budget_bytes / block_bytes` blocks.
    pub budget_bytes: usize,
    /// Blocks allocated when the pool is created; `None` allocates the whole budget up front. With
    /// `Some(n)` the storage starts at `n` blocks and doubles (up to the budget) when a write needs
    /// more, so device memory follows the tokens held rather than the budget.
    pub initial_blocks: Option<usize>,
}

impl PagedKvConfig {
    /// A configuration with 16-position blocks, `v_dim = head_dim` and a 256 MiB budget.
    pub fn new(num_layers: usize, kv_heads: usize, head_dim: usize) -> Self {
        Self {
            num_layers,
            kv_heads,
            head_dim,
            v_dim: head_dim,
            block_size: 16,
            budget_bytes: 256 << 20,
            initial_blocks: None,
        }
    }

    /// Starts with `blocks` allocated and grows on demand up to the budget (see
    /// [`initial_blocks`](Self::initial_blocks)).
    pub fn with_initial_blocks(mut self, blocks: usize) -> Self {
        self.initial_blocks = Some(blocks);
        self
    }

    /// Sets the positions per block.
    pub fn with_block_size(mut self, block_size: usize) -> Self {
        self.block_size = block_size;
        self
    }

    /// Sets the memory budget in bytes.
    pub fn with_budget_bytes(mut self, budget_bytes: usize) -> Self {
        self.budget_bytes = budget_bytes;
        self
    }

    /// Sets the value dimension per head.
    pub fn with_v_dim(mut self, v_dim: usize) -> Self {
        self.v_dim = v_dim;
        self
    }

    /// Bytes of K and V for one position across all layers, with `elem_bytes` per element.
    pub fn token_bytes(&self, elem_bytes: usize) -> usize {
        self.num_layers * self.kv_heads * (self.head_dim + self.v_dim) * elem_bytes
    }

    /// Bytes of one block across all layers, K and V.
    pub fn block_bytes(&self, elem_bytes: usize) -> usize {
        self.block_size * self.token_bytes(elem_bytes)
    }
}

/// K/V of several sequences gathered through their block tables.
#[derive(Clone, Debug)]
pub struct GatheredKv<B: Backend> {
    /// Keys `[batch, kv_heads, max_len, head_dim]`, shorter sequences left-padded.
    pub keys: Tensor<B, 4>,
    /// Values `[batch, kv_heads, max_len, v_dim]`, laid out like the keys.
    pub values: Tensor<B, 4>,
    /// `[batch, max_len]`, `true` at padding; `None` when every sequence has `max_len` positions.
    /// Pass it to attention as the key padding mask.
    pub padding: Option<Tensor<B, 2, Bool>>,
}

/// A pool of K/V blocks shared by many sequences, within a hard memory budget.
///
/// Storage is, per layer, keys `[total_blocks * block_size, kv_heads, head_dim]` and values
/// `[.., kv_heads, v_dim]`, where slot `block * block_size + offset` holds one position. It is
/// allocated up front to the budget, or (with [`PagedKvConfig::initial_blocks`]) grown by doubling
/// up to it. Sequences own blocks only as they grow ([`BlockManager`] does the bookkeeping), so the
/// memory in use tracks the tokens actually held, not `batch × max_len`; [`stats`](Self::stats)
/// reports it.
#[derive(Debug)]
pub struct PagedKvPool<B: Backend> {
    config: PagedKvConfig,
    manager: BlockManager,
    keys: Vec<Tensor<B, 3>>,
    values: Vec<Tensor<B, 3>>,
    device: B::Device,
    elem_bytes: usize,
    /// Blocks the budget allows.
    max_blocks: usize,
}

impl<B: EmberBackend> PagedKvPool<B> {
    /// Allocates `config.budget_bytes / block_bytes` blocks of zeros on `device`.
    pub fn new(config: PagedKvConfig, device: &B::Device) -> Result<Self, PoolError> {
        let PagedKvConfig {
            num_layers,
            kv_heads,
            head_dim,
            v_dim,
            block_size,
            budget_bytes,
            initial_blocks,
        } = config;
        if [num_layers, kv_heads, head_dim, v_dim, block_size].contains(&0) {
            return Err(PoolError::InvalidConfig {
                reason: format!("every dimension must be positive, got {config:?}"),
            });
        }
        let elem_bytes = Self::elem_bytes(device);
        let block_bytes = config.block_bytes(elem_bytes);
        let max_blocks = budget_bytes / block_bytes;
        if max_blocks == 0 {
            return Err(PoolError::BudgetTooSmall {
                budget_bytes,
                block_bytes,
            });
        }
        // At least one block, so the storage tensors are never empty.
        let total_blocks = initial_blocks.map_or(max_blocks, |n| n.clamp(1, max_blocks));
        let slots = total_blocks * block_size;
        Ok(Self {
            config,
            manager: BlockManager::new(total_blocks, block_size, num_layers),
            keys: (0..num_layers)
                .map(|_| Tensor::zeros([slots, kv_heads, head_dim], device))
                .collect(),
            values: (0..num_layers)
                .map(|_| Tensor::zeros([slots, kv_heads, v_dim], device))
                .collect(),
            device: device.clone(),
            elem_bytes,
            max_blocks,
        })
    }

    /// Bytes per stored element on `device`: the pool holds the backend's default float type there.
    pub fn elem_bytes(device: &B::Device) -> usize {
        Tensor::<B, 1>::zeros([1], device).dtype().size()
    }

    /// Bytes of K/V storage allocated now (all blocks, used or free).
    pub fn allocated_bytes(&self) -> usize {
        self.manager.total_blocks() * self.block_bytes()
    }

    /// Most blocks the budget allows.
    pub fn max_blocks(&self) -> usize {
        self.max_blocks
    }

    /// The configuration.
    pub fn config(&self) -> &PagedKvConfig {
        &self.config
    }

    /// The block bookkeeping (block tables, reference counts, free list).
    pub fn blocks(&self) -> &BlockManager {
        &self.manager
    }

    /// Bytes of one block across all layers, K and V.
    pub fn block_bytes(&self) -> usize {
        self.config.block_bytes(self.elem_bytes)
    }

    /// Current counters; multiply block counts by [`block_bytes`](Self::block_bytes) for bytes.
    pub fn stats(&self) -> PoolStats {
        self.manager.stats()
    }

    /// Starts an empty sequence.
    pub fn add_sequence(&mut self) -> SeqId {
        self.manager.add_sequence()
    }

    /// A new sequence sharing all of `seq`'s positions (copy-on-write); see [`BlockManager::fork`].
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId, PoolError> {
        self.manager.fork(seq)
    }

    /// Ends `seq` and releases its blocks.
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<(), PoolError> {
        self.manager.free_sequence(seq)
    }

    /// Forgets positions of `seq` at or after `len`, releasing whole blocks past it.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), PoolError> {
        self.manager.truncate(seq, len)
    }

    /// Positions held by `seq`.
    pub fn seq_len(&self, seq: SeqId) -> Result<usize, PoolError> {
        self.manager.seq_len(seq)
    }

    /// Appends `k: [kv_heads, new, head_dim]` and `v: [kv_heads, new, v_dim]` to `layer` of `seq`,
    /// allocating blocks on demand and copying shared blocks before writing into them.
    ///
    /// Errors (changing nothing) when the pool has too few free blocks or the shapes are wrong.
    pub fn append(
        &mut self,
        seq: SeqId,
        layer: usize,
        k: Tensor<B, 3>,
        v: Tensor<B, 3>,
    ) -> Result<(), PoolError> {
        let [heads, new, k_dim] = k.dims();
        let expected = [self.config.kv_heads, new, self.config.v_dim];
        if [heads, k_dim] != [self.config.kv_heads, self.config.head_dim] || v.dims() != expected {
            return Err(PoolError::BadWrite {
                seq: seq.0,
                layer,
                reason: format!(
                    "keys {:?} / values {:?} do not match [{}, new, {}] / [{}, new, {}]",
                    k.dims(),
                    v.dims(),
                    self.config.kv_heads,
                    self.config.head_dim,
                    self.config.kv_heads,
                    self.config.v_dim
                ),
            });
        }
        let start = self.prepare(seq, layer, new)?;
        // Position-major `[new, heads, dim]` rows, written one block-contiguous run at a time.
        let k = k.swap_dims(0, 1);
        let v = v.swap_dims(0, 1);
        let v_dim = self.config.v_dim;
        let block_size = self.config.block_size;
        let mut pos = start;
        while pos < start + new {
            let run = (block_size - pos % block_size).min(start + new - pos);
            let slot = self.manager.slot(seq, pos)?;
            let key_rows = k.clone().narrow(0, pos - start, run);
            let value_rows = v.clone().narrow(0, pos - start, run);
            let slots = slot..slot + run;
            replace(&mut self.keys[layer], |t| {
                write_block(t, [slots.clone(), 0..heads, 0..k_dim], key_rows)
            });
            replace(&mut self.values[layer], |t| {
                write_block(t, [slots, 0..heads, 0..v_dim], value_rows)
            });
            pos += run;
        }
        Ok(())
    }

    /// Appends row `i` of `k: [batch, kv_heads, new, head_dim]` and `v: [batch, kv_heads, new, v_dim]` to
    /// `layer` of `seqs[i]`, every row the same `new` positions: [`append`](Self::append) for a whole batch,
    /// with one write per storage tensor (a decode step's keys and values, each row to its own block).
    ///
    /// Errors when the shapes are wrong (changing nothing) or the pool runs out of blocks; the rows before the
    /// one that did not fit are then appended.
    pub fn append_rows(
        &mut self,
        seqs: &[SeqId],
        layer: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Result<(), PoolError> {
        let [batch, heads, new, k_dim] = k.dims();
        let expected = [seqs.len(), self.config.kv_heads, new, self.config.v_dim];
        if [batch, heads, k_dim] != [seqs.len(), self.config.kv_heads, self.config.head_dim]
            || v.dims() != expected
            || layer >= self.config.num_layers
        {
            return Err(PoolError::BadWrite {
                seq: seqs.first().map_or(0, |s| s.0),
                layer,
                reason: format!(
                    "keys {:?} / values {:?} do not match [{}, {}, new, {}] / [.., {}] in one of {} layers",
                    k.dims(),
                    v.dims(),
                    seqs.len(),
                    self.config.kv_heads,
                    self.config.head_dim,
                    self.config.v_dim,
                    self.config.num_layers
                ),
            });
        }
        let mut slots = Vec::with_capacity(batch * new);
        let mut failure = None;
        for &seq in seqs {
            match self.prepare(seq, layer, new) {
                Ok(start) => {
                    for pos in start..start + new {
                        slots.push(self.manager.slot(seq, pos)?);
                    }
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let rows = slots.len();
        if rows > 0 {
            // Position-major `[batch * new, heads, dim]`: row `i * new + t` is position `t` of sequence `i`.
            let flat = |t: Tensor<B, 4>, dim: usize| {
                t.swap_dims(1, 2)
                    .reshape([batch * new, heads, dim])
                    .narrow(0, 0, rows)
            };
            let (k, v) = (flat(k, k_dim), flat(v, self.config.v_dim));
            replace(&mut self.keys[layer], |t| write_rows(t, &slots, k));
            replace(&mut self.values[layer], |t| write_rows(t, &slots, v));
        }
        failure.map_or(Ok(()), Err)
    }

    /// Readies `layer` of `seq` for `new` more positions (growing the storage if it must, copying shared
    /// blocks first); returns the first new position.
    fn prepare(&mut self, seq: SeqId, layer: usize, new: usize) -> Result<usize, PoolError> {
        let (start, copies) = match self.manager.prepare_write(seq, layer, new) {
            Err(PoolError::OutOfBlocks {
                needed,
                free,
                total,
                ..
            }) if total < self.max_blocks => {
                self.grow((total - free + needed).max(2 * total));
                self.manager.prepare_write(seq, layer, new)?
            }
            other => other?,
        };
        for copy in copies {
            self.copy_block(copy);
        }
        Ok(start)
    }

    /// Gathers `layer`'s K/V of `seqs` through their block tables into dense tensors, left-padding
    /// shorter sequences (see [`GatheredKv`]).
    pub fn gather(&self, seqs: &[SeqId], layer: usize) -> Result<GatheredKv<B>, PoolError> {
        self.gather_padded(seqs, layer, 0)
    }

    /// Like [`gather`](Self::gather), but left-pads every sequence to at least `width` positions (a
    /// batch whose rows share one position axis, with finished or shorter rows padded).
    pub fn gather_padded(
        &self,
        seqs: &[SeqId],
        layer: usize,
        width: usize,
    ) -> Result<GatheredKv<B>, PoolError> {
        if layer >= self.config.num_layers {
            return Err(self.bad_layer(seqs, layer));
        }
        let lens = seqs
            .iter()
            .map(|&seq| self.manager.layer_len(seq, layer))
            .collect::<Result<Vec<_>, _>>()?;
        let max_len = lens.iter().copied().max().unwrap_or(0).max(width);
        let mut slots = Vec::with_capacity(seqs.len() * max_len);
        for (&seq, &len) in seqs.iter().zip(&lens) {
            // Padding reads slot 0 (always allocated storage); the mask hides it.
            slots.extend(std::iter::repeat_n(0, max_len - len));
            self.push_slots(seq, layer, len, &mut slots)?;
        }
        let [batch, heads] = [seqs.len(), self.config.kv_heads];
        let pick = |storage: &Tensor<B, 3>, dim: usize| {
            select_rows(storage.clone(), &slots)
                .reshape([batch, max_len, heads, dim])
                .swap_dims(1, 2)
        };
        let padding = lens.iter().any(|&len| len != max_len).then(|| {
            let mask = lens
                .iter()
                .flat_map(|&len| (0..max_len).map(move |pos| pos < max_len - len))
                .collect::<Vec<_>>();
            Tensor::from_data(TensorData::new(mask, [batch, max_len]), &self.device)
        });
        Ok(GatheredKv {
            keys: pick(&self.keys[layer], self.config.head_dim),
            values: pick(&self.values[layer], self.config.v_dim),
            padding,
        })
    }

    /// Attention of `q` `[batch, q_heads, new, head_dim]` over `layer`'s positions of `seqs` (batch row `i` is
    /// `seqs[i]`, whose last `new` positions are the queries'), reading the blocks in place
    /// ([`ember_attention::paged_attention`]): `None` where the backend or `options` need the gathered copy
    /// ([`gather_padded`](Self::gather_padded)) instead.
    pub fn attend(
        &self,
        seqs: &[SeqId],
        layer: usize,
        q: &Tensor<B, 4>,
        options: &AttentionOptions<B>,
    ) -> Result<Option<Tensor<B, 4>>, PoolError> {
        let (keys, values) = match (self.keys.get(layer), self.values.get(layer)) {
            (Some(keys), Some(values)) => (keys, values),
            _ => return Err(self.bad_layer(seqs, layer)),
        };
        let mut slots = Vec::new();
        let mut offsets = Vec::with_capacity(seqs.len() + 1);
        offsets.push(0);
        for &seq in seqs {
            let len = self.manager.layer_len(seq, layer)?;
            self.push_slots(seq, layer, len, &mut slots)?;
            offsets.push(slots.len());
        }
        let rows = PagedRows {
            slots: &slots,
            offsets: &offsets,
        };
        Ok(paged_attention(q, keys, values, rows, options))
    }

    /// Appends the storage slots of `seq`'s first `len` positions to `slots`, a block-contiguous run at a time.
    fn push_slots(
        &self,
        seq: SeqId,
        layer: usize,
        len: usize,
        slots: &mut Vec<usize>,
    ) -> Result<(), PoolError> {
        let size = self.config.block_size;
        let table = self.manager.block_table(seq)?;
        if table.len() * size < len {
            return Err(PoolError::BadWrite {
                seq: seq.0,
                layer,
                reason: format!("{len} positions but only {} blocks", table.len()),
            });
        }
        let (full, rest) = (len / size, len % size);
        for &block in &table[..full] {
            slots.extend(block * size..(block + 1) * size);
        }
        if rest > 0 {
            slots.extend(table[full] * size..table[full] * size + rest);
        }
        Ok(())
    }

    fn bad_layer(&self, seqs: &[SeqId], layer: usize) -> PoolError {
        PoolError::BadWrite {
            seq: seqs.first().map_or(0, |s| s.0),
            layer,
            reason: format!(
                "layer out of range, the pool has {} layers",
                self.config.num_layers
            ),
        }
    }

    /// Grows the storage to `blocks` blocks (capped by the budget), keeping every stored position.
    fn grow(&mut self, blocks: usize) {
        let blocks = blocks.min(self.max_blocks);
        let extra = blocks.saturating_sub(self.manager.total_blocks());
        if extra == 0 {
            return;
        }
        let rows = extra * self.config.block_size;
        for storage in self.keys.iter_mut().chain(self.values.iter_mut()) {
            let [_, heads, dim] = storage.dims();
            let zeros = Tensor::zeros([rows, heads, dim], &self.device);
            replace(storage, |t| Tensor::cat(vec![t, zeros], 0));
        }
        self.manager.add_blocks(extra);
    }

    /// Copies every layer's K/V of block `src` into block `dst`.
    fn copy_block(&mut self, BlockCopy { src, dst }: BlockCopy) {
        let size = self.config.block_size;
        let (from, to) = (src * size..(src + 1) * size, dst * size..(dst + 1) * size);
        // `select` copies the block out, so no view keeps the storage buffer shared while it is
        // updated.
        let index = Tensor::<B, 1, Int>::arange(from.start as i64..from.end as i64, &self.device);
        for storage in self.keys.iter_mut().chain(self.values.iter_mut()) {
            let block = storage.clone().select(0, index.clone());
            let [_, heads, dim] = storage.dims();
            replace(storage, |t| {
                write_block(t, [to.clone(), 0..heads, 0..dim], block)
            });
        }
    }
}

/// Applies a by-value update to a stored tensor. Moving it out first (leaving an empty tensor, not
/// a view of it) keeps its buffer uniquely owned, so backends can update it in place instead of
/// copying the whole pool.
fn replace<B: Backend>(slot: &mut Tensor<B, 3>, update: impl FnOnce(Tensor<B, 3>) -> Tensor<B, 3>) {
    let [_, heads, dim] = slot.dims();
    let placeholder = Tensor::empty([0, heads, dim], &slot.device());
    let tensor = std::mem::replace(slot, placeholder);
    *slot = update(tensor);
}
