//! Reports built by hand for the report and comparison tests.

use ember_bench::memory::PeakScope;
use ember_bench::{
    EMBER_VERSION, KernelResult, KernelSettings, KernelSuite, Machine, ModelBench, ModelInfo,
    ModelSettings, Pass, Percentiles, Report, ReportBody, SCHEMA_VERSION,
};

/// A fixed machine, so reports compare without context warnings.
pub fn machine() -> Machine {
    Machine {
        cpu: "AMD EPYC".into(),
        physical_cores: Some(2),
        logical_cpus: 2,
        memory_bytes: Some(8 << 30),
        os: "Debian GNU/Linux 12 (bookworm)".into(),
        kernel: Some("6.1.0".into()),
        arch: "x86_64".into(),
    }
}

/// Wraps `body` in the context every report carries.
pub fn report(body: ReportBody) -> Report {
    Report {
        schema_version: SCHEMA_VERSION,
        ember_version: EMBER_VERSION.into(),
        timestamp: "2026-11-29T18:00:00Z".into(),
        machine: machine(),
        backend: "cpu (flex)".into(),
        threads: 2,
        body,
    }
}

/// A model report with the given time to first token, decode throughput and peak memory.
pub fn model_report(ttft_ms: f64, decode_tokens_per_s: f64, peak_memory_bytes: u64) -> Report {
    report(ReportBody::Model(ModelBench {
        model: ModelInfo {
            name: "SmolLM2-135M".into(),
            architecture: "llama".into(),
            parameters: 134_515_008,
            dtype: "f32".into(),
            weight_bytes: 4 * 134_515_008,
        },
        settings: ModelSettings {
            batch: 1,
            prompt_len: 128,
            gen_len: 64,
            runs: 5,
            warmup: 1,
            attention: "flash".into(),
            quantize: None,
            kv_cache: "contiguous".into(),
        },
        ttft_ms,
        prefill_tokens_per_s: 128.0 / (ttft_ms / 1e3),
        decode_tokens_per_s,
        decode_latency_ms: Percentiles {
            p50: 20.0,
            p90: 22.0,
            p95: 23.5,
            p99: 30.0,
            max: 31.0,
        },
        end_to_end_tokens_per_s: 40.0,
        peak_memory_bytes: Some(peak_memory_bytes),
        peak_memory_scope: PeakScope::Phase,
        device_memory: None,
        kv_cache_bytes: None,
    }))
}

/// A kernel report with one forward point per sequence length.
pub fn kernel_report(times_ms: &[(usize, f64)]) -> Report {
    report(ReportBody::Kernels(KernelSuite {
        settings: KernelSettings {
            batch: 1,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            seq_lens: times_ms.iter().map(|(s, _)| *s).collect(),
            runs: 5,
            warmup: 1,
        },
        results: times_ms
            .iter()
            .map(|&(seq_len, time_ms)| KernelResult {
                kernel: "flash".into(),
                seq_len,
                pass: Pass::Forward,
                time_ms,
                peak_bytes: None,
            })
            .collect(),
    }))
}
