//! `/metrics` in Prometheus' text format: the scheduler's counters and gauges, and latency histograms the
//! request sinks record.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ember_inference::SchedulerStats;

/// Upper bounds (seconds) of the time-to-first-token buckets: a queued request on a CPU can wait seconds.
const TTFT_BUCKETS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Upper bounds (seconds) of the inter-token latency buckets.
const ITL_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0,
];

#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, seconds: f64) {
        for (bound, count) in self.bounds.iter().zip(&mut self.counts) {
            if seconds <= *bound {
                *count += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.count);
    }
}

/// What the HTTP side records itself; the rest comes from [`SchedulerStats`].
#[derive(Debug)]
pub struct Metrics {
    http_requests: AtomicU64,
    http_errors: AtomicU64,
    rejected: AtomicU64,
    ttft: Mutex<Histogram>,
    itl: Mutex<Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            http_requests: AtomicU64::new(0),
            http_errors: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            ttft: Mutex::new(Histogram::new(&TTFT_BUCKETS)),
            itl: Mutex::new(Histogram::new(&ITL_BUCKETS)),
        }
    }
}

impl Metrics {
    /// A completion request arrived.
    pub fn request(&self) {
        self.http_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A request got an error response.
    pub fn error(&self) {
        self.http_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A request was refused with 429.
    pub fn rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Time from submission to a request's first token.
    pub fn time_to_first_token(&self, d: Duration) {
        if let Ok(mut h) = self.ttft.lock() {
            h.observe(d.as_secs_f64());
        }
    }

    /// Time between two tokens of one request.
    pub fn inter_token_latency(&self, d: Duration) {
        if let Ok(mut h) = self.itl.lock() {
            h.observe(d.as_secs_f64());
        }
    }

    /// The exposition text; `queued` counts requests sent to the worker but not yet in its scheduler too.
    pub fn render(&self, s: &SchedulerStats, queued: usize, block_size: usize) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        let counter = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        metric(
            "ember_http_requests_total",
            "counter",
            "Completion requests received.",
            counter(&self.http_requests),
        );
        metric(
            "ember_http_errors_total",
            "counter",
            "Requests answered with an error.",
            counter(&self.http_errors),
        );
        metric(
            "ember_requests_rejected_total",
            "counter",
            "Requests refused with 429 (queue full).",
            counter(&self.rejected),
        );
        metric(
            "ember_requests_submitted_total",
            "counter",
            "Requests accepted by the scheduler.",
            s.submitted as f64,
        );
        metric(
            "ember_requests_finished_total",
            "counter",
            "Requests that ran to completion.",
            s.finished as f64,
        );
        metric(
            "ember_requests_cancelled_total",
            "counter",
            "Requests whose client disconnected.",
            s.cancelled as f64,
        );
        metric(
            "ember_requests_failed_total",
            "counter",
            "Requests the scheduler refused or failed.",
            s.failed as f64,
        );
        metric(
            "ember_preemptions_total",
            "counter",
            "Running requests preempted to free KV blocks.",
            s.preemptions as f64,
        );
        metric(
            "ember_prompt_tokens_total",
            "counter",
            "Prompt tokens of admitted requests.",
            s.prompt_tokens as f64,
        );
        metric(
            "ember_generation_tokens_total",
            "counter",
            "Tokens generated.",
            s.generated_tokens as f64,
        );
        metric(
            "ember_prefill_tokens_total",
            "counter",
            "Tokens run by prefill (prompt tokens not cached, and recomputation).",
            s.prefilled_tokens as f64,
        );
        metric(
            "ember_prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache.",
            s.cached_prompt_tokens as f64,
        );
        let hit_rate = if s.prompt_tokens == 0 {
            0.0
        } else {
            s.cached_prompt_tokens as f64 / s.prompt_tokens as f64
        };
        metric(
            "ember_prefix_cache_hit_rate",
            "gauge",
            "Fraction of prompt tokens served from the prefix cache.",
            hit_rate,
        );
        metric(
            "ember_prefix_cache_sequences",
            "gauge",
            "Sequences held by the prefix cache.",
            s.cached_prefixes as f64,
        );
        metric(
            "ember_queue_depth",
            "gauge",
            "Requests waiting for a place in the batch.",
            queued as f64,
        );
        metric(
            "ember_running_requests",
            "gauge",
            "Requests prefilling or decoding.",
            s.running as f64,
        );
        metric(
            "ember_batch_size",
            "gauge",
            "Rows of the last decode step.",
            s.last_batch as f64,
        );
        metric(
            "ember_kv_blocks_used",
            "gauge",
            "KV blocks in use (running and cached sequences).",
            s.used_blocks as f64,
        );
        metric(
            "ember_kv_blocks_total",
            "gauge",
            "KV blocks the budget holds.",
            s.max_blocks as f64,
        );
        metric(
            "ember_kv_block_size",
            "gauge",
            "Positions per KV block.",
            block_size as f64,
        );
        if let Ok(h) = self.ttft.lock() {
            h.render(
                &mut out,
                "ember_time_to_first_token_seconds",
                "From submission to the first generated token.",
            );
        }
        if let Ok(h) = self.itl.lock() {
            h.render(
                &mut out,
                "ember_inter_token_latency_seconds",
                "Between two generated tokens of one request.",
            );
        }
        out
    }
}
