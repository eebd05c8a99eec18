//! Activation checkpointing (`training.checkpoint_activations`): gradients computed block by block, with each
//! block recomputed from its stored input, equal the whole graph's on every family's fixture, for full and LoRA
//! fine-tuning.

use std::collections::BTreeSet;
use std::path::PathBuf;

use burn::backend::{Autodiff, Flex};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use ember_model::Transformer;
use ember_model::lora::LoraSettings;
use ember_training::{Gradients, TrainableModel};

type AB = Autodiff<Flex>;

fn fixture(name: &str) -> Transformer<AB> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures")
        .join(name);
    ember_model::load::<AB>(&dir, &Default::default(), None)
        .unwrap()
        .model
}

/// Two rows of 13 ids (below every fixture's vocabulary of 128), longer than the sliding windows (6 and 8), so
/// the windowed layers' masks matter; split into inputs and shifted targets.
fn batch() -> (Tensor<AB, 2, Int>, Tensor<AB, 2, Int>) {
    let ids: Vec<i64> = (0..26).map(|i| (i * 37 + i / 3) % 128).collect();
    let rows = Tensor::<AB, 2, Int>::from_data(TensorData::new(ids, [2, 13]), &Default::default());
    (rows.clone().slice([0..2, 0..12]), rows.slice([0..2, 1..13]))
}

fn values(t: &Tensor<Flex, 1>) -> Vec<f32> {
    t.clone()
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap()
}

/// The whole graph's loss times `weight` and gradients, as the trainer computes them without checkpointing.
fn whole(model: &Transformer<AB>, weight: f64) -> (f64, Gradients<Flex>) {
    let (inputs, targets) = batch();
    let loss = model.loss(inputs, targets).unwrap().mul_scalar(weight);
    let value = loss.clone().into_scalar().elem::<f64>();
    (value, Gradients::from_backward(model, loss.backward()))
}

fn assert_equal_gradients(name: &str, model: &Transformer<AB>) -> BTreeSet<String> {
    // A weight other than 1, as micro-batches and data-parallel shards pass: it must scale everything.
    let weight = 0.375;
    let (loss, expected) = whole(model, weight);
    let (inputs, targets) = batch();
    let (checkpointed_loss, got) = model
        .checkpointed_gradients(inputs, targets, weight)
        .unwrap();
    // The same forward kernels on the same inputs: the loss agrees to f32 rounding of ~4.8 nats.
    assert!(
        (loss - checkpointed_loss).abs() < 1e-6,
        "{name}: loss {checkpointed_loss} vs {loss}"
    );
    let names: BTreeSet<String> = expected.names().map(str::to_string).collect();
    assert_eq!(
        got.names().map(str::to_string).collect::<BTreeSet<_>>(),
        names,
        "{name}: parameters with a gradient"
    );
    for param in &names {
        let (a, b) = (
            values(got.get(param).unwrap()),
            values(expected.get(param).unwrap()),
        );
        let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
        let err = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
            / scale;
        // Each piece runs the whole graph's kernels on the same values, and on burn-flex every gradient was
        // measured bitwise equal; the bound leaves room for a backend that sums the residual stream's gradient
        // contributions in another order (a few ulps relative to the largest entry). A block that ignores its
        // upstream gradient, a tied head's missing share or a wrong scale is off by O(1) or more (measured: 500+).
        assert!(err < 1e-5, "{name}: {param} differs by {err} (relative)");
    }
    names
}

#[test]
fn checkpointed_gradients_equal_the_whole_graphs_for_every_family() {
    // Tied and untied heads, learned positions and biases (GPT-2, GPT-Neo), parallel blocks (NeoX), stacked
    // projections (Phi-3), q/k norms (Qwen3, Gemma 3), soft-capping, scaled embeddings and sliding windows
    // (Gemma 2 and 3, whose local layers have their own RoPE base).
    for name in [
        "llama_tied",
        "llama3",
        "gpt2",
        "gpt_neo",
        "gpt_neox",
        "qwen2",
        "qwen3",
        "phi3",
        "gemma2",
        "gemma3",
    ] {
        let names = assert_equal_gradients(name, &fixture(name));
        assert!(
            names.contains("embed"),
            "{name}: the embeddings got no gradient: {names:?}"
        );
    }
}

fn lora(dropout: f64) -> LoraSettings {
    LoraSettings {
        rank: 4,
        alpha: 8.0,
        dropout,
        targets: ["q_proj", "v_proj", "down_proj"].map(String::from).to_vec(),
    }
}

#[test]
fn checkpointed_lora_gradients_reach_only_the_adapters() {
    for name in ["llama3", "gemma2"] {
        let model = fixture(name).with_lora(&lora(0.0), 3).unwrap();
        let names = assert_equal_gradients(name, &model);
        assert!(!names.is_empty());
        assert!(
            names.iter().all(|n| n.contains("lora")),
            "{name}: a frozen weight got a gradient: {names:?}"
        );
    }
}

#[test]
fn adapters_with_dropout_are_refused() {
    let model = fixture("llama3").with_lora(&lora(0.1), 3).unwrap();
    let (inputs, targets) = batch();
    let err = model
        .checkpointed_gradients(inputs, targets, 1.0)
        .map(|(loss, _)| loss)
        .unwrap_err()
        .to_string();
    assert!(err.contains("training.lora.dropout"), "{err}");
}
