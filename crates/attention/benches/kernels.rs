//! Time and peak heap memory of each attention kernel, forward and forward+backward, for T = 128 ... 4096
//! on the CPU backend (burn-flex).
//!
//! Peak memory is measured, not estimated: a counting global allocator tracks live heap bytes, and the peak
//! is taken over one run of the pass after the inputs exist (so it covers scores, softmax, saved activations,
//! outputs and gradients, not q/k/v themselves).
//!
//! `cargo bench -p ember-attention --bench kernels` runs everything; `EMBER_BENCH_MAX_T=1024` caps the
//! sequence length. A summary is written to `$CARGO_TARGET_DIR/attention-bench/kernels.json` as records
//! `{kernel, seq_len, pass, time_ms, peak_bytes}` and printed as a Markdown table.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, ElementConversion, Tensor};
use criterion::{BenchmarkId, Criterion};
use ember_attention::{AttentionKernel, AttentionOptions, EmberBackend, attention};

/// Wraps the system allocator, counting live bytes and their high-water mark.
struct CountingAllocator;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the counters are atomics
// updated only after `System` succeeded.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        new
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Shapes of every point: one sequence, 4 query heads over 2 KV heads (grouped-query), head_dim 64.
const BATCH: usize = 1;
const Q_HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 64;
const SEQ_LENS: [usize; 6] = [128, 256, 512, 1024, 2048, 4096];

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pass {
    Forward,
    ForwardBackward,
}

impl Pass {
    fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::ForwardBackward => "forward_backward",
        }
    }
}

fn inputs<B: Backend>(seq: usize) -> [Tensor<B, 4>; 3] {
    let device = Default::default();
    let random = |heads| {
        Tensor::random(
            [BATCH, heads, seq, HEAD_DIM],
            Distribution::Normal(0.0, 1.0),
            &device,
        )
    };
    [random(Q_HEADS), random(KV_HEADS), random(KV_HEADS)]
}

/// One causal forward pass; the output is read back so lazy backends finish the work.
fn forward<B: EmberBackend>(kernel: AttentionKernel, [q, k, v]: [Tensor<B, 4>; 3]) -> f32 {
    let out = attention(kernel, q, k, v, &AttentionOptions::causal());
    out.sum().into_scalar().elem()
}

/// Forward, `sum(out)` loss, backward; reads one gradient back.
fn forward_backward(kernel: AttentionKernel, [q, k, v]: [Tensor<Autodiff<Flex>, 4>; 3]) -> f32 {
    let (q, k, v) = (q.require_grad(), k.require_grad(), v.require_grad());
    let out = attention(
        kernel,
        q.clone(),
        k.clone(),
        v.clone(),
        &AttentionOptions::causal(),
    );
    let grads = out.sum().backward();
    let dq = q.grad(&grads).map(|g| g.sum().into_scalar());
    let dk = k.grad(&grads).map(|g| g.sum().into_scalar());
    dq.zip(dk).map_or(f32::NAN, |(a, b)| a + b)
}

fn run(kernel: AttentionKernel, pass: Pass, seq: usize) -> f32 {
    match pass {
        Pass::Forward => forward::<Flex>(kernel, inputs(seq)),
        Pass::ForwardBackward => forward_backward(kernel, inputs(seq)),
    }
}

/// Peak live heap bytes above the level before the run, over one run (inputs included: they are
/// O(T) and the same for every kernel).
fn peak_bytes(kernel: AttentionKernel, pass: Pass, seq: usize) -> usize {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    std::hint::black_box(run(kernel, pass, seq));
    PEAK.load(Ordering::Relaxed) - base
}

/// Per-iteration wall times collected by criterion's custom timing, keyed by point.
type Samples = BTreeMap<(Pass, usize, String), Vec<Duration>>;
static SAMPLES: Mutex<Samples> = Mutex::new(BTreeMap::new());

fn max_seq_len() -> usize {
    std::env::var("EMBER_BENCH_MAX_T")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX)
}

fn bench_kernels(c: &mut Criterion) {
    let mut peaks = BTreeMap::new();
    for pass in [Pass::Forward, Pass::ForwardBackward] {
        let mut group = c.benchmark_group(format!("attention_{}", pass.name()));
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(500));
        group.measurement_time(Duration::from_secs(2));
        for seq in SEQ_LENS.into_iter().filter(|t| *t <= max_seq_len()) {
            for kernel in AttentionKernel::ALL {
                peaks.insert(
                    (pass, seq, kernel.to_string()),
                    peak_bytes(kernel, pass, seq),
                );
                group.bench_with_input(BenchmarkId::new(kernel.name(), seq), &seq, |b, &seq| {
                    b.iter_custom(|iters| {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let start = Instant::now();
                            std::hint::black_box(run(kernel, pass, seq));
                            let elapsed = start.elapsed();
                            total += elapsed;
                            let mut samples = SAMPLES.lock().unwrap_or_else(|e| e.into_inner());
                            samples
                                .entry((pass, seq, kernel.to_string()))
                                .or_default()
                                .push(elapsed);
                        }
                        total
                    })
                });
            }
        }
        group.finish();
    }
    report(&peaks);
}

/// Writes the JSON records and prints the Markdown table.
fn report(peaks: &BTreeMap<(Pass, usize, String), usize>) {
    let samples = SAMPLES.lock().unwrap_or_else(|e| e.into_inner());
    let mut records = Vec::new();
    println!("\n| pass | T | kernel | median ms | peak MiB |\n|---|---|---|---|---|");
    for ((pass, seq, kernel), peak) in peaks {
        let mut times = samples
            .get(&(*pass, *seq, kernel.clone()))
            .cloned()
            .unwrap_or_default();
        times.sort();
        let median_ms = times
            .get(times.len() / 2)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
        println!(
            "| {} | {seq} | {kernel} | {median_ms:.2} | {:.1} |",
            pass.name(),
            *peak as f64 / (1024.0 * 1024.0)
        );
        records.push(serde_json::json!({
            "kernel": kernel,
            "seq_len": seq,
            "pass": pass.name(),
            "time_ms": median_ms,
            "peak_bytes": peak,
        }));
    }
    let dir = std::path::Path::new(
        &std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()),
    )
    .join("attention-bench");
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        let json = serde_json::to_string_pretty(&records).unwrap_or_default();
        std::fs::write(dir.join("kernels.json"), json)
    });
    match written {
        Ok(()) => println!("wrote {}", dir.join("kernels.json").display()),
        Err(err) => eprintln!("could not write {}: {err}", dir.display()),
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    bench_kernels(&mut criterion);
    criterion.final_summary();
}
