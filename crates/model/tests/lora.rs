//! LoRA adapters: targets per family, a fresh adapter changes nothing, merging equals applying, PEFT's files
//! round-trip, the base is frozen, and bad adapter files are errors naming what is wrong.

mod common;

use std::path::Path;

use burn::backend::Autodiff;
use burn::tensor::{Int, Tensor, TensorData};
use common::{B, fixture};
use ember_model::Transformer;
use ember_model::lora::{self, LoraSettings, PeftAdapter};

fn load<Be: ember_model::EmberBackend>(name: &str) -> Transformer<Be> {
    ember_model::load::<Be>(&fixture(name), &Default::default(), None)
        .unwrap()
        .model
}

fn settings(targets: &[&str]) -> LoraSettings {
    LoraSettings {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: targets.iter().map(|t| t.to_string()).collect(),
    }
}

fn logits<Be: ember_model::EmberBackend>(model: &Transformer<Be>) -> Vec<f32> {
    let ids: Vec<i64> = vec![3, 17, 42, 99, 5, 64, 1, 120];
    let tokens = Tensor::<Be, 2, Int>::from_data(TensorData::new(ids, [1, 8]), &Default::default());
    model
        .forward(tokens)
        .unwrap()
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// An adapter of `model`'s shape with every matrix drawn from a fixed pseudo-random sequence of scale `scale`.
fn random_adapter(model: &Transformer<B>, settings: &LoraSettings, scale: f32) -> PeftAdapter {
    let mut state = 12345u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
    };
    let weights = lora::select_modules(model.spec(), &settings.targets)
        .unwrap()
        .into_iter()
        .map(|m| {
            let a = (0..settings.rank * m.inputs).map(|_| next()).collect();
            let b = (0..m.outputs * settings.rank).map(|_| next()).collect();
            (m.hf_path, a, b)
        })
        .collect();
    PeftAdapter {
        dir: "random".into(),
        settings: settings.clone(),
        weights,
    }
}

#[test]
fn targets_are_the_familys_module_names_and_stacked_projections_are_refused() {
    let llama = load::<B>("llama3");
    let all = lora::adaptable_modules(llama.spec()).unwrap();
    // 2 layers × (q, k, v, o, gate, up, down).
    assert_eq!(all.len(), 14);
    assert_eq!(all[0].hf_path, "model.layers.0.self_attn.q_proj");
    let picked =
        lora::select_modules(llama.spec(), &["v_proj".into(), "mlp.down_proj".into()]).unwrap();
    let paths: Vec<&str> = picked.iter().map(|m| m.hf_path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "model.layers.0.self_attn.v_proj",
            "model.layers.0.mlp.down_proj",
            "model.layers.1.self_attn.v_proj",
            "model.layers.1.mlp.down_proj"
        ]
    );
    let error = lora::select_modules(llama.spec(), &["proj".into()])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("`proj`")
            && error.contains("down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"),
        "{error}"
    );

    // Phi-3 fuses q/k/v and gate/up into one checkpoint tensor each; GPT-2's c_attn likewise, and its Conv1D
    // layers store weights [in, out] (PEFT's fan_in_fan_out).
    let phi3 = load::<B>("phi3");
    let error = lora::select_modules(phi3.spec(), &["qkv_proj".into()])
        .unwrap_err()
        .to_string();
    assert!(error.contains("valid names: down_proj, o_proj"), "{error}");
    let gpt2 = load::<B>("gpt2");
    assert!(lora::select_modules(gpt2.spec(), &["c_attn".into()]).is_err());
    let c_fc = lora::select_modules(gpt2.spec(), &["c_fc".into()]).unwrap();
    assert!(!c_fc.is_empty() && c_fc.iter().all(|m| m.transposed && m.name() == "c_fc"));
}

#[test]
fn a_fresh_adapter_changes_nothing_and_a_trained_one_merges_into_the_weights() {
    let base = load::<B>("llama3");
    let before = logits(&base);
    let s = settings(&[
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]);
    let fresh = base.with_lora(&s, 3).unwrap();
    // B starts at zero, so the update is exactly zero and each layer's output is bit-identical.
    assert_eq!(logits(&fresh), before);
    assert_eq!(fresh.lora_adapters().unwrap().len(), 14);

    let adapter = random_adapter(&fresh, &s, 0.2);
    let adapted = load::<B>("llama3").with_adapter(&adapter).unwrap();
    let applied = logits(&adapted);
    assert!(
        max_diff(&applied, &before) > 1e-2,
        "the adapter changed nothing"
    );

    // Saving writes the merged weights (W + alpha/r · B·A); loaded back without an adapter they give the same
    // logits up to f32 rounding: one rounding of the merged sum against two added products, on logits of
    // order 1, so 1e-5 is a few dozen ulps.
    let dir = tempfile::tempdir().unwrap();
    ember_model::save(&adapted, dir.path()).unwrap();
    let merged = ember_model::load::<B>(dir.path(), &Default::default(), None)
        .unwrap()
        .model;
    assert!(!merged.has_lora());
    assert!(
        max_diff(&logits(&merged), &applied) < 1e-5,
        "{}",
        max_diff(&logits(&merged), &applied)
    );
}

#[test]
fn peft_files_round_trip_bit_exactly() {
    let s = settings(&["q_proj", "v_proj"]);
    let adapted = load::<B>("llama3")
        .with_adapter(&random_adapter(&load::<B>("llama3"), &s, 0.2))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    lora::save_adapter(&adapted, &s, Some("base"), dir.path()).unwrap();
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join(lora::ADAPTER_CONFIG_FILE)).unwrap(),
    )
    .unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(
        config["target_modules"],
        serde_json::json!(["q_proj", "v_proj"])
    );
    assert_eq!(config["fan_in_fan_out"], false);
    let read = lora::read_adapter(dir.path()).unwrap();
    assert_eq!(read.settings, s);
    assert_eq!(read.weights.len(), 4);
    let reloaded = load::<B>("llama3").with_adapter(&read).unwrap();
    assert_eq!(logits(&reloaded), logits(&adapted));
}

#[test]
fn only_the_adapters_receive_gradients() {
    type AB = Autodiff<B>;
    let model = load::<AB>("llama3")
        .with_lora(&settings(&["q_proj", "down_proj"]), 1)
        .unwrap();
    let ids: Vec<i64> = vec![3, 17, 42, 99, 5, 64];
    let tokens = Tensor::<AB, 2, Int>::from_data(TensorData::new(ids, [1, 6]), &Default::default());
    let loss = model.forward(tokens).unwrap().powi_scalar(2).mean();
    let grads = loss.backward();
    let mut with_grad = Vec::new();
    for (module, adapter) in model.lora_adapters().unwrap() {
        assert!(
            adapter.a.val().grad(&grads).is_some(),
            "{}: no gradient for A",
            module.hf_path
        );
        let b = adapter.b.val().grad(&grads).expect("B has a gradient");
        // A is random and B zero: B's gradient is the product of the layer's input and output gradients, not 0.
        let norm: f32 = b.abs().sum().into_scalar();
        assert!(norm > 0.0, "{}", module.hf_path);
        with_grad.push(module.hf_path);
    }
    assert_eq!(with_grad.len(), 4);
    for layer in &model.layers {
        for (name, linear) in [
            ("q", &layer.attn.q),
            ("k", &layer.attn.k),
            ("down", &layer.mlp.down),
        ] {
            if let ember_model::nn::Linear::Dense(dense) = linear {
                assert!(
                    dense.weight.val().grad(&grads).is_none(),
                    "frozen {name} has a gradient"
                );
            }
        }
    }
    if let ember_model::nn::Embedding::Dense(embed) = &model.embed {
        assert!(
            embed.val().grad(&grads).is_none(),
            "the frozen embedding has a gradient"
        );
    }
}

fn write_adapter(dir: &Path, config: serde_json::Value) {
    std::fs::write(dir.join(lora::ADAPTER_CONFIG_FILE), config.to_string()).unwrap();
}

#[test]
fn bad_adapters_are_errors_naming_the_key_or_tensor() {
    let s = settings(&["q_proj"]);
    let adapted = load::<B>("llama3")
        .with_adapter(&random_adapter(&load::<B>("llama3"), &s, 0.1))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    lora::save_adapter(&adapted, &s, None, dir.path()).unwrap();
    let good: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join(lora::ADAPTER_CONFIG_FILE)).unwrap(),
    )
    .unwrap();
    let with = |key: &str, value: serde_json::Value| {
        let mut c = good.clone();
        c[key] = value;
        c
    };
    for (config, expected) in [
        (with("use_dora", true.into()), "`use_dora`"),
        (with("r", 0.into()), "`r`"),
        (with("peft_type", "IA3".into()), "`peft_type`"),
        (with("target_modules", ".*proj".into()), "`target_modules`"),
        (
            with("rank_pattern", serde_json::json!({"q_proj": 8})),
            "`rank_pattern`",
        ),
        // The file's matrices are rank 4: a config saying 8 does not fit them.
        (with("r", 8.into()), "expected [8, in]"),
    ] {
        write_adapter(dir.path(), config);
        let error = lora::read_adapter(dir.path()).unwrap_err().to_string();
        assert!(error.contains(expected), "{expected}: {error}");
    }
    // A target whose matrices are missing, and an adapter for another model's modules.
    write_adapter(
        dir.path(),
        with("target_modules", serde_json::json!(["q_proj", "v_proj"])),
    );
    let adapter = lora::read_adapter(dir.path()).unwrap();
    let error = load::<B>("llama3")
        .with_adapter(&adapter)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("v_proj") && error.contains("no matrices"),
        "{error}"
    );
    write_adapter(dir.path(), good.clone());
    let adapter = lora::read_adapter(dir.path()).unwrap();
    let error = load::<B>("gpt2")
        .with_adapter(&adapter)
        .unwrap_err()
        .to_string();
    assert!(error.contains("model.layers.0.self_attn.q_proj"), "{error}");
    // Not a safetensors file.
    std::fs::write(
        dir.path().join(lora::ADAPTER_WEIGHTS_FILE),
        b"not safetensors",
    )
    .unwrap();
    assert!(lora::read_adapter(dir.path()).is_err());
}
