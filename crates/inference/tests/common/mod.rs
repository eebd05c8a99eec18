//! Shared test support: a small random LLaMA-style transformer and full-recomputation logits to check cached
//! paths against.

#![allow(dead_code)]

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use ember_inference::{KvCacheKind, TransformerLm};
use ember_model::weights::RandomInit;
use ember_model::{ModelSpec, Transformer};

/// GQA (4 query heads, 2 KV heads of 8 dimensions), 2 layers, vocab 96, context 48; std 0.3 keeps logits far from
/// uniform so argmax ties are unlikely.
pub fn tiny(cache: KvCacheKind) -> TransformerLm<Flex> {
    let device = Default::default();
    let spec = ModelSpec::llama_style(96, 32, 2, 4, 2, 64, 48);
    let model = Transformer::<Flex>::from_source(
        &spec,
        &mut RandomInit::with_std(3, spec.num_layers, 0.3),
        &device,
        None,
    )
    .unwrap();
    TransformerLm::new(model, device).with_kv_cache(cache)
}

/// Last-position logits of `ids` computed from scratch, without a cache.
pub fn full_logits(lm: &TransformerLm<Flex>, ids: &[u32]) -> Vec<f32> {
    let data = TensorData::new(
        ids.iter().map(|&i| i64::from(i)).collect::<Vec<_>>(),
        [1, ids.len()],
    );
    let tokens = Tensor::<Flex, 2, Int>::from_data(data, &Default::default());
    let logits = lm.model().forward(tokens).unwrap();
    let [_, seq, vocab] = logits.dims();
    logits
        .slice([0..1, seq - 1..seq, 0..vocab])
        .into_data()
        .into_vec()
        .unwrap()
}

/// Attention over a cache (or over gathered blocks and masked padding columns) sums in a different order than
/// over the full sequence; f32 differences stay within a few ulps of logits of magnitude ~10, so 1e-4 absolute
/// has margin while a wrong position, mask or block would be off by O(1).
pub fn assert_close(got: &[f32], want: &[f32], what: &str) {
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst < 1e-4, "{what}: max |diff| {worst}");
}
