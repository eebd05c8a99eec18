//! `ember train` from a pretrained checkpoint (`model.from`): full fine-tuning and LoRA, end to end on the CPU
//! backend. The base is a tiny model ember trains first, so its directory holds a tokenizer as downloaded models
//! do.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{ok, run_cpu};

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

const CORPUS_LINE: &str =
    "ROMEO: speak, sweet love, speak {i} times.\nJULIET: not I, my lord; the night is young.\n\n";

/// A corpus, and a base model trained on it for a few steps (its `best/` holds config, weights and tokenizer).
fn base_model(dir: &Path) -> PathBuf {
    let text: String = (0..400)
        .map(|i| CORPUS_LINE.replace("{i}", &i.to_string()))
        .collect();
    std::fs::write(dir.join("corpus.txt"), text).unwrap();
    let config = dir.join("base.yaml");
    std::fs::write(
        &config,
        r#"
name: base
seed: 7
data: {inputs: [corpus.txt], cache_dir: cache}
tokenizer: {vocab_size: 300}
model: {hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, intermediate_size: 64, block_size: 64, tie_embeddings: false}
training: {batch_size: 4, max_steps: 30, warmup_steps: 2, learning_rate: 1.0e-2, min_learning_rate: 1.0e-3, log_interval: 1, eval_interval: 30, eval_batches: 2, checkpoint_interval: 30}
"#,
    )
    .unwrap();
    let out = dir.join("base");
    ok(run_cpu(&[
        "train",
        "--config",
        path(&config),
        "--out",
        path(&out),
    ]));
    out.join("best")
}

/// A fine-tuning config on the same corpus starting from `from`, with `extra` YAML appended under `training:`.
fn finetune_config(dir: &Path, name: &str, from: &Path, extra: &str) -> PathBuf {
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            r#"
name: {name}
seed: 11
data: {{inputs: [corpus.txt], cache_dir: cache}}
model: {{from: {from}, block_size: 16}}
training:
  batch_size: 4
  max_steps: 4
  warmup_steps: 1
  learning_rate: 1.0e-2
  log_interval: 1
  eval_interval: 2
  eval_batches: 2
  checkpoint_interval: 2
{extra}
"#,
            from = from.display()
        ),
    )
    .unwrap();
    config
}

fn losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| v.get("loss").and_then(|l| l.as_f64()))
        .collect()
}

fn tensor_names(file: &Path) -> BTreeSet<String> {
    let bytes = std::fs::read(file).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    tensors.names().into_iter().cloned().collect()
}

fn logits(model: &Path, extra: &[&str], out: &Path) -> Vec<f32> {
    let mut args = vec![
        "logits",
        "--model",
        path(model),
        "--tokens",
        "5,17,42,99,3,250",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--output", path(out)]);
    ok(run_cpu(&args));
    let bytes = std::fs::read(out).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    tensors
        .tensor("logits")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn lora_trains_adapters_only_saves_peft_and_merged_models_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let base = base_model(dir.path());
    let lora = "  lora: {rank: 4, alpha: 8, targets: [q_proj, v_proj, down_proj]}";
    let config = finetune_config(dir.path(), "lora", &base, lora);
    let straight = dir.path().join("straight");
    ok(run_cpu(&[
        "train",
        "--config",
        path(&config),
        "--out",
        path(&straight),
    ]));

    let best = straight.join("best");
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(best.join(file).is_file(), "best/{file} missing");
    }
    let adapter = best.join("adapter");
    let peft_config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(peft_config["peft_type"], "LORA");
    assert_eq!(peft_config["r"], 4);
    assert_eq!(peft_config["lora_alpha"], 8.0);
    // PEFT's keys: two layers × three targets × (A, B), nothing else.
    let keys = tensor_names(&adapter.join("adapter_model.safetensors"));
    let mut expected = BTreeSet::new();
    for layer in 0..2 {
        for module in ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"] {
            for part in ["lora_A", "lora_B"] {
                expected.insert(format!(
                    "base_model.model.model.layers.{layer}.{module}.{part}.weight"
                ));
            }
        }
    }
    assert_eq!(keys, expected);

    // The base is frozen: AdamW holds state for the adapters only (each of its tensors is a moment of one).
    let state = tensor_names(&straight.join("last").join("optimizer.safetensors"));
    assert!(!state.is_empty());
    assert!(
        state.iter().all(|name| name.contains(".lora.")),
        "optimizer state for a frozen weight: {state:?}"
    );
    let train = losses(&straight);
    assert_eq!(train.len(), 4);
    assert!(train.iter().all(|l| l.is_finite()), "{train:?}");

    // The adapter applied unmerged to the base gives the merged model's logits. Both are f32; the merged
    // weight rounds W + s·B·A once, the unmerged path adds two products instead, so they differ by f32
    // rounding of values of order 1: 1e-4 is ~100 ulps of the logits, far below what a wrong scale or a
    // transposed matrix would change (the adapter moves the logits by more than 1e-2, checked below).
    let merged = logits(&best, &[], &dir.path().join("merged.safetensors"));
    let applied = logits(
        &base,
        &["--adapter", path(&adapter)],
        &dir.path().join("applied.safetensors"),
    );
    let plain = logits(&base, &[], &dir.path().join("plain.safetensors"));
    assert!(
        max_diff(&merged, &applied) < 1e-4,
        "{}",
        max_diff(&merged, &applied)
    );
    assert!(
        max_diff(&merged, &plain) > 1e-2,
        "the adapter changed nothing"
    );

    // Stopped after 2 steps and resumed: the same losses bit for bit (adapters and moments round-trip in f32, the
    // frozen base is reloaded from model.from).
    let split = dir.path().join("split");
    ok(run_cpu(&[
        "train",
        "--config",
        path(&config),
        "--out",
        path(&split),
        "--max-steps",
        "2",
    ]));
    ok(run_cpu(&[
        "train",
        "--config",
        path(&config),
        "--out",
        path(&split),
        "--resume",
    ]));
    assert_eq!(losses(&split), train);
}

#[test]
fn full_fine_tuning_starts_from_the_pretrained_weights() {
    let dir = tempfile::tempdir().unwrap();
    let base = base_model(dir.path());
    let config = finetune_config(dir.path(), "full", &base, "");
    let run = dir.path().join("full");
    ok(run_cpu(&[
        "train",
        "--config",
        path(&config),
        "--out",
        path(&run),
    ]));
    let tuned = losses(&run);
    let base_losses = losses(&dir.path().join("base"));
    // The first fine-tuning step sees the pretrained model: its loss is that of the base's last steps, not
    // the ~ln(300) = 5.7 nats of a fresh model (the base's first loss). Within 0.5 nats: a fresh batch of the
    // same corpus, and the base's last loss was itself measured before its last update.
    let (first, base_first, base_last) = (tuned[0], base_losses[0], *base_losses.last().unwrap());
    assert!(
        (first - base_last).abs() < 0.5 && first < base_first - 0.5,
        "fine-tuning started at {first}, the base went from {base_first} to {base_last}"
    );
    let optimizer = tensor_names(&run.join("last").join("optimizer.safetensors"));
    assert!(
        optimizer.iter().any(|n| n.starts_with("embed.")),
        "{optimizer:?}"
    );
}

#[test]
fn checkpointed_activations_train_exactly_as_stored_ones() {
    let dir = tempfile::tempdir().unwrap();
    let base = base_model(dir.path());
    for (name, extra) in [
        ("full", ""),
        (
            "lora",
            "  lora: {rank: 4, alpha: 8, targets: [q_proj, v_proj, down_proj]}",
        ),
    ] {
        let mut runs = Vec::new();
        for checkpoint in [false, true] {
            let tag = format!("{name}-{checkpoint}");
            let extra = format!("  checkpoint_activations: {checkpoint}\n{extra}");
            let config = finetune_config(dir.path(), &tag, &base, &extra);
            let run = dir.path().join(&tag);
            ok(run_cpu(&[
                "train",
                "--config",
                path(&config),
                "--out",
                path(&run),
            ]));
            runs.push(losses(&run));
        }
        // The recomputed blocks give the stored graph's gradients bit for bit on this backend
        // (crates/training/tests/checkpointing.rs), so the runs' losses are the same numbers.
        assert_eq!(runs[0].len(), 4, "{name}: {:?}", runs[0]);
        assert_eq!(runs[0], runs[1], "{name}");
    }
}

#[test]
fn bad_fine_tuning_configs_are_errors_naming_the_key_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let base = base_model(dir.path());
    let cases: [(PathBuf, &str); 5] = [
        (
            finetune_config(dir.path(), "missing", &dir.path().join("nope"), ""),
            "model.from",
        ),
        (
            finetune_config(dir.path(), "notmodel", &dir.path().join("corpus.txt"), ""),
            "is not a model ember loads",
        ),
        (
            finetune_config(
                dir.path(),
                "target",
                &base,
                "  lora: {rank: 4, alpha: 8, targets: [qkv_proj]}",
            ),
            "valid names: down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj",
        ),
        (
            finetune_config(
                dir.path(),
                "rank",
                &base,
                "  lora: {rank: 0, targets: [q_proj]}",
            ),
            "training.lora.rank",
        ),
        (
            finetune_config(
                dir.path(),
                "recompute",
                &base,
                "  checkpoint_activations: true\n  lora: {rank: 4, dropout: 0.1, targets: [q_proj]}",
            ),
            "training.checkpoint_activations",
        ),
    ];
    for (config, expected) in cases {
        let out = dir.path().join("out");
        let output = run_cpu(&["train", "--config", path(&config), "--out", path(&out)]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "{} was accepted",
            config.display()
        );
        assert!(stderr.contains(expected), "{}: {stderr}", config.display());
        assert!(!out.join("last").exists() && !out.join("best").exists());
    }

    // Shape keys and a tokenizer section next to model.from would be silently overridden; LoRA needs a
    // pretrained model; the window may not pass the model's context (the base was trained on 64).
    let from = base.display();
    for (yaml, needles) in [
        (
            format!("model: {{from: {from}, hidden_size: 64}}"),
            ["model.hidden_size", "own shape"],
        ),
        (
            format!("model: {{from: {from}}}\ntokenizer: {{vocab_size: 512}}"),
            ["tokenizer.vocab_size", "own tokenizer"],
        ),
        (
            "training: {lora: {targets: [q_proj]}}".to_string(),
            ["training.lora", "model.from"],
        ),
        (
            format!("model: {{from: {from}, block_size: 128}}"),
            ["model.block_size", "(64)"],
        ),
    ] {
        let config = dir.path().join("refused.yaml");
        std::fs::write(&config, format!("data: {{inputs: [corpus.txt]}}\n{yaml}\n")).unwrap();
        let output = run_cpu(&["train", "--config", path(&config)]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{yaml} was accepted");
        assert!(
            needles.iter().all(|n| stderr.contains(n)),
            "{yaml}: {stderr}"
        );
    }
}

/// A chat template for the tiny base (its tokenizer has no chat markup): each turn is `role: content` and a
/// newline, the reply ends with the end-of-text token.
const CHAT_TEMPLATE: &str = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}";

fn chat_line(user: &str, reply: &str) -> String {
    serde_json::json!({"messages": [
        {"role": "user", "content": user},
        {"role": "assistant", "content": reply},
    ]})
    .to_string()
}

#[test]
fn chat_data_trains_on_replies_and_bad_chat_input_is_an_error_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let base = base_model(dir.path());
    std::fs::write(
        base.join("tokenizer_config.json"),
        serde_json::json!({"chat_template": CHAT_TEMPLATE, "eos_token": "<|endoftext|>"})
            .to_string(),
    )
    .unwrap();
    let lines: Vec<String> = (0..12)
        .map(|i| chat_line(&format!("speak {i} times"), "not I, my lord"))
        .collect();
    std::fs::write(dir.path().join("chat.jsonl"), lines.join("\n") + "\n").unwrap();
    let config = dir.path().join("chat.yaml");
    let write_config = |inputs: &str, block: usize| {
        std::fs::write(
            &config,
            format!(
                "name: chat\nseed: 3\ndata: {{inputs: [{inputs}], format: chat}}\n\
                 model: {{from: {}, block_size: {block}}}\n\
                 training: {{batch_size: 4, max_steps: 4, warmup_steps: 1, learning_rate: 1.0e-2, log_interval: 1, \
                 eval_interval: 4, eval_batches: 2, checkpoint_interval: 4, \
                 lora: {{rank: 4, alpha: 8, targets: [q_proj, v_proj]}}}}\n",
                base.display()
            ),
        )
        .unwrap();
    };
    write_config("chat.jsonl", 48);
    let run = dir.path().join("chat-run");
    ok(run_cpu(&[
        "train",
        "--config",
        path(&config),
        "--out",
        path(&run),
    ]));
    let train = losses(&run);
    assert_eq!(train.len(), 4);
    assert!(train.iter().all(|l| l.is_finite() && *l > 0.0), "{train:?}");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains("val_bpb"), "{metrics}");
    assert!(run.join("best/adapter/adapter_model.safetensors").is_file());

    // `ember prepare --format chat` writes the rows once; training on them is the same run, step for step.
    let prepared = dir.path().join("prepared");
    ok(run_cpu(&[
        "prepare",
        "--format",
        "chat",
        "--tokenizer",
        path(&base),
        "--input",
        path(&dir.path().join("chat.jsonl")),
        "--output",
        path(&prepared),
        "--block-size",
        "48",
    ]));
    write_config("prepared", 48);
    let from_prepared = dir.path().join("prepared-run");
    ok(run_cpu(&[
        "train",
        "--config",
        path(&config),
        "--out",
        path(&from_prepared),
    ]));
    assert_eq!(
        losses(&from_prepared),
        train,
        "training on prepared rows differs"
    );
    // Rows prepared for another block size are refused, naming the key.
    write_config("prepared", 32);
    let output = run_cpu(&[
        "train",
        "--config",
        path(&config),
        "--out",
        path(&dir.path().join("wrong-block")),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("model.block_size") && stderr.contains("49"),
        "{stderr}"
    );

    // Bad chat input: errors name the file and line, and nothing is written into the run directory.
    let bad = [
        ("not json", "bad.jsonl:2", 48),
        (
            "{\"messages\": [{\"role\": \"user\"}]}",
            "missing field `content`",
            48,
        ),
        ("{\"text\": \"hi\"}", "missing field `messages`", 48),
    ];
    for (line, expected, block) in bad {
        std::fs::write(
            dir.path().join("bad.jsonl"),
            format!("{}\n{line}\n", lines[0]),
        )
        .unwrap();
        write_config("bad.jsonl", block);
        let out = dir.path().join("bad-run");
        let output = run_cpu(&["train", "--config", path(&config), "--out", path(&out)]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{line} was accepted");
        assert!(
            stderr.contains(expected) && stderr.contains("bad.jsonl:2"),
            "{line}: {stderr}"
        );
        assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none());
    }
    // A conversation longer than a row.
    write_config("chat.jsonl", 4);
    let output = run_cpu(&[
        "train",
        "--config",
        path(&config),
        "--out",
        path(&dir.path().join("short")),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success()
            && stderr.contains("chat.jsonl:1")
            && stderr.contains("longer than a training row"),
        "{stderr}"
    );
    // A base without a chat template.
    std::fs::remove_file(base.join("tokenizer_config.json")).unwrap();
    write_config("chat.jsonl", 48);
    let output = run_cpu(&[
        "train",
        "--config",
        path(&config),
        "--out",
        path(&dir.path().join("none")),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("no chat template"),
        "{stderr}"
    );
}
