//! A batched decode step's attention over the paged KV pool, every layer of SmolLM2-135M (30 layers, 9 query
//! and 3 KV heads of 64): reading the blocks in place (`PagedKvPool::attend`) against gathering a dense copy
//! and running the flash kernel over it, for 1 row at a 512-token context and 8 rows at 96 tokens, with the
//! rows' blocks interleaved in the storage as a server's are.
//!
//! Run: `cargo bench -p ember-optimization --bench paged_attention`

// `criterion_group!` generates a public function it gives no doc comment.
#![allow(missing_docs)]

use std::time::Duration;

use burn::backend::Flex;
use burn::tensor::{Distribution, Tensor};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ember_attention::{AttentionKernel, AttentionOptions, attention};
use ember_optimization::{PagedKvConfig, PagedKvPool, SeqId};

type B = Flex;

const LAYERS: usize = 30;
const Q_HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;

/// A pool holding `rows` sequences of `len` positions in every layer, appended 16 at a time in turn.
fn filled(rows: usize, len: usize) -> (PagedKvPool<B>, Vec<SeqId>) {
    let device = Default::default();
    let config = PagedKvConfig::new(LAYERS, KV_HEADS, HEAD_DIM).with_budget_bytes(1 << 30);
    let mut pool = PagedKvPool::<B>::new(config, &device).expect("pool");
    let seqs: Vec<SeqId> = (0..rows).map(|_| pool.add_sequence()).collect();
    for start in (0..len).step_by(16) {
        let n = 16.min(len - start);
        for &seq in &seqs {
            for layer in 0..LAYERS {
                let chunk = || {
                    Tensor::<B, 3>::random([KV_HEADS, n, HEAD_DIM], Distribution::Default, &device)
                };
                pool.append(seq, layer, chunk(), chunk()).expect("append");
            }
        }
    }
    (pool, seqs)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("paged_attention");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(4));
    for (rows, len) in [(1, 512), (8, 96)] {
        let (pool, seqs) = filled(rows, len);
        let q = Tensor::<B, 4>::random(
            [rows, Q_HEADS, 1, HEAD_DIM],
            Distribution::Default,
            &Default::default(),
        );
        let options = AttentionOptions::causal().with_offset(len - 1);
        let case = format!("{rows}x{len}");
        group.bench_function(BenchmarkId::new("in_place", &case), |b| {
            b.iter(|| {
                for layer in 0..LAYERS {
                    let out = pool.attend(&seqs, layer, &q, &options).expect("attend");
                    std::hint::black_box(out.expect("burn-flex attends in place"));
                }
            })
        });
        group.bench_function(BenchmarkId::new("gather_flash", &case), |b| {
            b.iter(|| {
                for layer in 0..LAYERS {
                    let kv = pool.gather(&seqs, layer).expect("gather");
                    let out = attention(
                        AttentionKernel::Flash,
                        q.clone(),
                        kv.keys,
                        kv.values,
                        &options,
                    );
                    std::hint::black_box(out);
                }
            })
        });
        // One layer thirty times: the same work with the keys and values in cache, to tell memory from compute.
        group.bench_function(BenchmarkId::new("in_place_cached", &case), |b| {
            b.iter(|| {
                for _ in 0..LAYERS {
                    let out = pool.attend(&seqs, 0, &q, &options).expect("attend");
                    std::hint::black_box(out);
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
