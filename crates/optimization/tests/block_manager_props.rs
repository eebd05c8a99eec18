//! Property tests of the paged pool's bookkeeping over random allocate / append / fork /
//! truncate / free sequences, with a simulated storage that catches any block used by two
//! sequences at once.

use std::collections::BTreeMap;

use ember_optimization::{BlockManager, PoolError, SeqId};
use proptest::prelude::*;

const LAYERS: usize = 2;
const BLOCK: usize = 4;
const TOTAL: usize = 24;

#[derive(Clone, Debug)]
enum Op {
    Add,
    Fork(usize),
    Free(usize),
    /// A decoding step: `n` positions appended to every layer in order.
    Step(usize, usize),
    /// One layer only (a step interrupted mid-way, e.g. by a fork).
    AppendLayer(usize, usize, usize),
    Truncate(usize, usize),
    /// The pool's storage grows by `n` blocks.
    Grow(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => Just(Op::Add),
        2 => any::<usize>().prop_map(Op::Fork),
        1 => any::<usize>().prop_map(Op::Free),
        4 => (any::<usize>(), 1usize..9).prop_map(|(s, n)| Op::Step(s, n)),
        1 => (any::<usize>(), 0..LAYERS, 1usize..6).prop_map(|(s, l, n)| Op::AppendLayer(s, l, n)),
        1 => (any::<usize>(), 0usize..30).prop_map(|(s, n)| Op::Truncate(s, n)),
        1 => (1usize..4).prop_map(Op::Grow),
    ]
}

/// The manager plus a host stand-in for the device storage: `storage[layer][slot]` holds the token
/// id last written there, and `expected[seq][layer]` what each sequence must read back.
struct Model {
    manager: BlockManager,
    storage: Vec<Vec<u64>>,
    expected: BTreeMap<SeqId, Vec<Vec<u64>>>,
    next_token: u64,
}

impl Model {
    fn new() -> Self {
        Self {
            manager: BlockManager::new(TOTAL, BLOCK, LAYERS),
            storage: vec![vec![u64::MAX; TOTAL * BLOCK]; LAYERS],
            expected: BTreeMap::new(),
            next_token: 0,
        }
    }

    fn pick(&self, index: usize) -> Option<SeqId> {
        let live: Vec<SeqId> = self.expected.keys().copied().collect();
        (!live.is_empty()).then(|| live[index % live.len()])
    }

    fn append(&mut self, seq: SeqId, layer: usize, n: usize) -> Result<(), TestCaseError> {
        let before = self.manager.clone().stats();
        let table_before = self.manager.block_table(seq).unwrap().to_vec();
        match self.manager.prepare_write(seq, layer, n) {
            Ok((start, copies)) => {
                prop_assert_eq!(start, self.expected[&seq][layer].len());
                for copy in copies {
                    prop_assert!(self.manager.refcount(copy.src) >= 1);
                    for layer_storage in &mut self.storage {
                        let block: Vec<u64> = layer_storage[copy.src * BLOCK..][..BLOCK].to_vec();
                        layer_storage[copy.dst * BLOCK..][..BLOCK].copy_from_slice(&block);
                    }
                }
                for pos in start..start + n {
                    let slot = self.manager.slot(seq, pos).unwrap();
                    // The block written must belong to this sequence alone.
                    prop_assert_eq!(self.manager.refcount(slot / BLOCK), 1);
                    self.storage[layer][slot] = self.next_token;
                    self.expected.get_mut(&seq).unwrap()[layer].push(self.next_token);
                    self.next_token += 1;
                }
            }
            Err(PoolError::OutOfBlocks { needed, free, .. }) => {
                // All-or-nothing: a refused write changes nothing.
                prop_assert!(needed > free);
                prop_assert_eq!(free, before.free_blocks);
                prop_assert_eq!(self.manager.stats(), before);
                prop_assert_eq!(self.manager.block_table(seq).unwrap(), &table_before[..]);
            }
            Err(other) => return Err(TestCaseError::fail(format!("unexpected error {other}"))),
        }
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Add => {
                let seq = self.manager.add_sequence();
                self.expected.insert(seq, vec![Vec::new(); LAYERS]);
            }
            Op::Fork(i) => {
                if let Some(parent) = self.pick(i) {
                    let child = self.manager.fork(parent).unwrap();
                    let content = self.expected[&parent].clone();
                    self.expected.insert(child, content);
                }
            }
            Op::Free(i) => {
                if let Some(seq) = self.pick(i) {
                    self.manager.free_sequence(seq).unwrap();
                    self.expected.remove(&seq);
                    let again = self.manager.free_sequence(seq);
                    prop_assert_eq!(again, Err(PoolError::UnknownSequence { seq: seq.0 }));
                }
            }
            Op::Step(i, n) => {
                if let Some(seq) = self.pick(i) {
                    for layer in 0..LAYERS {
                        self.append(seq, layer, n)?;
                    }
                }
            }
            Op::AppendLayer(i, layer, n) => {
                if let Some(seq) = self.pick(i) {
                    self.append(seq, layer, n)?;
                }
            }
            Op::Grow(n) => {
                self.manager.add_blocks(n);
                for layer_storage in &mut self.storage {
                    layer_storage.resize(layer_storage.len() + n * BLOCK, u64::MAX);
                }
            }
            Op::Truncate(i, len) => {
                if let Some(seq) = self.pick(i) {
                    self.manager.truncate(seq, len).unwrap();
                    for layer in self.expected.get_mut(&seq).unwrap() {
                        layer.truncate(len);
                    }
                }
            }
        }
        self.check()
    }

    /// Invariants that make "no leak, no double use" precise.
    fn check(&self) -> Result<(), TestCaseError> {
        let total = self.manager.total_blocks();
        let mut references = vec![0u32; total];
        for (&seq, content) in &self.expected {
            let table = self.manager.block_table(seq).unwrap();
            let len = content.iter().map(Vec::len).max().unwrap();
            // Blocks exist exactly for the positions held: none missing, none leaked at the end.
            prop_assert_eq!(table.len(), len.div_ceil(BLOCK));
            for &block in table {
                references[block] += 1;
            }
            // Every position reads back what was written for this sequence.
            for (layer, tokens) in content.iter().enumerate() {
                for (pos, &token) in tokens.iter().enumerate() {
                    let slot = self.manager.slot(seq, pos).unwrap();
                    prop_assert_eq!(
                        self.storage[layer][slot],
                        token,
                        "{:?} layer {} pos {}",
                        seq,
                        layer,
                        pos
                    );
                }
            }
        }
        let free = self.manager.free_list();
        let mut seen = vec![false; total];
        for &block in free {
            prop_assert!(!seen[block], "block {} twice on the free list", block);
            seen[block] = true;
        }
        for (block, &count) in references.iter().enumerate() {
            prop_assert_eq!(
                self.manager.refcount(block),
                count,
                "refcount of block {}",
                block
            );
            prop_assert_eq!(
                seen[block],
                count == 0,
                "block {} free-list membership",
                block
            );
        }
        let stats = self.manager.stats();
        prop_assert_eq!(stats.used_blocks + stats.free_blocks, total);
        prop_assert!(stats.peak_used_blocks >= stats.used_blocks);
        prop_assert!((0.0..1.0).contains(&stats.fragmentation()) || stats.used_blocks == 0);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_operations_never_leak_or_share_a_written_block(ops in prop::collection::vec(op(), 1..60)) {
        let mut model = Model::new();
        for op in ops {
            model.apply(op)?;
        }
        let live: Vec<SeqId> = model.expected.keys().copied().collect();
        for seq in live {
            model.manager.free_sequence(seq).unwrap();
        }
        let stats = model.manager.stats();
        prop_assert_eq!(stats.free_blocks, model.manager.total_blocks());
        prop_assert_eq!(stats.used_blocks, 0);
    }
}

/// Freed blocks are handed out again before untouched ones (LIFO), keeping the working set small.
#[test]
fn freed_blocks_are_reused_first() {
    let mut manager = BlockManager::new(8, BLOCK, 1);
    let a = manager.add_sequence();
    manager.prepare_write(a, 0, 2 * BLOCK).unwrap();
    let b = manager.add_sequence();
    manager.prepare_write(b, 0, 2 * BLOCK).unwrap();
    let mut freed = manager.block_table(a).unwrap().to_vec();
    manager.free_sequence(a).unwrap();
    let c = manager.add_sequence();
    manager.prepare_write(c, 0, 2 * BLOCK).unwrap();
    let mut reused = manager.block_table(c).unwrap().to_vec();
    freed.sort_unstable();
    reused.sort_unstable();
    assert_eq!(reused, freed);
    assert_eq!(manager.stats().peak_used_blocks, 4);
}
