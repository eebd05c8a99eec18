//! The model bench on a tiny random LLaMA-style transformer: every report field present and sane, and the timed
//! workload generating exactly what ember-inference's `generate` does.

use burn::backend::Flex;
use ember_bench::{
    GenerationWorkload, LmWorkload, ModelSettings, MonotonicClock, NoDeviceMemory, bench_model,
    synthetic_prompt,
};
use ember_inference::sampling::SamplingConfig;
use ember_inference::{GenerationConfig, TransformerLm, generate};
use ember_model::weights::RandomInit;
use ember_model::{AttentionKernel, ModelSpec, Transformer};

/// GQA (4 query heads, 2 KV heads), 2 layers, vocab 96, context 48; std 0.3 keeps logits far from uniform so
/// greedy argmax ties (which would make token comparisons fragile) are unlikely.
fn tiny(kernel: AttentionKernel) -> Transformer<Flex> {
    let spec = ModelSpec::llama_style(96, 32, 2, 4, 2, 64, 48);
    let mut init = RandomInit::with_std(7, spec.num_layers, 0.3);
    Transformer::<Flex>::from_source(&spec, &mut init, &Default::default(), None)
        .unwrap()
        .with_kernel(kernel)
}

fn settings(batch: usize, prompt_len: usize, gen_len: usize) -> ModelSettings {
    ModelSettings {
        batch,
        prompt_len,
        gen_len,
        runs: 3,
        warmup: 1,
        attention: "flash".into(),
        quantize: None,
        kv_cache: "contiguous".into(),
    }
}

#[test]
fn tiny_model_bench_fills_every_field_with_sane_values() {
    let model = tiny(AttentionKernel::Flash);
    let parameters = model.spec().parameter_count();
    let s = settings(2, 12, 6);
    let b = bench_model(
        model,
        Default::default(),
        "tiny".into(),
        "f32".into(),
        s.clone(),
        &MonotonicClock::new(),
        &NoDeviceMemory,
    )
    .unwrap();
    assert_eq!(b.settings, s);
    assert_eq!(
        (b.model.architecture.as_str(), b.model.parameters),
        ("LlamaForCausalLM", parameters)
    );
    for (name, v) in [
        ("ttft_ms", b.ttft_ms),
        ("prefill_tokens_per_s", b.prefill_tokens_per_s),
        ("decode_tokens_per_s", b.decode_tokens_per_s),
        ("end_to_end_tokens_per_s", b.end_to_end_tokens_per_s),
        ("decode_latency_ms.p50", b.decode_latency_ms.p50),
    ] {
        assert!(v.is_finite() && v > 0.0, "{name} = {v}");
    }
    let p = b.decode_latency_ms;
    assert!(
        p.p50 <= p.p90 && p.p90 <= p.p95 && p.p95 <= p.p99 && p.p99 <= p.max,
        "{p:?}"
    );
    // Prefill throughput and TTFT come from the same median prefill time: 2 x 12 prompt tokens in ttft_ms.
    let prompt_tokens = b.prefill_tokens_per_s * b.ttft_ms / 1e3;
    assert!(
        (prompt_tokens - 24.0).abs() < 1e-6,
        "prefill tokens/s x ttft = {prompt_tokens}, want 24"
    );
    // Decode throughput is batch / mean step latency, and the mean lies between the smallest step and the max.
    assert!(
        b.decode_tokens_per_s >= 2.0 * 1e3 / p.max * (1.0 - 1e-9),
        "{} < 2000 / {}",
        b.decode_tokens_per_s,
        p.max
    );
    if cfg!(target_os = "linux") {
        // The weights alone are resident during generation: the peak must at least hold them (f32).
        let peak = b.peak_memory_bytes.expect("Linux reports VmHWM");
        assert!(
            peak >= parameters * 4,
            "peak {peak} bytes below the {parameters} f32 weights"
        );
    }
}

#[test]
fn the_timed_workload_generates_what_generate_does() {
    let device = Default::default();
    let lm = TransformerLm::new(tiny(AttentionKernel::Manual), device);
    let prompt = synthetic_prompt(10, 96);
    let gen_len = 8;
    let mut workload =
        LmWorkload::new(&lm, 2, prompt.clone(), gen_len, SamplingConfig::greedy()).unwrap();
    workload.prefill().unwrap();
    for _ in 1..gen_len {
        workload.decode_step().unwrap();
    }
    let config = GenerationConfig {
        max_new_tokens: gen_len,
        sampling: SamplingConfig::greedy(),
        ..Default::default()
    };
    let reference = generate(
        &lm,
        None,
        &[prompt.clone(), prompt],
        &config,
        &mut |_, _| {},
    )
    .unwrap();
    for (row, (got, want)) in workload.generated().into_iter().zip(&reference).enumerate() {
        assert_eq!(got, want.ids.as_slice(), "row {row}");
    }
}

#[test]
fn a_workload_longer_than_the_context_is_refused_before_timing() {
    let err = bench_model(
        tiny(AttentionKernel::Flash),
        Default::default(),
        "tiny".into(),
        "f32".into(),
        settings(1, 40, 10),
        &MonotonicClock::new(),
        &NoDeviceMemory,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("context length 48"), "{err}");
}
