//! Quantized models on disk: `save_quantized` writes packed codes, scales and zero points with the scheme in
//! the file's metadata, and loading gives back the same quantized layers (bit for bit) and the same logits.

mod common;

use common::{B, tokens};
use ember_model::nn::{Embedding, Linear};
use ember_model::{
    ModelDir, ModelError, QUANTIZED_FILE, QuantScheme, Quantization, Transformer, load,
    save_quantized,
};

const IDS: [u32; 10] = [5, 17, 99, 3, 64, 64, 12, 0, 127, 45];

fn model(tied: bool) -> Transformer<B> {
    common::small_llama(5, tied, true)
}

fn logits(model: &Transformer<B>) -> Vec<f32> {
    model
        .forward(tokens(&IDS))
        .unwrap()
        .into_data()
        .into_vec::<f32>()
        .unwrap()
}

fn quantized(tied: bool, scheme: &str, lm_head: bool, embeddings: bool) -> Transformer<B> {
    model(tied)
        .quantize(&Quantization {
            scheme: scheme.parse::<QuantScheme>().unwrap(),
            lm_head,
            embeddings,
        })
        .unwrap()
}

/// The reloaded model holds the very same codes and scales on the same backend and runs the same kernels, so
/// its logits are bit-identical: no tolerance.
#[test]
fn a_saved_quantized_model_loads_with_identical_weights_and_logits() {
    let cases = [
        ("int8", false, true, false),
        ("int4-g32", false, true, true),
        ("int4-g64-asym", true, true, false),
        ("int8-g32", true, true, true),
        ("int4-g32", true, false, false),
    ];
    for (scheme, tied, lm_head, embeddings) in cases {
        let what = format!("{scheme} tied={tied} head={lm_head} emb={embeddings}");
        let original = quantized(tied, scheme, lm_head, embeddings);
        let dir = tempfile::tempdir().unwrap();
        save_quantized(&original, dir.path()).unwrap();
        assert!(dir.path().join(QUANTIZED_FILE).is_file());
        assert!(ModelDir::open(dir.path()).unwrap().is_quantized());
        let loaded = load::<B>(dir.path(), &Default::default(), None).unwrap();
        assert!(
            loaded.unused.is_empty(),
            "{what}: unused {:?}",
            loaded.unused
        );
        let reloaded = loaded.model;
        for name in [
            "layers.0.attn.q.weight",
            "layers.1.mlp.down.weight",
            "embed.weight",
            "lm_head.weight",
        ] {
            assert_eq!(
                reloaded.quantized_weight(name).unwrap(),
                original.quantized_weight(name).unwrap(),
                "{what}: {name}"
            );
        }
        assert_eq!(
            matches!(reloaded.embed, Embedding::Quantized(_)),
            embeddings,
            "{what}"
        );
        assert_eq!(
            reloaded.lm_head.as_ref().map(Linear::is_quantized),
            original.lm_head.as_ref().map(Linear::is_quantized),
            "{what}: LM head"
        );
        assert_eq!(
            reloaded.weight_memory_bytes(),
            original.weight_memory_bytes()
        );
        assert_eq!(logits(&reloaded), logits(&original), "{what}");
    }
}

#[test]
fn the_file_records_each_scheme_in_its_metadata() {
    let dir = tempfile::tempdir().unwrap();
    save_quantized(&quantized(false, "int4-g32-asym", true, false), dir.path()).unwrap();
    let bytes = std::fs::read(dir.path().join(QUANTIZED_FILE)).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let metadata = header.metadata().as_ref().unwrap();
    assert_eq!(metadata["format"], "ember-quantized-v1");
    let entries: serde_json::Value = serde_json::from_str(&metadata["ember.quantization"]).unwrap();
    assert_eq!(
        entries["layers.0.attn.q.weight"],
        serde_json::json!({"scheme": "int4-g32-asym", "shape": [64, 64]})
    );
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let names: Vec<String> = file.names().into_iter().cloned().collect();
    for suffix in ["qcodes", "scales", "mins"] {
        let name = format!("layers.0.attn.q.weight.{suffix}");
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    assert!(
        names.contains(&"layers.0.attn.q.bias".to_string()),
        "biases stay dense"
    );
}

#[test]
fn a_damaged_quantized_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    save_quantized(&quantized(false, "int8", true, false), dir.path()).unwrap();
    let path = dir.path().join(QUANTIZED_FILE);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = load::<B>(dir.path(), &Default::default(), None)
        .err()
        .unwrap();
    assert!(err.to_string().contains(QUANTIZED_FILE), "{err}");

    // A config whose shapes disagree with the stored weights: the tensor and both shapes are named.
    save_quantized(&quantized(false, "int8", true, false), dir.path()).unwrap();
    let config = dir.path().join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("\"intermediate_size\": 96", "\"intermediate_size\": 80"),
    )
    .unwrap();
    let err = load::<B>(dir.path(), &Default::default(), None)
        .err()
        .unwrap();
    assert!(
        matches!(&err, ModelError::ShapeMismatch { name, .. } if name.contains("mlp")),
        "{err}"
    );
}
