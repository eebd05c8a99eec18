//! `ember bench` end to end: the model bench on a tiny saved model, the suites, and `--compare`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use burn::backend::Flex;
use ember_bench::memory::PeakScope;
use ember_bench::{
    EMBER_VERSION, Machine, ModelBench, ModelInfo, ModelSettings, Percentiles, Precision, Report,
    ReportBody, SCHEMA_VERSION,
};
use ember_model::weights::RandomInit;
use ember_model::{ModelSpec, Transformer};

use common::run_cpu;

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "ember failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("ember-bench-cli-{name}"))
        .tempdir()
        .unwrap()
}

/// A 2-layer random LLaMA-style model (vocab 96, context 64) saved in the Hugging Face layout.
fn tiny_model_dir(dir: &Path) -> PathBuf {
    let spec = ModelSpec::llama_style(96, 32, 2, 4, 2, 64, 64);
    let model = Transformer::<Flex>::from_source(
        &spec,
        &mut RandomInit::with_std(1, 2, 0.3),
        &Default::default(),
        None,
    )
    .unwrap();
    let path = dir.join("tiny");
    std::fs::create_dir_all(&path).unwrap();
    ember_model::save(&model, &path).unwrap();
    path
}

#[test]
fn model_bench_json_has_every_figure_and_matches_the_output_file() {
    let dir = temp_dir("model");
    let model = tiny_model_dir(dir.path());
    let out_file = dir.path().join("report.json");
    let args = [
        "bench",
        "--model",
        model.to_str().unwrap(),
        "--prompt-len",
        "8",
        "--gen-len",
        "5",
        "--runs",
        "2",
    ];
    let printed = stdout(&run_cpu(
        &[
            &args[..],
            &["--format", "json", "--output", out_file.to_str().unwrap()],
        ]
        .concat(),
    ));
    let report = Report::from_json(&printed).unwrap();
    assert_eq!(Report::read(&out_file).unwrap(), report);
    assert_eq!(report.backend, "cpu (flex)");
    assert!(report.threads >= 1);
    let ReportBody::Model(m) = &report.body else {
        panic!("not a model report: {printed}")
    };
    assert_eq!(
        (
            m.settings.batch,
            m.settings.prompt_len,
            m.settings.gen_len,
            m.settings.runs
        ),
        (1, 8, 5, 2)
    );
    assert_eq!(m.settings.attention, "flash");
    assert!(m.ttft_ms > 0.0 && m.prefill_tokens_per_s > 0.0 && m.decode_tokens_per_s > 0.0);
    let p = m.decode_latency_ms;
    assert!(
        0.0 < p.p50 && p.p50 <= p.p90 && p.p90 <= p.p95 && p.p95 <= p.p99 && p.p99 <= p.max,
        "{p:?}"
    );
    // The cpu backend keeps tensors in host memory (the resident set above); the contiguous cache of one row
    // grows from the 8 prompt positions to 16 on the first decode step: 16 x 256 bytes (2 layers x 2 KV heads x
    // (8 + 8) f32 per position).
    assert_eq!(m.device_memory, None);
    assert_eq!(m.settings.kv_cache, "contiguous");
    assert_eq!(m.kv_cache_bytes, Some(16 * 256));
    let table = stdout(&run_cpu(&args));
    assert!(
        table.contains("decode_latency_ms.p99") && table.contains("tokens/s"),
        "{table}"
    );
}

/// `--kv-cache paged-4` runs the model bench over the block pool and reports the pool's storage.
#[test]
fn paged_kv_cache_model_bench_reports_the_pool() {
    let dir = temp_dir("paged");
    let model = tiny_model_dir(dir.path());
    let out = run_cpu(&[
        "bench",
        "--model",
        model.to_str().unwrap(),
        "--kv-cache",
        "paged-4",
        "--batch",
        "2",
        "--prompt-len",
        "8",
        "--gen-len",
        "5",
        "--runs",
        "1",
        "--format",
        "json",
    ]);
    let report = Report::from_json(&stdout(&out)).unwrap();
    let ReportBody::Model(m) = &report.body else {
        panic!("not a model report")
    };
    assert_eq!(m.settings.kv_cache, "paged-4");
    // Per run, the pool starts at 1 block and doubles on demand: 8 prompt positions per row take 2 blocks
    // each (1 -> 2 -> 4 blocks), the 4 decode steps a third each (4 -> 8); 8 blocks x 4 positions x 256 bytes.
    assert_eq!(m.kv_cache_bytes, Some(8 * 4 * 256));
    let bad = run_cpu(&[
        "bench",
        "--model",
        model.to_str().unwrap(),
        "--kv-cache",
        "pages",
    ]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("expected contiguous, paged or paged-N"),
        "{err}"
    );
}

/// `--quantize` runs the same workload on quantized weights and says so: the model's dtype is the scheme and its
/// weight bytes shrink (int8: 1 byte per matrix element plus a scale per row, against 4 bytes in f32).
#[test]
fn quantized_model_bench_reports_the_scheme_and_smaller_weights() {
    let dir = temp_dir("quantize");
    let model = tiny_model_dir(dir.path());
    let bench = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "bench",
            "--model",
            model.to_str().unwrap(),
            "--prompt-len",
            "4",
            "--gen-len",
            "3",
            "--runs",
            "1",
            "--warmup",
            "0",
            "--format",
            "json",
        ];
        args.extend_from_slice(extra);
        serde_json::from_str(&stdout(&run_cpu(&args))).unwrap()
    };
    let f32_report = bench(&[]);
    let int8_report = bench(&["--quantize", "int8"]);
    let weights = |r: &serde_json::Value| r["model"]["weight_bytes"].as_u64().unwrap();
    assert_eq!(f32_report["model"]["dtype"], "f32");
    assert_eq!(int8_report["model"]["dtype"], "int8");
    assert_eq!(int8_report["settings"]["quantize"], "int8");
    assert!(
        weights(&int8_report) * 2 < weights(&f32_report),
        "{} vs {}",
        weights(&int8_report),
        weights(&f32_report)
    );
    assert!(int8_report["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn bad_quantize_values_are_clear_errors() {
    let dir = temp_dir("quantize-bad");
    let model = tiny_model_dir(dir.path());
    let run = |scheme: &str| {
        let out = run_cpu(&[
            "bench",
            "--model",
            model.to_str().unwrap(),
            "--quantize",
            scheme,
        ]);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run("int3");
    assert!(
        err.contains("--quantize int3") && err.contains("int4-gN"),
        "{err}"
    );
    let err = run("gguf");
    assert!(err.contains("needs a GGUF file"), "{err}");
}

#[test]
fn kernel_suite_reports_each_kernel_pass_and_length() {
    let args = [
        "bench",
        "--suite",
        "kernels",
        "--seq-lens",
        "16,32",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--format",
        "json",
    ];
    let report = Report::from_json(&stdout(&run_cpu(&args))).unwrap();
    let ReportBody::Kernels(k) = report.body else {
        panic!("not a kernel report")
    };
    // 3 kernels x 2 passes x 2 lengths.
    assert_eq!(k.results.len(), 12);
    for kernel in ["manual", "fused", "flash"] {
        for pass in ["forward", "forward_backward"] {
            for seq in [16, 32] {
                assert!(
                    k.results.iter().any(|r| r.kernel == kernel
                        && r.pass.name() == pass
                        && r.seq_len == seq
                        && r.time_ms > 0.0),
                    "missing {kernel}/{pass}/{seq}"
                );
            }
        }
    }
}

#[test]
fn train_suite_times_steps_of_the_configured_model() {
    let dir = temp_dir("train");
    let config = dir.path().join("tiny.yaml");
    std::fs::write(
        &config,
        "tokenizer: {vocab_size: 300}\nmodel: {hidden_size: 32, num_layers: 1, num_heads: 4, num_kv_heads: 2, \
         intermediate_size: 64, block_size: 32}\ntraining: {batch_size: 2, precision: bf16}\n",
    )
    .unwrap();
    let args = [
        "bench",
        "--suite",
        "train",
        "--config",
        config.to_str().unwrap(),
        "--runs",
        "3",
        "--format",
        "json",
    ];
    let report = Report::from_json(&stdout(&run_cpu(&args))).unwrap();
    let ReportBody::Train(t) = report.body else {
        panic!("not a train report")
    };
    assert_eq!(
        (t.settings.batch, t.settings.seq_len, t.settings.steps),
        (2, 32, 3)
    );
    // The cpu backends only emulate bf16, so the suite measures what `ember train` would run there: f32.
    assert_eq!(t.settings.precision, Precision::F32);
    let p = t.step_time_ms;
    assert!(0.0 < p.p50 && p.p50 <= p.max);
    // tokens/s is defined at the median step: 2 x 32 tokens per step.
    assert!(
        (t.tokens_per_s * p.p50 / 1e3 - 64.0).abs() < 1e-6,
        "{} tokens/s at {} ms",
        t.tokens_per_s,
        p.p50
    );
}

#[test]
fn tokenizer_suite_needs_its_inputs() {
    let out = run_cpu(&["bench", "--suite", "tokenizer"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tokenizer"));
}

fn model_report(ttft_ms: f64, decode_tokens_per_s: f64) -> Report {
    Report {
        schema_version: SCHEMA_VERSION,
        ember_version: EMBER_VERSION.into(),
        timestamp: "2026-11-29T18:00:00Z".into(),
        machine: Machine::detect(),
        backend: "cpu (flex)".into(),
        threads: 2,
        body: ReportBody::Model(ModelBench {
            model: ModelInfo {
                name: "m".into(),
                architecture: "LlamaForCausalLM".into(),
                parameters: 10,
                dtype: "f32".into(),
                weight_bytes: 40,
            },
            settings: ModelSettings {
                batch: 1,
                prompt_len: 8,
                gen_len: 4,
                runs: 2,
                warmup: 1,
                attention: "flash".into(),
                quantize: None,
                kv_cache: "contiguous".into(),
            },
            ttft_ms,
            prefill_tokens_per_s: 8.0 / (ttft_ms / 1e3),
            decode_tokens_per_s,
            decode_latency_ms: Percentiles {
                p50: 1.0,
                p90: 1.0,
                p95: 1.0,
                p99: 1.0,
                max: 1.0,
            },
            end_to_end_tokens_per_s: 100.0,
            peak_memory_bytes: Some(1 << 20),
            peak_memory_scope: PeakScope::Phase,
            device_memory: None,
            kv_cache_bytes: None,
        }),
    }
}

#[test]
fn compare_prints_a_verdict_per_figure() {
    let dir = temp_dir("compare");
    let (old, new) = (dir.path().join("old.json"), dir.path().join("new.json"));
    std::fs::write(&old, model_report(10.0, 100.0).to_json().unwrap()).unwrap();
    std::fs::write(&new, model_report(5.0, 80.0).to_json().unwrap()).unwrap();
    let text = stdout(&run_cpu(&[
        "bench",
        "--compare",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
        "--noise",
        "0.1",
    ]));
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name}:\n{text}"))
    };
    assert!(
        line("ttft_ms").contains("-50.0%") && line("ttft_ms").ends_with("faster"),
        "{text}"
    );
    assert!(
        line("decode_tokens_per_s").contains("-20.0%")
            && line("decode_tokens_per_s").ends_with("slower")
    );
    assert!(line("end_to_end_tokens_per_s").ends_with("within noise"));
    assert!(text.contains("±10.0%"));
}

#[test]
fn compare_names_a_file_that_is_not_a_report() {
    let dir = temp_dir("bad");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{}").unwrap();
    let out = run_cpu(&[
        "bench",
        "--compare",
        bad.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.json"));
}
