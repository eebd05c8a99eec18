//! Saving in the Hugging Face layout and loading back: ember's own models, and checkpoints loaded from
//! transformers, come back with identical logits; transformers itself loads what ember saves.

mod common;

use common::{B, expected, fixture, floats, max_abs_diff, tokens};
use ember_model::weights::{Checkpoint, RandomInit};
use ember_model::{ModelError, ModelSpec, Transformer, load, save};

fn logits(model: &Transformer<B>, ids: &[u32]) -> Vec<f32> {
    model
        .forward(tokens(ids))
        .unwrap()
        .into_data()
        .into_vec::<f32>()
        .unwrap()
}

const IDS: [u32; 12] = [5, 17, 99, 3, 64, 64, 12, 0, 127, 45, 8, 31];

#[test]
fn initialised_model_saved_and_reloaded_gives_identical_logits() {
    let device = Default::default();
    let mut spec = ModelSpec::llama_style(128, 32, 2, 4, 2, 64, 64);
    for tied in [false, true] {
        spec.features.tied_embeddings = tied;
        let model = Transformer::<B>::from_source(
            &spec,
            &mut RandomInit::with_std(3, 2, 0.3),
            &device,
            None,
        )
        .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        save(&model, tmp.path()).unwrap();
        let reloaded = load::<B>(tmp.path(), &device, None).unwrap();
        assert!(reloaded.unused.is_empty(), "{:?}", reloaded.unused);
        assert_eq!(reloaded.model.spec(), &spec);
        // Same f32 weights through the same code on the same backend: bit-identical, no tolerance needed.
        assert_eq!(
            logits(&model, &IDS),
            logits(&reloaded.model, &IDS),
            "tied = {tied}"
        );
    }
}

#[test]
fn same_seed_gives_the_same_weights_and_another_seed_does_not() {
    let device = Default::default();
    let spec = ModelSpec::llama_style(64, 16, 1, 2, 1, 32, 16);
    let a = logits(
        &Transformer::<B>::init(&spec, 1, &device).unwrap(),
        &[1, 2, 3],
    );
    let b = logits(
        &Transformer::<B>::init(&spec, 1, &device).unwrap(),
        &[1, 2, 3],
    );
    let c = logits(
        &Transformer::<B>::init(&spec, 2, &device).unwrap(),
        &[1, 2, 3],
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn loaded_checkpoints_save_back_under_their_own_names_and_reload_identically() {
    let device = Default::default();
    for name in [
        "gpt2",
        "llama3",
        "llama_tied",
        "mistral",
        "phi3",
        "qwen2",
        "qwen3",
        "gpt_neox",
        "gpt_neo",
        "gemma2",
        "gemma3",
    ] {
        let model = load::<B>(&fixture(name), &device, None).unwrap().model;
        let tmp = tempfile::tempdir().unwrap();
        save(&model, tmp.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Stacked tensors (Phi-3 qkv/gate_up, GPT-2 c_attn, NeoX query_key_value) are reassembled under the
        // original names, so the saved tensor set equals transformers' own.
        let original: Vec<String> = Checkpoint::open(&fixture(name))
            .unwrap()
            .names()
            .map(String::from)
            .collect();
        let saved: Vec<String> = Checkpoint::open(tmp.path())
            .unwrap()
            .names()
            .map(String::from)
            .collect();
        assert_eq!(saved, original, "{name}");
        let reloaded = load::<B>(tmp.path(), &device, None).unwrap().model;
        assert_eq!(reloaded.spec(), model.spec(), "{name}");
        let ids = &expected(name).tokens;
        assert_eq!(logits(&model, ids), logits(&reloaded, ids), "{name}");
    }
}

#[test]
fn ember_saved_model_loads_in_transformers_with_the_same_logits() {
    let dir = fixture("ember_llama");
    let bytes = std::fs::read(dir.join("ember_logits.safetensors")).unwrap();
    let recorded = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ids: Vec<u32> = recorded
        .tensor("tokens")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect();
    let model = load::<B>(&dir, &Default::default(), None).unwrap().model;
    let diff = max_abs_diff(&logits(&model, &ids), &floats(&recorded, "logits"));
    // Same weights and code as when the fixture was written; only a change in ember's forward could move it.
    assert!(
        diff <= 1e-5,
        "ember's logits drifted from the recorded ones by {diff}"
    );
    let check: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("transformers_check.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(check["passed"], true, "{check}");
    assert!(check["max_abs_diff"].as_f64().unwrap() <= 1e-4, "{check}");
}

#[test]
fn spec_a_family_cannot_express_is_refused_with_the_reason() {
    let mut spec = ModelSpec::llama_style(64, 16, 1, 2, 1, 32, 16);
    spec.features.qk_norm = true;
    let model = Transformer::<B>::init(&spec, 0, &Default::default()).unwrap();
    let err = save(&model, tempfile::tempdir().unwrap().path()).unwrap_err();
    assert!(matches!(err, ModelError::Unsaveable { .. }), "{err}");
    assert!(err.to_string().contains("Q/K norm"), "{err}");
}

#[test]
fn a_knob_the_config_would_silently_drop_is_refused_naming_it() {
    // LLaMA's config.json has no key for a dynamic-NTK base length other than max_position_embeddings, so
    // this spec would load back with a different one: the re-parse check must catch what to_config does not.
    let mut spec = ModelSpec::llama_style(64, 16, 1, 2, 1, 32, 16);
    if let ember_model::Positions::Rope(rope) = &mut spec.positions {
        rope.scaling = ember_model::RopeScaling::Dynamic {
            factor: 2.0,
            max_position_embeddings: 8,
        };
    }
    let model = Transformer::<B>::init(&spec, 0, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err = save(&model, dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::Unsaveable { .. }), "{err}");
    assert!(err.to_string().contains("`positions`"), "{err}");
    assert!(
        !dir.path().join("config.json").exists(),
        "nothing is written for a spec that cannot be saved"
    );
}
