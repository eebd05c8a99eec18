//! The JSON report every bench run produces, and the figures a comparison reads from it.
//!
//! A report is one JSON object: the run's context (`ember_version`, `timestamp`, `machine`, `backend`, `threads`)
//! plus a `kind` (`model`, `kernels`, `tokenizer`, `train`) and that kind's figures at the top level, so that a
//! model report reads `{"kind": "model", "ttft_ms": ..., "decode_latency_ms": {"p50": ...}, ...}`.

use std::path::Path;

use ember_training::Precision;
use serde::{Deserialize, Serialize};

use crate::device_memory::DeviceMemory;
use crate::memory::PeakScope;
use crate::{BenchError, Machine, Percentiles};

/// Version of the report layout; bumped when a key changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

/// A complete bench report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`] of the writer.
    pub schema_version: u32,
    /// Version of ember that measured.
    pub ember_version: String,
    /// When the run finished, RFC 3339 UTC.
    pub timestamp: String,
    /// The machine.
    pub machine: Machine,
    /// Backend name (`cpu (flex)`, `cuda`, ...).
    pub backend: String,
    /// CPU threads the backend and data work could use.
    pub threads: usize,
    /// What was measured, and the figures.
    #[serde(flatten)]
    pub body: ReportBody,
}

/// The measurement of one kind of bench.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReportBody {
    /// Generation latency and throughput of a model (`ember bench --model`).
    Model(ModelBench),
    /// Attention kernels across sequence lengths (`ember bench --suite kernels`).
    Kernels(KernelSuite),
    /// Tokenizer encode throughput (`ember bench --suite tokenizer`).
    Tokenizer(TokenizerSuite),
    /// Training step time (`ember bench --suite train`).
    Train(TrainSuite),
}

impl ReportBody {
    /// The `kind` key of this body.
    pub fn kind(&self) -> &'static str {
        match self {
            ReportBody::Model(_) => "model",
            ReportBody::Kernels(_) => "kernels",
            ReportBody::Tokenizer(_) => "tokenizer",
            ReportBody::Train(_) => "train",
        }
    }
}

/// The model a generation bench ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Path or name the model was loaded from.
    pub name: String,
    /// Architecture family (`llama`, `qwen2`, ...).
    pub architecture: String,
    /// Number of parameters.
    pub parameters: u64,
    /// Precision of the weights as run (`f32`, `int8`, ...).
    pub dtype: String,
    /// Bytes the weights occupy on the device as run (codes and scales when quantized); 0 in reports written
    /// before the field existed.
    #[serde(default)]
    pub weight_bytes: u64,
}

/// The workload of a generation bench.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSettings {
    /// Sequences generated together.
    pub batch: usize,
    /// Prompt tokens per sequence.
    pub prompt_len: usize,
    /// Tokens generated per sequence (the first comes from the prefill, the rest from decode steps).
    pub gen_len: usize,
    /// Measured runs.
    pub runs: usize,
    /// Discarded warm-up runs.
    pub warmup: usize,
    /// Attention kernel.
    pub attention: String,
    /// Weight quantization, if any.
    pub quantize: Option<String>,
    /// KV cache (`contiguous` or `paged`); reports written before the field existed used `contiguous`.
    #[serde(default = "contiguous")]
    pub kv_cache: String,
}

fn contiguous() -> String {
    "contiguous".to_string()
}

/// Figures of a generation bench. Per-run figures are medians over the measured runs; decode latencies pool every
/// decode step of every run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelBench {
    /// The model.
    pub model: ModelInfo,
    /// The workload.
    pub settings: ModelSettings,
    /// Time to first token: prefill of the whole batch plus sampling of its first tokens, in milliseconds.
    pub ttft_ms: f64,
    /// Prompt tokens processed per second by the prefill (`batch * prompt_len / prefill time`).
    pub prefill_tokens_per_s: f64,
    /// Tokens produced per second by decode steps (`batch * steps / decode time`).
    pub decode_tokens_per_s: f64,
    /// Wall time of one decode step (one new token for every sequence of the batch), in milliseconds.
    pub decode_latency_ms: Percentiles,
    /// Generated tokens per second over a whole run, prefill included (`batch * gen_len / run time`).
    pub end_to_end_tokens_per_s: f64,
    /// Peak resident memory in bytes, `None` where the OS does not report it.
    pub peak_memory_bytes: Option<u64>,
    /// What the peak covers.
    pub peak_memory_scope: PeakScope,
    /// Device memory of GPU backends (largest reading between phases); `None` on cpu, where device memory is
    /// the resident set.
    #[serde(default)]
    pub device_memory: Option<DeviceMemory>,
    /// KV-cache storage allocated by a run's end (the cache only grows within a run), bytes.
    #[serde(default)]
    pub kv_cache_bytes: Option<u64>,
}

/// Which passes of a kernel were timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    /// The forward pass alone.
    Forward,
    /// Forward then backward through autodiff.
    ForwardBackward,
}

impl Pass {
    /// The name used in JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::ForwardBackward => "forward_backward",
        }
    }
}

/// Shapes of an attention kernel suite.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelSettings {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Dimension of each head.
    pub head_dim: usize,
    /// Sequence lengths measured.
    pub seq_lens: Vec<usize>,
    /// Measured runs per point.
    pub runs: usize,
    /// Discarded runs per point.
    pub warmup: usize,
}

/// One measured point of a kernel suite.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelResult {
    /// Kernel name (`manual`, `fused`, `flash`).
    pub kernel: String,
    /// Sequence length.
    pub seq_len: usize,
    /// What was timed.
    pub pass: Pass,
    /// Median wall time, milliseconds.
    pub time_ms: f64,
    /// Peak resident memory during this point, bytes (process-wide where the peak cannot be reset).
    pub peak_bytes: Option<u64>,
}

/// Figures of the attention kernel suite.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelSuite {
    /// Shapes.
    pub settings: KernelSettings,
    /// One entry per (kernel, sequence length, pass).
    pub results: Vec<KernelResult>,
}

/// Figures of the tokenizer suite.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenizerSuite {
    /// Tokenizer file.
    pub tokenizer: String,
    /// Text encoded.
    pub corpus: String,
    /// Bytes of text encoded per run.
    pub corpus_bytes: u64,
    /// Tokens produced per run.
    pub tokens: u64,
    /// Measured runs.
    pub runs: usize,
    /// Median encode throughput, megabytes (10^6 bytes) of text per second.
    pub encode_mb_per_s: f64,
    /// Median encode throughput, tokens per second.
    pub encode_tokens_per_s: f64,
}

/// Workload of the training suite.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainSettings {
    /// Config file or model description.
    pub config: String,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Measured steps.
    pub steps: usize,
    /// Discarded steps.
    pub warmup: usize,
    /// Data-parallel replicas the batch was split across (reports from before replicas existed read as 1).
    #[serde(default = "one")]
    pub replicas: usize,
    /// Compute precision of the steps (reports from before precision was recorded read as f32).
    #[serde(default)]
    pub precision: Precision,
}

fn one() -> usize {
    1
}

/// Figures of the training suite.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainSuite {
    /// Workload.
    pub settings: TrainSettings,
    /// Parameters trained.
    pub parameters: u64,
    /// Wall time of one optimizer step (forward, backward, AdamW update), milliseconds.
    pub step_time_ms: Percentiles,
    /// Training tokens per second at the median step time (`batch * seq_len / p50`).
    pub tokens_per_s: f64,
    /// Peak resident memory in bytes.
    pub peak_memory_bytes: Option<u64>,
    /// What the peak covers.
    pub peak_memory_scope: PeakScope,
}

/// How a figure is judged: which direction is better, and the words for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FigureKind {
    /// A duration: lower is better ("faster").
    Time,
    /// Work per second: higher is better ("faster").
    Throughput,
    /// Bytes: lower is better ("smaller").
    Memory,
}

impl FigureKind {
    /// Whether a larger value is an improvement.
    pub fn higher_is_better(self) -> bool {
        matches!(self, FigureKind::Throughput)
    }
}

/// One comparable number of a report.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    /// Stable name (`ttft_ms`, `decode_latency_ms.p99`, `flash/forward/seq=512 time_ms`).
    pub name: String,
    /// The value.
    pub value: f64,
    /// How it is judged.
    pub kind: FigureKind,
}

fn fig(name: impl Into<String>, value: f64, kind: FigureKind) -> Figure {
    Figure {
        name: name.into(),
        value,
        kind,
    }
}

fn latency_figures(prefix: &str, p: &Percentiles) -> Vec<Figure> {
    p.named()
        .into_iter()
        .map(|(n, v)| fig(format!("{prefix}.{n}"), v, FigureKind::Time))
        .collect()
}

impl Report {
    /// Every comparable figure, in display order. Absent memory readings are left out.
    pub fn figures(&self) -> Vec<Figure> {
        let mut out = Vec::new();
        match &self.body {
            ReportBody::Model(m) => {
                out.push(fig("ttft_ms", m.ttft_ms, FigureKind::Time));
                out.push(fig(
                    "prefill_tokens_per_s",
                    m.prefill_tokens_per_s,
                    FigureKind::Throughput,
                ));
                out.push(fig(
                    "decode_tokens_per_s",
                    m.decode_tokens_per_s,
                    FigureKind::Throughput,
                ));
                out.extend(latency_figures("decode_latency_ms", &m.decode_latency_ms));
                out.push(fig(
                    "end_to_end_tokens_per_s",
                    m.end_to_end_tokens_per_s,
                    FigureKind::Throughput,
                ));
                if let Some(b) = m.peak_memory_bytes {
                    out.push(fig("peak_memory_bytes", b as f64, FigureKind::Memory));
                }
                if let Some(d) = m.device_memory {
                    out.push(fig(
                        "device_memory_in_use_bytes",
                        d.in_use_bytes as f64,
                        FigureKind::Memory,
                    ));
                    out.push(fig(
                        "device_memory_reserved_bytes",
                        d.reserved_bytes as f64,
                        FigureKind::Memory,
                    ));
                }
                if let Some(b) = m.kv_cache_bytes {
                    out.push(fig("kv_cache_bytes", b as f64, FigureKind::Memory));
                }
            }
            ReportBody::Kernels(k) => {
                for r in &k.results {
                    let point = format!("{}/{}/seq={}", r.kernel, r.pass.name(), r.seq_len);
                    out.push(fig(format!("{point} time_ms"), r.time_ms, FigureKind::Time));
                    if let Some(b) = r.peak_bytes {
                        out.push(fig(
                            format!("{point} peak_bytes"),
                            b as f64,
                            FigureKind::Memory,
                        ));
                    }
                }
            }
            ReportBody::Tokenizer(t) => {
                out.push(fig(
                    "encode_mb_per_s",
                    t.encode_mb_per_s,
                    FigureKind::Throughput,
                ));
                out.push(fig(
                    "encode_tokens_per_s",
                    t.encode_tokens_per_s,
                    FigureKind::Throughput,
                ));
            }
            ReportBody::Train(t) => {
                out.extend(latency_figures("step_time_ms", &t.step_time_ms));
                out.push(fig("tokens_per_s", t.tokens_per_s, FigureKind::Throughput));
                if let Some(b) = t.peak_memory_bytes {
                    out.push(fig("peak_memory_bytes", b as f64, FigureKind::Memory));
                }
            }
        }
        out
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }

    /// Parses a report from JSON text.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Reads a report file written by `ember bench --format json`.
    pub fn read(path: &Path) -> Result<Self, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|source| BenchError::Io {
            path: path.into(),
            source,
        })?;
        Self::from_json(&text).map_err(|source| BenchError::ReportFormat {
            path: path.into(),
            source,
        })
    }
}
