//! The model bench on a SmolLM2-135M-shaped model (LLaMA, 30 layers, hidden 576, 9/3 heads, vocab 49 152) with
//! random f32 weights in the Hugging Face layout, when present under .cache/assets (timing does not depend on
//! the weights' values). Ignored by default (it loads 135M parameters and generates on the CPU); run with
//! `cargo test -p ember-bench --test smollm2_bench -- --ignored --nocapture` to print the report table.

use burn::backend::Flex;
use ember_bench::{
    EMBER_VERSION, Machine, ModelSettings, MonotonicClock, NoDeviceMemory, Report, ReportBody,
    SCHEMA_VERSION, bench_model, now_rfc3339, render_report,
};
use ember_inference::ModelAssets;

const MODEL: &str = "../../.cache/assets/random-smollm-135m";

#[test]
#[ignore = "needs the random-smollm-135m asset and takes a minute; run with --ignored"]
fn smollm2_generation_bench_reports_sane_figures() {
    let path = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join(MODEL);
    if !path.is_dir() {
        eprintln!("skipping: {} is missing ", path.display());
        return;
    }
    let device = Default::default();
    let model = ModelAssets::open(&path)
        .unwrap()
        .load::<Flex>(&device, None)
        .unwrap();
    let settings = ModelSettings {
        batch: 1,
        prompt_len: 64,
        gen_len: 16,
        runs: 3,
        warmup: 1,
        attention: model.kernel().name().into(),
        quantize: None,
        kv_cache: "contiguous".into(),
    };
    let bench = bench_model(
        model,
        device,
        "random-smollm-135m".into(),
        "f32".into(),
        settings,
        &MonotonicClock::new(),
        &NoDeviceMemory,
    )
    .unwrap();
    let p = bench.decode_latency_ms;
    assert!(
        bench.ttft_ms > 0.0 && p.p50 <= p.p90 && p.p90 <= p.p95 && p.p95 <= p.p99 && p.p99 <= p.max
    );
    // 134.5M f32 parameters are resident while generating.
    if let Some(peak) = bench.peak_memory_bytes {
        assert!(peak > 134_000_000 * 4, "peak {peak}");
    }
    let report = Report {
        schema_version: SCHEMA_VERSION,
        ember_version: EMBER_VERSION.into(),
        timestamp: now_rfc3339(),
        machine: Machine::detect(),
        backend: "cpu (flex)".into(),
        threads: rayon::current_num_threads(),
        body: ReportBody::Model(bench),
    };
    println!("{}", render_report(&report));
    println!("{}", report.to_json().unwrap());
}
