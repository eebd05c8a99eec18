//! The JSON report: round trip of every kind, and the key layout other tools (plots, scripts) rely on.

mod common;

use ember_bench::memory::PeakScope;
use ember_bench::{
    Percentiles, Precision, Report, ReportBody, TokenizerSuite, TrainSettings, TrainSuite,
};

fn round_trip(report: &Report) -> Report {
    let json = report.to_json().unwrap();
    Report::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

/// A training-suite report of 2 replicas computing in `precision`.
fn train_report(precision: Precision) -> Report {
    common::report(ReportBody::Train(TrainSuite {
        settings: TrainSettings {
            config: "configs/default.yaml".into(),
            batch: 4,
            seq_len: 256,
            steps: 5,
            warmup: 1,
            replicas: 2,
            precision,
        },
        parameters: 1_234_567,
        step_time_ms: Percentiles {
            p50: 100.0,
            p90: 110.0,
            p95: 111.0,
            p99: 112.0,
            max: 113.0,
        },
        tokens_per_s: 10240.0,
        peak_memory_bytes: None,
        peak_memory_scope: PeakScope::Process,
    }))
}

#[test]
fn every_report_kind_survives_a_json_round_trip() {
    let tokenizer = common::report(ReportBody::Tokenizer(TokenizerSuite {
        tokenizer: "tokenizer.json".into(),
        corpus: "corpus.txt".into(),
        corpus_bytes: 1_000_000,
        tokens: 250_000,
        runs: 3,
        encode_mb_per_s: 12.5,
        encode_tokens_per_s: 3.125e6,
    }));
    let train = train_report(Precision::Bf16);
    for report in [
        common::model_report(12.5, 50.0, 300 << 20),
        common::kernel_report(&[(128, 0.5), (256, 1.75)]),
        tokenizer,
        train,
    ] {
        assert_eq!(round_trip(&report), report);
    }
}

/// Train reports record the precision as `"f32"` / `"bf16"`; reports written before they did read as f32.
#[test]
fn train_reports_record_their_precision() {
    let report = train_report(Precision::Bf16);
    let mut json: serde_json::Value = serde_json::from_str(&report.to_json().unwrap()).unwrap();
    assert_eq!(json["settings"]["precision"], "bf16");
    json["settings"]
        .as_object_mut()
        .unwrap()
        .remove("precision");
    let old = Report::from_json(&json.to_string()).unwrap();
    assert_eq!(old, train_report(Precision::F32));
}

#[test]
fn model_report_keys_sit_at_the_top_level_as_documented() {
    let json: serde_json::Value =
        serde_json::from_str(&common::model_report(12.5, 50.0, 1 << 20).to_json().unwrap())
            .unwrap();
    assert_eq!(json["kind"], "model");
    for key in [
        "schema_version",
        "ember_version",
        "timestamp",
        "machine",
        "backend",
        "threads",
        "model",
        "settings",
        "ttft_ms",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "end_to_end_tokens_per_s",
        "peak_memory_bytes",
    ] {
        assert!(
            json.get(key).is_some(),
            "missing top-level key {key}: {json}"
        );
    }
    for p in ["p50", "p90", "p95", "p99", "max"] {
        assert!(
            json["decode_latency_ms"][p].is_f64(),
            "decode_latency_ms.{p} missing: {json}"
        );
    }
    assert_eq!(json["backend"], "cpu (flex)");
    assert_eq!(json["threads"], 2);
    assert_eq!(json["peak_memory_bytes"], 1 << 20);
}

#[test]
fn kernel_results_carry_kernel_seq_len_pass_time_and_peak() {
    let json: serde_json::Value =
        serde_json::from_str(&common::kernel_report(&[(128, 0.5)]).to_json().unwrap()).unwrap();
    let point = &json["results"][0];
    assert_eq!(point["kernel"], "flash");
    assert_eq!(point["seq_len"], 128);
    assert_eq!(point["pass"], "forward");
    assert_eq!(point["time_ms"], 0.5);
    assert!(point["peak_bytes"].is_null());
}

#[test]
fn reading_a_file_that_is_not_a_report_names_the_file() {
    let dir = std::env::temp_dir().join(format!("ember-bench-report-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("not-a-report.json");
    std::fs::write(&path, r#"{"kind": "model", "ttft_ms": 1.0}"#).unwrap();
    let err = Report::read(&path).unwrap_err().to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        err.contains("not-a-report.json") && err.contains("not an ember bench report"),
        "{err}"
    );
    let missing = Report::read(&dir.join("missing.json"))
        .unwrap_err()
        .to_string();
    assert!(missing.contains("missing.json"), "{missing}");
}
