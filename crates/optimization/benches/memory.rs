//! Memory figures (not timings): weight bytes of SmolLM2-135M per quantization scheme, and peak
//! KV-cache bytes of a contiguous vs a paged cache for a batch of 16 prompts of mixed lengths,
//! the paged figure taken from the pool's statistics. Prints Markdown tables.
//!
//! Run: `cargo bench -p ember-optimization --bench memory`

use ember_optimization::{BlockManager, PagedKvConfig, QuantScheme, QuantizedWeight};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// SmolLM2-135M: 30 layers, hidden 576, MLP 1536, 9 query / 3 KV heads of 64, vocab 49152 with
/// the LM head tied to the embedding.
const LAYERS: usize = 30;
const HIDDEN: usize = 576;
const MLP: usize = 1536;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const VOCAB: usize = 49152;

fn main() {
    weights_table();
    kv_table();
}

fn weights_table() {
    let kv = KV_HEADS * HEAD_DIM;
    // (shape, count in the model): q, k, v, o, gate, up, down per layer, and the tied embedding.
    let linears = [
        ([HIDDEN, HIDDEN], 2 * LAYERS),
        ([kv, HIDDEN], 2 * LAYERS),
        ([MLP, HIDDEN], 2 * LAYERS),
        ([HIDDEN, MLP], LAYERS),
        ([VOCAB, HIDDEN], 1),
    ];
    let f32_bytes: usize = linears.iter().map(|([o, i], n)| 4 * o * i * n).sum();
    println!("| scheme | weight bytes (linears + tied embedding) | vs f32 |");
    println!("|---|---:|---:|");
    println!("| f32 | {f32_bytes} | 1.000 |");
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    for scheme in [
        "int8",
        "int8-g32",
        "int4-g32",
        "int4-g64",
        "int4-g128",
        "int4-g32-asym",
    ] {
        let scheme: QuantScheme = scheme.parse().expect("valid scheme");
        let bytes: usize = linears
            .iter()
            .map(|&([o, i], n)| {
                let w: Vec<f32> = (0..o * i).map(|_| rng.random_range(-0.05..0.05)).collect();
                let q = QuantizedWeight::quantize(&w, [o, i], scheme).expect("finite weights");
                q.storage_bytes() * n
            })
            .sum();
        println!(
            "| {scheme} | {bytes} | {:.3} |",
            bytes as f64 / f32_bytes as f64
        );
    }
    println!();
}

fn kv_table() {
    let batch = 16;
    let new_tokens = 128;
    let mut rng = ChaCha8Rng::seed_from_u64(16);
    let prompts: Vec<usize> = (0..batch).map(|_| rng.random_range(16..=512)).collect();
    let max_prompt = *prompts.iter().max().expect("non-empty batch");
    let token_bytes = PagedKvConfig::new(LAYERS, KV_HEADS, HEAD_DIM).token_bytes(4);
    // A contiguous batched cache left-pads every prompt to the longest and holds
    // batch × (max_prompt + new_tokens) positions (with_capacity sized for the whole run).
    let contiguous = batch * (max_prompt + new_tokens) * token_bytes;
    println!(
        "prompts (tokens): {prompts:?}; {new_tokens} new tokens each; f32 K/V, {token_bytes} bytes/token"
    );
    println!("| cache | block size | peak blocks | peak KV bytes | vs contiguous |");
    println!("|---|---:|---:|---:|---:|");
    println!("| contiguous (padded batch) | - | - | {contiguous} | 1.000 |");
    for block_size in [16, 32] {
        let config = PagedKvConfig::new(LAYERS, KV_HEADS, HEAD_DIM).with_block_size(block_size);
        let total = (batch * (max_prompt + new_tokens)).div_ceil(block_size) + batch;
        let mut manager = BlockManager::new(total, block_size, LAYERS);
        let seqs: Vec<_> = prompts.iter().map(|_| manager.add_sequence()).collect();
        for (&seq, &len) in seqs.iter().zip(&prompts) {
            for layer in 0..LAYERS {
                manager
                    .prepare_write(seq, layer, len)
                    .expect("budget sized for the run");
            }
        }
        for _ in 0..new_tokens {
            for &seq in &seqs {
                for layer in 0..LAYERS {
                    manager
                        .prepare_write(seq, layer, 1)
                        .expect("budget sized for the run");
                }
            }
        }
        let stats = manager.stats();
        let paged = stats.peak_used_blocks * config.block_bytes(4);
        println!(
            "| paged | {block_size} | {} | {paged} | {:.3} |",
            stats.peak_used_blocks,
            paged as f64 / contiguous as f64
        );
    }
    // Parallel sampling: 16 continuations of one 512-token prompt share it through `fork`.
    let block_size = 16;
    let config = PagedKvConfig::new(LAYERS, KV_HEADS, HEAD_DIM).with_block_size(block_size);
    let mut manager = BlockManager::new(4096, block_size, LAYERS);
    let root = manager.add_sequence();
    for layer in 0..LAYERS {
        manager
            .prepare_write(root, layer, 512)
            .expect("budget sized for the run");
    }
    let mut seqs = vec![root];
    seqs.extend((1..batch).map(|_| manager.fork(root).expect("root is live")));
    for _ in 0..new_tokens {
        for &seq in &seqs {
            for layer in 0..LAYERS {
                manager
                    .prepare_write(seq, layer, 1)
                    .expect("budget sized for the run");
            }
        }
    }
    let stats = manager.stats();
    let shared = stats.peak_used_blocks * config.block_bytes(4);
    let unshared = batch * (512 + new_tokens) * token_bytes;
    println!(
        "| paged, 16 forks of one 512-token prompt | {block_size} | {} | {shared} | {:.3} (of {unshared}) |",
        stats.peak_used_blocks,
        shared as f64 / unshared as f64
    );
}
