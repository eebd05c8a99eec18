//! ember-bench: measures ember the way its users judge it.
//!
//! The harness is independent of any model: [`time_runs`] times closures after warm-up runs, [`Percentiles`]
//! summarises latencies (linear interpolation between closest ranks, as numpy), [`memory`] reads the peak resident
//! set size and resets it per phase, and [`Machine`] records where the figures were measured. Every bench produces
//! a [`Report`] that serialises to JSON, renders as a table ([`render_report`]) and compares against another report
//! ([`compare`]) with a verdict per figure against a noise threshold.
//!
//! The generation bench ([`bench_generation`]) times any [`GenerationWorkload`]: prefill (time to first token),
//! then decode steps (latency distribution and throughput). [`LmWorkload`] drives any ember-inference
//! [`ember_inference::Decoder`] that way, and [`bench_model`] does it for ember's transformer. [`suites`]
//! holds the attention-kernel, tokenizer and training benches.

mod compare;
mod device_memory;
mod error;
mod generation;
mod lm_workload;
mod machine;
pub mod memory;
mod model_bench;
mod render;
mod report;
mod stats;
pub mod suites;
mod timestamp;
mod timing;

pub use compare::{ComparedFigure, Comparison, Verdict, compare, judge};
#[cfg(feature = "cube")]
pub use device_memory::cube_memory;
pub use device_memory::{DeviceMemory, DeviceMemoryProbe, NoDeviceMemory};
/// The compute precision a training report records (ember-training's).
pub use ember_training::Precision;
pub use error::BenchError;
pub use generation::{GenerationTimings, GenerationWorkload, bench_generation, time_generation};
pub use lm_workload::{LmWorkload, synthetic_prompt};
pub use machine::Machine;
pub use model_bench::bench_model;
pub use render::{Table, format_value, render_comparison, render_report};
pub use report::{
    Figure, FigureKind, KernelResult, KernelSettings, KernelSuite, ModelBench, ModelInfo,
    ModelSettings, Pass, Report, ReportBody, SCHEMA_VERSION, TokenizerSuite, TrainSettings,
    TrainSuite,
};
pub use stats::{Percentiles, median, quantile_sorted};
pub use timestamp::{now_rfc3339, rfc3339_utc};
pub use timing::{Clock, MonotonicClock, Repetitions, millis, time_runs};

/// The version of ember this crate belongs to (the workspace version), written into every report.
pub const EMBER_VERSION: &str = env!("CARGO_PKG_VERSION");
