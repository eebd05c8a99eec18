//! Decode-shaped linear layers (one token, and four and eight: a batched server's steps; SmolLM2-135M widths) and
//! prefill-shaped ones (a 128-token prompt): dense f32 matmul against `QuantizedLinear` for each scheme and
//! `GgmlLinear` for the common ggml block types, on its default integer path (`ggml`: the decode kernel, or on
//! CPUs with AVX-512 VNNI the integer tiles from 5 rows) and its exact f32 one (`ggml-exact`; random blocks: the
//! kernels' speed does not depend on the values), on the reference CPU backend.
//!
//! Run: `cargo bench -p ember-optimization --bench quantized_linear`

// `criterion_group!` generates a public function it gives no doc comment.
#![allow(missing_docs)]

use std::time::Duration;

use burn::backend::Flex;
use burn::tensor::{Distribution, Tensor};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ember_attention::GgmlProducts;
use ember_ggml::GgmlType;
use ember_optimization::{GgmlLinear, GgmlWeight, QuantScheme, QuantizedLinear};

type B = Flex;

/// `[out_features, in_features]`: attention/MLP projections and the tied LM head of SmolLM2-135M.
const SHAPES: [(&str, [usize; 2]); 3] = [
    ("mlp_up_1536x576", [1536, 576]),
    ("mlp_down_576x1536", [576, 1536]),
    ("lm_head_49152x576", [49152, 576]),
];

/// Rows of a prefill-shaped input: a 128-token prompt.
const PREFILL_ROWS: usize = 128;

fn bench(c: &mut Criterion) {
    let device = Default::default();
    let cases = SHAPES
        .iter()
        .map(|&(name, shape)| ("decode_linear", name, shape, 1))
        .chain(
            SHAPES[..2]
                .iter()
                .map(|&(name, shape)| ("decode4_linear", name, shape, 4)),
        )
        .chain(
            SHAPES[..2]
                .iter()
                .map(|&(name, shape)| ("decode8_linear", name, shape, 8)),
        )
        .chain(
            SHAPES[..2]
                .iter()
                .map(|&(name, shape)| ("prefill_linear", name, shape, PREFILL_ROWS)),
        );
    for (kind, name, [out_features, in_features], rows) in cases {
        let mut group = c.benchmark_group(format!("{kind}/{name}"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3));
        let weight = Tensor::<B, 2>::random(
            [out_features, in_features],
            Distribution::Normal(0.0, 0.02),
            &device,
        );
        let x = Tensor::<B, 2>::random([rows, in_features], Distribution::Default, &device);
        let dense = weight.clone().transpose();
        group.bench_function("f32", |b| {
            b.iter(|| x.clone().matmul(dense.clone()).into_data())
        });
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            // K-quant rows are whole 256-element super-blocks; SmolLM2's 576-wide rows are not.
            let (block_len, _) = ty.block_geometry().expect("a block type");
            if !in_features.is_multiple_of(block_len) {
                continue;
            }
            let mut layer = GgmlLinear::<B>::new(
                random_blocks(ty, [out_features, in_features]),
                None,
                &device,
            )
            .expect("whole blocks");
            for (path, products) in [
                ("ggml", GgmlProducts::Integer),
                ("ggml-exact", GgmlProducts::Exact),
            ] {
                layer.set_products(products);
                group.bench_with_input(BenchmarkId::new(path, ty), &layer, |b, layer| {
                    b.iter(|| layer.forward(x.clone()).into_data());
                });
            }
        }
        for scheme in ["int8", "int4-g32", "int4-g32-asym", "int4-g128"] {
            let parsed: QuantScheme = scheme.parse().expect("valid scheme");
            let layer = QuantizedLinear::quantize(weight.clone(), None, parsed)
                .expect("finite weights quantize");
            group.bench_with_input(BenchmarkId::from_parameter(scheme), &layer, |b, layer| {
                b.iter(|| layer.forward(x.clone()).into_data())
            });
        }
        group.finish();
    }
}

/// A `[rows, cols]` weight of `ty` blocks of pseudo-random bytes with small finite f16 scales (at the offsets
/// of the types benchmarked here).
fn random_blocks(ty: GgmlType, [rows, cols]: [usize; 2]) -> GgmlWeight {
    let (block_len, block_bytes) = ty.block_geometry().expect("a block type");
    let mut state = 0x9e37_79b9u32;
    let mut blocks: Vec<u8> = (0..rows * cols / block_len * block_bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect();
    let fields: &[usize] = match ty {
        GgmlType::Q6_K => &[208],
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        _ => &[0, 2],
    };
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    for block in blocks.chunks_exact_mut(block_bytes) {
        for &at in fields {
            block[at..at + 2].copy_from_slice(&scale);
        }
    }
    GgmlWeight::new(ty, [rows, cols], blocks).expect("whole blocks")
}

criterion_group!(benches, bench);
criterion_main!(benches);
