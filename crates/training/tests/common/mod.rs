//! What the transformer training tests share: a small LLaMA-style model and a cyclic token stream it can learn.

use burn::backend::{Autodiff, Flex};
use ember_model::{ModelSpec, Transformer};
use ember_training::InMemoryData;

pub type B = Autodiff<Flex>;

/// Tokens per training window.
pub const BLOCK: usize = 8;

/// A LLaMA-style model over a 32-token vocabulary (`ModelSpec::llama_style` arguments after the vocabulary),
/// initialised from seed 5.
pub fn transformer(
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    intermediate: usize,
) -> Transformer<B> {
    let spec = ModelSpec::llama_style(32, hidden, layers, heads, kv_heads, intermediate, BLOCK);
    Transformer::init(&spec, 5, &Default::default()).unwrap()
}

/// 3,000 tokens of a noisy cycle over 32 ids: the first 2,500 train, the rest validate (2 batches).
pub fn cyclic_data(batch: usize) -> InMemoryData {
    let tokens: Vec<u32> = (0..3000u32).map(|i| (i * 7 + i / 5) % 32).collect();
    InMemoryData::new(
        tokens[..2500].to_vec(),
        tokens[2500..].to_vec(),
        batch,
        BLOCK,
        2,
        1.0,
        9,
    )
    .unwrap()
}
