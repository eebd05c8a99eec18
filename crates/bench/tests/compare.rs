//! `compare(old, new, noise)`: relative change, direction-aware verdicts, and warnings about context.

mod common;

use ember_bench::{FigureKind, Verdict, compare, judge, render_comparison};

#[test]
fn lower_time_and_higher_throughput_and_smaller_memory_are_improvements() {
    assert_eq!(
        judge(FigureKind::Time, 10.0, 8.0, 0.05),
        (-0.2, Verdict::Improved)
    );
    assert_eq!(
        judge(FigureKind::Time, 10.0, 12.5, 0.05),
        (0.25, Verdict::Regressed)
    );
    assert_eq!(
        judge(FigureKind::Throughput, 100.0, 150.0, 0.05),
        (0.5, Verdict::Improved)
    );
    assert_eq!(
        judge(FigureKind::Throughput, 100.0, 75.0, 0.05),
        (-0.25, Verdict::Regressed)
    );
    assert_eq!(
        judge(FigureKind::Memory, 200.0, 100.0, 0.05),
        (-0.5, Verdict::Improved)
    );
    assert_eq!(
        judge(FigureKind::Memory, 100.0, 200.0, 0.05),
        (1.0, Verdict::Regressed)
    );
}

#[test]
fn changes_up_to_the_threshold_are_noise_either_way() {
    // 4% slower and 4% faster with a 5% threshold; exactly 5% is still noise (the bound is inclusive).
    assert_eq!(
        judge(FigureKind::Time, 100.0, 104.0, 0.05).1,
        Verdict::WithinNoise
    );
    assert_eq!(
        judge(FigureKind::Throughput, 100.0, 96.0, 0.05).1,
        Verdict::WithinNoise
    );
    assert_eq!(
        judge(FigureKind::Time, 100.0, 105.0, 0.05).1,
        Verdict::WithinNoise
    );
    assert_eq!(
        judge(FigureKind::Time, 100.0, 106.0, 0.05).1,
        Verdict::Regressed
    );
    assert_eq!(
        judge(FigureKind::Memory, 0.0, 0.0, 0.0),
        (0.0, Verdict::WithinNoise)
    );
    assert_eq!(
        judge(FigureKind::Memory, 0.0, 5.0, 0.05).1,
        Verdict::Regressed
    );
}

#[test]
fn comparing_model_reports_judges_each_figure() {
    let old = common::model_report(10.0, 50.0, 100 << 20);
    let new = common::model_report(8.0, 45.0, 101 << 20);
    let cmp = compare(&old, &new, 0.05).unwrap();
    let get = |name: &str| {
        cmp.figures
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let ttft = get("ttft_ms");
    assert_eq!(
        (ttft.verdict, ttft.verdict_words()),
        (Verdict::Improved, "faster")
    );
    assert!((ttft.change + 0.2).abs() < 1e-12, "{}", ttft.change);
    // Prefill tokens/s follows ttft in the fixture (128 tokens / ttft): 25% more.
    assert_eq!(get("prefill_tokens_per_s").verdict_words(), "faster");
    assert_eq!(get("decode_tokens_per_s").verdict_words(), "slower");
    assert_eq!(get("peak_memory_bytes").verdict_words(), "within noise");
    assert_eq!(get("decode_latency_ms.p99").verdict, Verdict::WithinNoise);
    assert_eq!(
        cmp.regressions()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        ["decode_tokens_per_s"]
    );
    assert!(cmp.warnings.is_empty(), "{:?}", cmp.warnings);
    assert!(cmp.unmatched.is_empty());
    let table = render_comparison(&cmp);
    assert!(
        table.contains("ttft_ms") && table.contains("-20.0%") && table.contains("faster"),
        "{table}"
    );
}

#[test]
fn figures_in_one_report_only_are_listed_and_context_changes_are_warned_about() {
    let old = common::kernel_report(&[(128, 1.0), (256, 2.0)]);
    let mut new = common::kernel_report(&[(256, 1.0), (512, 4.0)]);
    new.threads = 8;
    new.machine.cpu = "Apple M3".into();
    let cmp = compare(&old, &new, 0.1).unwrap();
    assert_eq!(cmp.figures.len(), 1);
    assert_eq!(cmp.figures[0].name, "flash/forward/seq=256 time_ms");
    assert_eq!(cmp.figures[0].verdict_words(), "faster");
    assert_eq!(
        cmp.unmatched,
        [
            "flash/forward/seq=512 time_ms",
            "flash/forward/seq=128 time_ms"
        ]
    );
    let warnings = cmp.warnings.join("\n");
    assert!(warnings.contains("threads differs: 2 -> 8"), "{warnings}");
    assert!(warnings.contains("Apple M3"), "{warnings}");
}

#[test]
fn reports_of_different_kinds_or_a_bad_threshold_are_refused() {
    let model = common::model_report(10.0, 50.0, 1);
    let kernels = common::kernel_report(&[(128, 1.0)]);
    let err = compare(&model, &kernels, 0.05).unwrap_err().to_string();
    assert!(
        err.contains("`model`") && err.contains("`kernels`"),
        "{err}"
    );
    assert!(compare(&model, &model, -0.1).is_err());
    assert!(compare(&model, &model, f64::NAN).is_err());
}
