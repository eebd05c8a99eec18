//! End-to-end tests of `ember info` and `ember logits` against committed fixtures.

mod common;

use std::process::Command;

use common::{ember_cpu, model_fixture};

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn info_reports_exact_llama_parameter_counts_from_config_alone() {
    let out = run_ok(
        ember_cpu()
            .args(["info", "--model"])
            .arg(model_fixture("configs/llama2_7b.json")),
    );
    assert!(out.contains("6,738,415,616"), "{out}");
    let out = run_ok(
        ember_cpu()
            .args(["info", "--model"])
            .arg(model_fixture("configs/llama3_8b.json")),
    );
    assert!(out.contains("8,030,261,248"), "{out}");
    assert!(out.contains("32 query, 8 key/value"), "{out}");
    // 8,030,261,248 bf16 weights = 16,060,522,496 bytes = 14.96 GiB.
    assert!(out.contains("weights bf16       14.96 GiB"), "{out}");
}

#[test]
fn info_json_has_the_spec_and_sizes() {
    let out = run_ok(
        ember_cpu()
            .args(["info", "--json", "--model"])
            .arg(model_fixture("qwen3")),
    );
    let value: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(value["spec"]["architecture"], "Qwen3ForCausalLM");
    assert_eq!(value["spec"]["qk_norm"], true);
    assert_eq!(value["parameters"], 32_992);
    assert_eq!(value["weight_bytes"]["f32"], 4 * 32_992);
}

#[test]
fn info_on_an_unknown_architecture_fails_listing_supported_ones() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("config.json"),
        r#"{"architectures": ["T5ForConditionalGeneration"]}"#,
    )
    .unwrap();
    let out = ember_cpu()
        .args(["info", "--model"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("T5ForConditionalGeneration") && err.contains("LlamaForCausalLM"),
        "{err}"
    );
}

/// Reads the recorded tokens and logits of a fixture.
fn recorded(path: &std::path::Path) -> (Vec<i64>, Vec<f32>, Vec<usize>) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tokens = st.tensor("tokens").unwrap();
    let logits = st.tensor("logits").unwrap();
    (
        tokens
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        logits
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        logits.shape().to_vec(),
    )
}

#[test]
fn logits_command_reproduces_transformers_logits() {
    let (tokens, expected, shape) = recorded(&model_fixture("phi3/expected.safetensors"));
    let list: Vec<String> = tokens.iter().map(i64::to_string).collect();
    let tmp = tempfile::tempdir().unwrap();
    let output = tmp.path().join("logits.safetensors");
    run_ok(
        ember_cpu()
            .args(["logits", "--attention", "manual", "--model"])
            .arg(model_fixture("phi3"))
            .args(["--tokens", &list.join(",")])
            .arg("--output")
            .arg(&output),
    );
    let (written_tokens, logits, written_shape) = recorded(&output);
    assert_eq!(written_tokens, tokens);
    assert_eq!(written_shape, shape);
    let diff = logits
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // Same tolerance as the library's parity tests: fp32 on both sides, different summation order.
    assert!(diff <= 1e-4, "max |ember - transformers| = {diff}");
}

#[test]
fn logits_rejects_token_ids_outside_the_vocabulary() {
    let tmp = tempfile::tempdir().unwrap();
    let out = ember_cpu()
        .args(["logits", "--model"])
        .arg(model_fixture("gpt2"))
        .args(["--tokens", "1,2,500", "--output"])
        .arg(tmp.path().join("x.safetensors"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("token id 500") && err.contains("vocabulary of 128"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
