//! Micro-benchmarks of the operations that dominate generation, on burn-flex (the CPU backend), at SmolLM2-135M's
//! sizes (hidden 576, MLP 1536, 9 query / 3 KV heads of 64, vocabulary 49 152).
//!
//! `cargo bench -p ember-bench --bench hot_ops -- --quick` gives a figure per op in well under a minute.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::time::Duration;

use burn::backend::Flex;
use burn::module::Param;
use burn::tensor::{Distribution, Tensor, activation};
use criterion::{BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use ember_attention::{AttentionKernel, AttentionOptions, Rope, RopeConfig, attention};
use ember_inference::sampling::{Sampler, SamplingConfig};
use ember_model::NormKind;
use ember_model::nn::Norm;

type B = Flex;

const HIDDEN: usize = 576;
const MLP: usize = 1536;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const VOCAB: usize = 49_152;

fn normal<const D: usize>(shape: [usize; D]) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), &Default::default())
}

/// The MLP up-projection of one decode token `[1, 576] x [576, 1536]` and of a 128-token prefill
/// `[128, 576] x [576, 1536]`: against a contiguous `[in, out]` weight, and against the transposed view of a
/// PyTorch-layout `[out, in]` weight (how checkpoints store it), through `x · Wᵀ` and through `(W · xᵀ)ᵀ`.
fn matmul(c: &mut Criterion) {
    let w_in_out = normal([HIDDEN, MLP]);
    let w_out_in = normal([MLP, HIDDEN]);
    let mut group = c.benchmark_group("matmul");
    for rows in [1, 128] {
        let x = normal([rows, HIDDEN]);
        group.bench_function(
            BenchmarkId::new("x·W[in,out]", format!("{rows}x{HIDDEN}x{MLP}")),
            |b| b.iter(|| black_box(x.clone().matmul(w_in_out.clone())).into_data()),
        );
        group.bench_function(
            BenchmarkId::new("x·W[out,in]ᵀ", format!("{rows}x{HIDDEN}x{MLP}")),
            |b| b.iter(|| black_box(x.clone().matmul(w_out_in.clone().transpose())).into_data()),
        );
        group.bench_function(
            BenchmarkId::new("(W[out,in]·xᵀ)ᵀ", format!("{rows}x{HIDDEN}x{MLP}")),
            |b| {
                b.iter(|| {
                    black_box(w_out_in.clone().matmul(x.clone().transpose()).transpose())
                        .into_data()
                })
            },
        );
    }
    group.finish();
}

/// ember's RMSNorm over `[1, seq, 576]` activations.
fn rms_norm(c: &mut Criterion) {
    let norm = Norm::<B> {
        weight: Param::from_tensor(normal([HIDDEN])),
        bias: None,
        kind: NormKind::RmsNorm,
        eps: 1e-5,
        unit_offset: false,
    };
    let mut group = c.benchmark_group("rms_norm");
    for seq in [1, 128] {
        let x = normal([1, seq, HIDDEN]);
        group.bench_function(BenchmarkId::from_parameter(seq), |b| {
            b.iter(|| norm.forward(x.clone()).into_data())
        });
    }
    group.finish();
}

/// ember's rotary embedding on queries `[1, 9, seq, 64]` at position offset 0 (prefill) or 127 (a decode step).
fn rope(c: &mut Criterion) {
    let rope = Rope::<B>::new(RopeConfig::new(HEAD_DIM), 2048, &Default::default())
        .expect("valid RoPE config");
    let mut group = c.benchmark_group("rope");
    for (seq, offset) in [(1, 127), (128, 0)] {
        let q = normal([1, HEADS, seq, HEAD_DIM]);
        group.bench_function(BenchmarkId::from_parameter(seq), |b| {
            b.iter(|| rope.apply(q.clone(), offset).into_data())
        });
    }
    group.finish();
}

/// Each attention kernel for one decode query over 512 cached keys, and for a causal 128-token prefill.
fn attention_kernels(c: &mut Criterion) {
    let mut group = c.benchmark_group("attention");
    for (q_len, kv_len) in [(1, 512), (128, 128)] {
        let q = normal([1, HEADS, q_len, HEAD_DIM]);
        let k = normal([1, KV_HEADS, kv_len, HEAD_DIM]);
        let v = normal([1, KV_HEADS, kv_len, HEAD_DIM]);
        let options = AttentionOptions::causal().with_offset(kv_len - q_len);
        for kernel in AttentionKernel::ALL {
            let id = BenchmarkId::new(kernel.name(), format!("q{q_len}_kv{kv_len}"));
            group.bench_function(id, |b| {
                b.iter(|| attention(kernel, q.clone(), k.clone(), v.clone(), &options).into_data())
            });
        }
    }
    group.finish();
}

/// Softmax over a vocabulary row: on the device (burn) and on the host (ember-inference's sampler path).
fn softmax(c: &mut Criterion) {
    let logits = normal([1, VOCAB]);
    let host: Vec<f32> = logits.clone().into_data().into_vec().expect("f32 logits");
    let mut group = c.benchmark_group("softmax");
    group.bench_function("device_1x49152", |b| {
        b.iter(|| activation::softmax(logits.clone(), 1).into_data())
    });
    group.bench_function("host_49152", |b| {
        b.iter(|| ember_inference::sampling::softmax(black_box(&host)))
    });
    group.finish();
}

/// Choosing one token from 49 152 logits: greedy, and temperature + top-k + top-p sampling.
fn sampling(c: &mut Criterion) {
    let logits: Vec<f32> = normal([VOCAB]).into_data().into_vec().expect("f32 logits");
    let history: Vec<u32> = (0..128).collect();
    let mut group = c.benchmark_group("sampling");
    let configs = [
        ("greedy", SamplingConfig::greedy()),
        (
            "t0.8_topk50_topp0.95",
            SamplingConfig {
                temperature: 0.8,
                top_k: Some(50),
                top_p: Some(0.95),
                ..Default::default()
            },
        ),
    ];
    for (name, config) in configs {
        let mut sampler = Sampler::new(&config);
        group.bench_function(name, |b| {
            b.iter(|| sampler.sample(black_box(&logits), &history))
        });
    }
    group.finish();
}

fn quick() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = quick();
    targets = matmul, rms_norm, rope, attention_kernels, softmax, sampling
}
criterion_main!(benches);
