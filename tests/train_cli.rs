//! `ember train` and `ember plot` end to end on a tiny corpus and model (CPU backend).

mod common;

use std::path::Path;

use common::ember;

/// A small corpus with enough repetition for a 300-token BPE, and a config for a one-layer model.
fn setup(dir: &Path) -> std::path::PathBuf {
    let mut text = String::new();
    for i in 0..400 {
        text.push_str(&format!("ROMEO: speak, sweet love, speak {i} times.\nJULIET: not I, my lord; the night is young.\n\n"));
    }
    std::fs::write(dir.join("corpus.txt"), text).unwrap();
    let config = r#"
name: tiny
seed: 7
data:
  inputs: [corpus.txt]
  val_fraction: 0.1
  cache_dir: cache
tokenizer:
  vocab_size: 300
model:
  hidden_size: 32
  num_layers: 1
  num_heads: 4
  num_kv_heads: 2
  intermediate_size: 64
  block_size: 16
training:
  batch_size: 4
  max_steps: 8
  warmup_steps: 2
  learning_rate: 3.0e-3
  min_learning_rate: 3.0e-4
  log_interval: 1
  eval_interval: 4
  eval_batches: 2
  checkpoint_interval: 4
"#;
    let path = dir.join("tiny.yaml");
    std::fs::write(&path, config).unwrap();
    path
}

fn train(config: &Path, out: &Path, extra: &[&str]) {
    let output = ember()
        .args(["--backend", "cpu", "--quiet", "train", "--config"])
        .arg(config)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "ember train failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn train_losses(run: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

#[test]
fn train_writes_a_loadable_run_and_resume_matches_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let straight = dir.path().join("straight");
    train(&config, &straight, &[]);

    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(
            straight.join("best").join(file).is_file(),
            "best/{file} missing"
        );
        assert!(
            straight.join("last").join(file).is_file(),
            "last/{file} missing"
        );
    }
    assert_eq!(
        &std::fs::read(straight.join("loss.png")).unwrap()[..4],
        b"\x89PNG"
    );
    let metrics = std::fs::read_to_string(straight.join("metrics.jsonl")).unwrap();
    let val: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("val_loss").is_some())
        .collect();
    assert_eq!(
        val.iter()
            .map(|v| v["step"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [4, 8]
    );
    for v in &val {
        assert!(
            v["val_bpb"].as_f64().unwrap() > 0.0 && v["val_ppl"].as_f64().unwrap() > 1.0,
            "{v}"
        );
    }
    // Training lines report the process's peak memory where Linux does; the model, its gradients and AdamW's
    // moments are resident, so the figure is at least a few MiB and can only grow.
    if std::path::Path::new("/proc/self/status").exists() {
        let peaks: Vec<f64> = metrics
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v.get("loss").is_some())
            .map(|v| {
                v["peak_rss_mib"]
                    .as_f64()
                    .expect("peak_rss_mib on a training line")
            })
            .collect();
        assert!(peaks[0] > 4.0, "peak memory {} MiB", peaks[0]);
        assert!(peaks.windows(2).all(|w| w[1] >= w[0]), "{peaks:?}");
    }

    let split = dir.path().join("split");
    train(&config, &split, &["--max-steps", "4"]);
    assert_eq!(train_losses(&split).len(), 4);
    train(&config, &split, &["--resume"]);
    // Bitwise: weights round-trip through f32 safetensors, AdamW moments likewise, the reader state exactly.
    assert_eq!(train_losses(&split), train_losses(&straight));
}

#[test]
fn train_refuses_to_overwrite_a_run_and_plot_redraws_the_curves() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let run = dir.path().join("run");
    train(&config, &run, &["--max-steps", "2"]);
    let again = ember()
        .args(["--quiet", "train", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(&run)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("--resume"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    std::fs::remove_file(run.join("loss.png")).unwrap();
    let plot = ember()
        .args(["--quiet", "plot"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(
        plot.status.success(),
        "{}",
        String::from_utf8_lossy(&plot.stderr)
    );
    assert_eq!(
        &std::fs::read(run.join("loss.png")).unwrap()[..4],
        b"\x89PNG"
    );

    let missing = ember()
        .args(["--quiet", "plot"])
        .arg(dir.path().join("nothing"))
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("metrics.jsonl"));
}

/// `model.architecture` trains any registered family from scratch: the run saves that family's Hugging Face
/// layout and `ember generate` loads it back; a shape the family cannot take is an error naming the key, before
/// anything is written.
#[test]
fn model_architecture_trains_other_families_from_scratch() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let base = std::fs::read_to_string(&config).unwrap();
    for (architecture, kv_heads) in [
        ("GPT2LMHeadModel", 4),
        ("Qwen3ForCausalLM", 2),
        ("GPTNeoXForCausalLM", 4),
    ] {
        let yaml = base
            .replace(
                "model:\n",
                &format!("model:\n  architecture: {architecture}\n"),
            )
            .replace("num_kv_heads: 2", &format!("num_kv_heads: {kv_heads}"))
            .replace("max_steps: 8", "max_steps: 4");
        let path = dir.path().join(format!("{architecture}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let run = dir.path().join(architecture);
        train(&path, &run, &[]);
        let saved: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("best/config.json")).unwrap())
                .unwrap();
        assert_eq!(saved["architectures"][0], architecture);
        let losses = train_losses(&run);
        assert_eq!(losses.len(), 4, "{architecture}");
        assert!(
            losses.iter().all(|(_, l)| l.is_finite() && *l > 0.0),
            "{architecture}: {losses:?}"
        );
        let out = ember()
            .args(["--backend", "cpu", "--quiet", "generate", "--model"])
            .arg(run.join("best"))
            .args([
                "--prompt",
                "ROMEO:",
                "--max-new-tokens",
                "4",
                "--temperature",
                "0",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{architecture}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let gqa_gpt2 = base.replace("model:\n", "model:\n  architecture: GPT2LMHeadModel\n");
    let path = dir.path().join("gqa_gpt2.yaml");
    std::fs::write(&path, gqa_gpt2).unwrap();
    let run = dir.path().join("refused");
    let out = ember()
        .args(["--backend", "cpu", "--quiet", "train", "--config"])
        .arg(&path)
        .arg("--out")
        .arg(&run)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("model.num_kv_heads") && stderr.contains("gqa_gpt2.yaml"),
        "{stderr}"
    );
    assert!(!run.exists(), "a refused config wrote {}", run.display());
}

#[test]
fn a_trained_run_exports_to_a_gguf_file_with_its_model_and_tokenizer() {
    use burn::backend::Flex;
    use burn::tensor::{Int, Tensor, TensorData};
    use ember_model::ModelDir;
    use ember_model::gguf::{self, GgufFile};

    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let run = dir.path().join("run");
    train(&config, &run, &[]);
    let file = dir.path().join("tiny.gguf");
    let output = ember()
        .args(["--backend", "cpu", "--quiet", "export", "--model"])
        .arg(run.join("best"))
        .arg("--out")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "ember export failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let device = Default::default();
    let trained = ModelDir::open(&run.join("best"))
        .unwrap()
        .load::<Flex>(&device, None)
        .unwrap()
        .model;
    let gguf_file = GgufFile::open(&file).unwrap();
    assert_eq!(
        gguf_file.require_str("tokenizer.ggml.pre").unwrap(),
        "gpt-2",
        "ember's trainer splits text as GPT-2 does"
    );
    let exported: ember_model::Transformer<Flex> = gguf::load(&gguf_file, &device, None).unwrap();
    let ids: Vec<i64> = (0..16).map(|i| (i * 37 + 5) % 300).collect();
    let logits = |model: &ember_model::Transformer<Flex>| {
        let tokens = Tensor::<Flex, 2, Int>::from_data(
            TensorData::new(ids.clone(), [1, ids.len()]),
            &device,
        );
        model
            .forward(tokens)
            .unwrap()
            .into_data()
            .into_vec::<f32>()
            .unwrap()
    };
    // The same f32 weights, un-permuted back to the same layout: the same logits, bit for bit.
    assert_eq!(logits(&trained), logits(&exported));
    let tokenize = |tokenizer: &Path| {
        let mut child = ember()
            .args(["--quiet", "tokenize", "--tokenizer"])
            .arg(tokenizer)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all("ROMEO: speak 17 times, sweet love!\n\nJULIET: not I.".as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        out.stdout
    };
    assert_eq!(
        tokenize(&run.join("best").join("tokenizer.json")),
        tokenize(&file),
        "the GGUF vocabulary tokenizes as the run's tokenizer.json"
    );
}
