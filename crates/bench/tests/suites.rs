//! The kernel and tokenizer suites on small inputs: one result per point, figures consistent with what was run.

use burn::backend::Flex;
use ember_bench::suites::{kernels, tokenizer};
use ember_bench::{KernelSettings, MonotonicClock, Pass, Repetitions};
use ember_model::AttentionKernel;

#[test]
fn kernel_suite_measures_every_kernel_pass_and_length_and_flash_needs_less_memory() {
    let settings = KernelSettings {
        batch: 1,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        seq_lens: vec![64, 1024],
        runs: 1,
        warmup: 0,
    };
    // Flash first: a peak is read right after its point, before the manual kernel's large score matrix exists.
    let kernels = [AttentionKernel::Flash, AttentionKernel::Manual];
    let results = kernels::run_kernel_suite::<Flex>(
        &settings,
        &kernels,
        &[Pass::Forward],
        &Default::default(),
        &MonotonicClock::new(),
        |_| {},
    )
    .unwrap();
    let points: Vec<(&str, usize)> = results
        .iter()
        .map(|r| (r.kernel.as_str(), r.seq_len))
        .collect();
    assert_eq!(
        points,
        [
            ("flash", 64),
            ("manual", 64),
            ("flash", 1024),
            ("manual", 1024)
        ]
    );
    assert!(
        results
            .iter()
            .all(|r| r.time_ms > 0.0 && r.pass == Pass::Forward)
    );
    if let (Some(flash), Some(manual)) = (results[2].peak_bytes, results[3].peak_bytes) {
        // The manual kernel materialises f32 scores [1, 9, 1024, 1024] (36 MiB) and their softmax; flash works on
        // tiles. 24 MiB of margin leaves room for allocator noise while still requiring the score matrix.
        assert!(
            manual > flash + 24 * (1 << 20),
            "manual peak {manual} vs flash peak {flash}"
        );
    }
}

#[test]
fn kernel_suite_rejects_heads_that_do_not_group() {
    let settings = KernelSettings {
        batch: 1,
        heads: 9,
        kv_heads: 2,
        head_dim: 8,
        seq_lens: vec![8],
        runs: 1,
        warmup: 0,
    };
    let err = kernels::run_kernel_suite::<Flex>(
        &settings,
        &[AttentionKernel::Flash],
        &[Pass::Forward],
        &Default::default(),
        &MonotonicClock::new(),
        |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("not a multiple"), "{err}");
}

#[test]
fn tokenizer_suite_counts_the_bytes_and_tokens_it_encoded() {
    let tokenizer_path = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join("../tokenizer/tests/fixtures/hf_trained.tokenizer.json");
    let dir = std::env::temp_dir().join(format!("ember-bench-suites-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let corpus = dir.join("corpus.txt");
    let text =
        "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.\n"
            .repeat(200);
    std::fs::write(&corpus, &text).unwrap();
    let reps = Repetitions { warmup: 1, runs: 3 };
    let suite =
        tokenizer::run_tokenizer_suite(&tokenizer_path, &corpus, reps, &MonotonicClock::new())
            .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let want_tokens = ember_tokenizer::Tokenizer::from_path(&tokenizer_path)
        .unwrap()
        .encode(&text)
        .unwrap()
        .len();
    assert_eq!(
        (suite.corpus_bytes, suite.tokens, suite.runs),
        (text.len() as u64, want_tokens as u64, 3)
    );
    // Both rates divide by the same median time, so their ratio is tokens per megabyte exactly (f64 rounding).
    let ratio = suite.encode_tokens_per_s / suite.encode_mb_per_s;
    let want = want_tokens as f64 / (text.len() as f64 / 1e6);
    assert!((ratio - want).abs() < 1e-9 * want, "{ratio} vs {want}");
}
