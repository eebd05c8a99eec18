//! A GGUF model whose matrices are of every block type ember keeps packed (and one F16 matrix it cannot),
//! loaded with `load_quantized`: its logits equal the f32-dequantized load's, the ggml matrices stay packed
//! (their bytes as in the file, the q/k row permutation undone on whole rows of blocks), and the F16 matrix is
//! reported as dequantized.
//!
//! The file is written here by `gguf_writer` from seeded random blocks (every integer field random, the f16
//! scales finite and small), so no fixture is committed; the values of each type are pinned bit for bit to
//! ggml's by ember-optimization's tests/ggml_blocks.rs.

mod common;
#[path = "gguf_writer/mod.rs"]
mod gguf_writer;

use common::{B, max_abs_diff, tokens};
use ember_model::GgmlProducts;
use ember_model::gguf::{self, GgmlType, GgufFile};
use ember_model::nn::{Embedding, Linear};
use gguf_writer::{Tensor, Value, f16_bits, f16_bytes, f32_bytes, values};

/// 256 columns everywhere (one K-quant super-block); four heads of 64, two KV heads, MLP 512.
const HIDDEN: u64 = 256;
const FFN: u64 = 512;
const VOCAB: u64 = 32;

/// Byte offsets of each block's f16 fields (ggml's block structs).
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    }
}

/// `inner x outer` random blocks of `ty` with f16 fields of about ±2e-3 (weights of a few hundredths, so the
/// activations of two layers stay moderate).
fn random_blocks(ty: GgmlType, inner: u64, outer: u64, seed: u32) -> Vec<u8> {
    let (block_len, block_bytes) = ty.block_geometry().unwrap();
    let n = (inner * outer) as usize / block_len;
    let mut bytes: Vec<u8> = values(n * block_bytes, seed)
        .iter()
        .map(|v| ((v + 0.5) * 255.0) as u8)
        .collect();
    let scales = values(n * 2, seed ^ 0x5bd1);
    for (i, block) in bytes.chunks_exact_mut(block_bytes).enumerate() {
        for (k, &at) in f16_fields(ty).iter().enumerate() {
            let d = 4e-3 * scales[2 * i + k];
            block[at..at + 2].copy_from_slice(&f16_bits(d).to_le_bytes());
        }
    }
    bytes
}

fn matrix(name: &str, inner: u64, outer: u64, ty: GgmlType, seed: u32) -> Tensor {
    let data = match ty {
        GgmlType::F32 => f32_bytes(&values((inner * outer) as usize, seed)),
        GgmlType::F16 => f16_bytes(
            &values((inner * outer) as usize, seed)
                .iter()
                .map(|v| v * 0.1)
                .collect::<Vec<_>>(),
        ),
        ty => random_blocks(ty, inner, outer, seed),
    };
    Tensor {
        name: name.to_string(),
        dims: vec![inner, outer],
        ggml_type: ty.id(),
        data,
    }
}

fn norm(name: &str) -> Tensor {
    Tensor {
        name: name.to_string(),
        dims: vec![HIDDEN],
        ggml_type: GgmlType::F32.id(),
        data: f32_bytes(&vec![1.0; HIDDEN as usize]),
    }
}

/// The two layers' matrix types, in the order q, k, v, output, gate, up, down.
const LAYERS: [[GgmlType; 7]; 2] = {
    use GgmlType::*;
    [
        [Q4_K, Q5_K, Q3_K, IQ4_XS, Q2_K, IQ4_NL, Q6_K],
        [Q5_0, Q4_0, Q8_0, Q4_1, Q5_1, F16, F32],
    ]
};

fn mixed_llama() -> Vec<u8> {
    let tokens: Vec<String> = (0..VOCAB).map(|i| format!("t{i}")).collect();
    let metadata = vec![
        ("general.architecture", Value::Str("llama".into())),
        ("llama.context_length", Value::U32(64)),
        ("llama.embedding_length", Value::U32(HIDDEN as u32)),
        ("llama.block_count", Value::U32(2)),
        ("llama.feed_forward_length", Value::U32(FFN as u32)),
        ("llama.attention.head_count", Value::U32(4)),
        ("llama.attention.head_count_kv", Value::U32(2)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.rope.freq_base", Value::F32(10_000.0)),
        ("tokenizer.ggml.model", Value::Str("gpt2".into())),
        ("tokenizer.ggml.tokens", Value::Strs(tokens)),
        (
            "tokenizer.ggml.token_type",
            Value::I32s(vec![1; VOCAB as usize]),
        ),
        ("tokenizer.ggml.merges", Value::Strs(vec!["t 1".into()])),
        ("tokenizer.ggml.eos_token_id", Value::U32(1)),
    ];
    // Tied: the Q6_K table is also the LM head.
    let mut tensors = vec![
        matrix("token_embd.weight", HIDDEN, VOCAB, GgmlType::Q6_K, 1),
        norm("output_norm.weight"),
    ];
    for (layer, types) in LAYERS.iter().enumerate() {
        let name = |s: &str| format!("blk.{layer}.{s}.weight");
        let seed = 10 * layer as u32 + 2;
        let shapes = [
            ("attn_q", HIDDEN, HIDDEN),
            ("attn_k", HIDDEN, HIDDEN / 2),
            ("attn_v", HIDDEN, HIDDEN / 2),
            ("attn_output", HIDDEN, HIDDEN),
            ("ffn_gate", HIDDEN, FFN),
            ("ffn_up", HIDDEN, FFN),
            ("ffn_down", FFN, HIDDEN),
        ];
        tensors.push(norm(&name("attn_norm")));
        tensors.push(norm(&name("ffn_norm")));
        for (i, ((tensor, inner, outer), &ty)) in shapes.iter().zip(types).enumerate() {
            tensors.push(matrix(&name(tensor), *inner, *outer, ty, seed + i as u32));
        }
    }
    gguf_writer::write(&metadata, &tensors).0
}

#[test]
fn a_gguf_of_every_block_type_kept_packed_gives_the_dequantized_logits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.gguf");
    std::fs::write(&path, mixed_llama()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let device = Default::default();
    let packed = gguf::load_quantized::<B>(&file, &device, None).unwrap();
    let dense = gguf::load::<B>(&file, &device, None).unwrap();

    assert!(
        matches!(packed.embed, Embedding::Ggml(_)),
        "the Q6_K table stays packed"
    );
    let attn = &packed.layers[0].attn;
    assert!(matches!(
        (&attn.q, &attn.k),
        (Linear::Ggml(_), Linear::Ggml(_))
    ));
    assert!(
        matches!(packed.layers[1].attn.v, Linear::Ggml(_)),
        "Q8_0 stays as its blocks"
    );
    assert!(
        matches!(packed.layers[1].mlp.up, Linear::Dense(_)),
        "F16 is dequantized"
    );
    assert_eq!(
        gguf::unpacked_matrices(&file).unwrap(),
        vec![("blk.1.ffn_up.weight".to_string(), GgmlType::F16)]
    );

    // Memory: each ggml matrix takes its file bytes exactly; the other tensors f32.
    let expected: usize = file
        .tensors()
        .iter()
        .map(|t| {
            let n = t.n_elements() as usize;
            match t.ggml_type {
                GgmlType::F32 | GgmlType::F16 => 4 * n,
                _ => t.n_bytes().unwrap() as usize,
            }
        })
        .sum();
    assert_eq!(packed.weight_memory_bytes(), expected);

    // 3 tokens take the decode kernel, 20 the tiled gemm path. On the exact path both loads multiply the same
    // dequantized values (bit-exact), in different orders: f32 sums of 256-512 terms differ by about 1e-6
    // relative per layer, so 1e-4 of the largest logit (about 140 here; seen: 4e-5 absolute on 3 tokens, 0 on
    // 20, where the tiles meet the same gemm as the dense weights) leaves a wide margin, while rows left permuted
    // are off by 79. The default integer decode path rounds every activation to 8 bits (at most half a step of
    // max |x| / 127 per 32 values, crates/attention's ggml decode tests bound it per product); through two random
    // layers that moved the logits by up to 1.5 of 140 here (random weights make no small outputs cancel), so 3%
    // of the largest logit (4.2) bounds it with room and still sees a permuted row (79). 20 tokens on the default
    // path take the integer prompt kernel where the CPU has AVX-512 VNNI (the same rounding, the same bound),
    // else the exact tiles.
    let logits = |model: &ember_model::Transformer<B>, ids: &[u32]| {
        model
            .forward(tokens(ids))
            .unwrap()
            .into_data()
            .into_vec::<f32>()
            .unwrap()
    };
    for (len, exact) in [(3, true), (20, true), (3, false), (20, false)] {
        let products = if exact {
            GgmlProducts::Exact
        } else {
            GgmlProducts::Integer
        };
        let packed = packed.clone().with_ggml_products(products);
        let ids: Vec<u32> = (0..len).map(|i| (i * 7 + 3) % VOCAB as u32).collect();
        let (got, want) = (logits(&packed, &ids), logits(&dense, &ids));
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = max_abs_diff(&got, &want);
        let bound = if exact { 1e-4 } else { 3e-2 };
        assert!(
            scale > 1e-2 && diff <= bound * scale.max(1.0),
            "{len} tokens (exact: {exact}): max |packed - dequantized| = {diff}, logits up to {scale}"
        );
    }

    // The setting is each model's, not the process's: an exact and an integer copy of one model, alive
    // together and run in turns, each keep their own arithmetic (the integer copy's 8-bit activations move its
    // logits; the exact copy repeats itself bit for bit).
    let exact = packed.clone().with_ggml_products(GgmlProducts::Exact);
    let integer = packed.with_ggml_products(GgmlProducts::Integer);
    let ids = [3, 10, 17];
    let (first, other, again) = (
        logits(&exact, &ids),
        logits(&integer, &ids),
        logits(&exact, &ids),
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&first),
        bits(&again),
        "the exact copy kept its setting"
    );
    assert_ne!(bits(&first), bits(&other), "the integer copy kept its own");
}
