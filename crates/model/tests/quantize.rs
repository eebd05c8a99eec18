//! Quantized models: the quantized forward equals the forward of the same model with the dequantized weights in
//! f32, memory shrinks as the schemes say, and tied heads are handled as configured.

mod common;

use common::{B, max_abs_diff, tokens};
use ember_model::nn::{Embedding, Linear};
use ember_model::{QuantScheme, Quantization, Transformer, load, save};

const IDS: [u32; 12] = [5, 17, 99, 3, 64, 64, 12, 0, 127, 45, 8, 31];

fn model(tied: bool, biases: bool) -> Transformer<B> {
    common::small_llama(11, tied, biases)
}

fn logits(model: &Transformer<B>) -> Vec<f32> {
    model
        .forward(tokens(&IDS))
        .unwrap()
        .into_data()
        .into_vec::<f32>()
        .unwrap()
}

fn quantization(scheme: &str, lm_head: bool, embeddings: bool) -> Quantization {
    Quantization {
        scheme: scheme.parse::<QuantScheme>().unwrap(),
        lm_head,
        embeddings,
    }
}

/// Saving a quantized model writes its dequantized weights; loading those as f32 gives the model the quantized
/// forward must equal. The only difference is the order of f32 accumulation in the tiled matmul (a tile's
/// partial sums vs one matmul), so 1e-4 on logits of magnitude ~1 is ample; quantization error itself (~1e-2
/// for int4) would fail it.
#[test]
fn quantized_forward_equals_dense_forward_of_dequantized_weights() {
    let device = Default::default();
    for (scheme, tied, biases) in [
        ("int8", false, true),
        ("int8-g32", true, false),
        ("int4-g32", false, false),
        ("int4-g64-asym", true, true),
    ] {
        for embeddings in [false, true] {
            // A tied model with an f32 table and a quantized head has two different heads, which a tied
            // checkpoint cannot express; quantize its head only together with the table.
            let q = quantization(scheme, embeddings || !tied, embeddings);
            let quantized = model(tied, biases).quantize(&q).unwrap();
            let tmp = tempfile::tempdir().unwrap();
            save(&quantized, tmp.path()).unwrap();
            let dense = load::<B>(tmp.path(), &device, None).unwrap().model;
            let diff = max_abs_diff(&logits(&quantized), &logits(&dense));
            assert!(diff < 1e-4, "{scheme} tied={tied} emb={embeddings}: {diff}");
            let error = max_abs_diff(&logits(&quantized), &logits(&model(tied, biases)));
            assert!(
                error > 1e-4,
                "{scheme}: the weights really were quantized ({error})"
            );
        }
    }
}

/// Quantization error grows as bits shrink: int8 logits stay closer to f32 than int4-g128.
#[test]
fn int8_is_closer_to_f32_than_int4() {
    let reference = logits(&model(false, false));
    let error = |scheme: &str| {
        let q = quantization(scheme, true, true);
        max_abs_diff(
            &logits(&model(false, false).quantize(&q).unwrap()),
            &reference,
        )
    };
    let (int8, int4_g32, int4_g128) = (error("int8"), error("int4-g32"), error("int4-g128"));
    assert!(
        int8 < int4_g32 && int8 < int4_g128,
        "{int8} {int4_g32} {int4_g128}"
    );
}

#[test]
fn tied_head_follows_the_configuration() {
    let tied = model(true, false);
    let f32_bytes = tied.weight_memory_bytes();
    // The head alone: a quantized copy of the embedding, which stays f32.
    let head_only = model(true, false)
        .quantize(&quantization("int8", true, false))
        .unwrap();
    assert!(matches!(head_only.lm_head, Some(Linear::Quantized(_))));
    assert!(matches!(head_only.embed, Embedding::Dense(_)));
    // Both: the quantized table is the head, stored once.
    let both = model(true, false)
        .quantize(&quantization("int8", true, true))
        .unwrap();
    assert!(both.lm_head.is_none());
    assert!(matches!(both.embed, Embedding::Quantized(_)));
    // Neither: projections only.
    let blocks_only = model(true, false)
        .quantize(&quantization("int8", false, false))
        .unwrap();
    assert!(blocks_only.lm_head.is_none());
    assert!(blocks_only.layers[0].attn.q.is_quantized());
    assert!(both.weight_memory_bytes() < blocks_only.weight_memory_bytes());
    assert!(blocks_only.weight_memory_bytes() < f32_bytes);
    assert!(
        head_only.weight_memory_bytes() > blocks_only.weight_memory_bytes(),
        "a tied model quantizing only its head keeps the f32 table and adds a quantized copy"
    );
}

/// Weight memory against the arithmetic of each scheme: every matrix element costs 4 bytes in f32, 1 byte
/// plus a 4-byte scale per row (int8) or half a byte plus 4 bytes per 32 elements (int4-g32); under a 4-bit
/// scheme the LM head (the last matrix) is INT8 per channel.
#[test]
fn weight_memory_matches_each_scheme() {
    let f32_model = model(false, false);
    let spec = f32_model.spec().clone();
    let (h, i, v) = (spec.hidden_size, spec.intermediate_size, spec.vocab_size);
    let kv = spec.num_kv_heads * spec.head_dim;
    // Per layer: q, k, v, o, gate, up, down as (rows, cols).
    let layer = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)];
    let matrices: Vec<(usize, usize)> = layer
        .iter()
        .copied()
        .cycle()
        .take(layer.len() * spec.num_layers)
        .chain([(v, h)])
        .collect();
    let dense_rest =
        f32_model.weight_memory_bytes() - 4 * matrices.iter().map(|(r, c)| r * c).sum::<usize>();
    let int8 = model(false, false)
        .quantize(&quantization("int8", true, false))
        .unwrap();
    let int8_expected: usize = matrices.iter().map(|(r, c)| r * c + 4 * r).sum();
    assert_eq!(int8.weight_memory_bytes(), dense_rest + int8_expected);
    let int4 = model(false, false)
        .quantize(&quantization("int4-g32", true, false))
        .unwrap();
    let (head, blocks) = matrices.split_last().unwrap();
    let int4_expected: usize = blocks
        .iter()
        .map(|(r, c)| r * c.div_ceil(2) + 4 * r * c.div_ceil(32))
        .sum::<usize>()
        + head.0 * head.1
        + 4 * head.0;
    assert_eq!(int4.weight_memory_bytes(), dense_rest + int4_expected);
}
