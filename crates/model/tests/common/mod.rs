//! Helpers shared by the model crate's integration tests: the fixture directory and its recorded outputs.

#![allow(dead_code)]

use std::path::PathBuf;

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use safetensors::SafeTensors;
use safetensors::tensor::Dtype;

/// The reference backend of every library test.
pub type B = Flex;

/// Every parity fixture written by scripts/fixtures/model_fixtures.py.
pub const FIXTURES: [&str; 12] = [
    "gpt2",
    "llama3",
    "llama_tied",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "gpt_neox",
    "gpt_neox_sequential",
    "gpt_neo",
    "gemma2",
    "gemma3",
];

/// `crates/model/tests/fixtures/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join("tests")
    .join("fixtures")
    .join(name)
}

/// What transformers recorded for a fixture.
pub struct Expected {
    /// The input ids.
    pub tokens: Vec<u32>,
    /// Logits `[T * vocab]`, row-major.
    pub logits: Vec<f32>,
    /// The greedy continuation.
    pub greedy: Vec<u32>,
    /// Smallest top-1 minus top-2 logit along the continuation.
    pub greedy_min_gap: f32,
    /// PyTorch's parameter count.
    pub num_parameters: u64,
}

fn ints(st: &SafeTensors<'_>, name: &str) -> Vec<u32> {
    let view = st.tensor(name).unwrap();
    assert_eq!(view.dtype(), Dtype::I64);
    view.data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect()
}

/// Reads a float tensor of a safetensors file.
pub fn floats(st: &SafeTensors<'_>, name: &str) -> Vec<f32> {
    let view = st.tensor(name).unwrap();
    assert_eq!(view.dtype(), Dtype::F32);
    view.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Reads `expected.safetensors` of fixture `name`.
pub fn expected(name: &str) -> Expected {
    let bytes = std::fs::read(fixture(name).join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    Expected {
        tokens: ints(&st, "tokens"),
        logits: floats(&st, "logits"),
        greedy: ints(&st, "greedy"),
        greedy_min_gap: floats(&st, "greedy_min_gap")[0],
        num_parameters: ints(&st, "num_parameters")[0] as u64,
    }
}

/// `ids` as a `[1, len]` token tensor.
pub fn tokens(ids: &[u32]) -> Tensor<B, 2, Int> {
    let data: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(data, [1, ids.len()]), &Default::default())
}

/// Largest absolute element-wise difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Index of the largest value.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding of `steps` tokens after `prompt`, token by token through a contiguous KV cache.
pub fn greedy(model: &ember_model::Transformer<B>, prompt: &[u32], steps: usize) -> Vec<u32> {
    let vocab = model.spec().vocab_size;
    let mut cache = ember_attention::ContiguousKvCache::<B>::new(model.spec().num_layers);
    let mut input = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..steps {
        let step = ember_model::Step {
            cache: Some(&mut cache),
            ..ember_model::Step::default()
        };
        let logits = model.forward_with(tokens(&input), step).unwrap();
        let values = logits.into_data().into_vec::<f32>().unwrap();
        let next = argmax(&values[values.len() - vocab..]);
        out.push(next);
        input = vec![next];
    }
    out
}

/// A random LLaMA-style model for the quantization tests (vocab 128, hidden 64, 2 layers, 4/2 heads, MLP 96,
/// context 64; std 0.3), optionally with a tied head and attention biases, from `seed`.
pub fn small_llama(seed: u64, tied: bool, biases: bool) -> ember_model::Transformer<B> {
    let mut spec = ember_model::ModelSpec::llama_style(128, 64, 2, 4, 2, 96, 64);
    spec.features.tied_embeddings = tied;
    if biases {
        // LLaMA's config has one switch for all attention biases.
        spec.features.biases.qkv = true;
        spec.features.biases.attn_out = true;
    }
    ember_model::Transformer::from_source(
        &spec,
        &mut ember_model::weights::RandomInit::with_std(seed, 2, 0.3),
        &Default::default(),
        None,
    )
    .unwrap()
}
