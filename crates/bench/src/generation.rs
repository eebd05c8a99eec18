//! The generation bench: time to first token, prefill and decode throughput, and the decode latency
//! distribution of any [`GenerationWorkload`].

use std::time::Duration;

use crate::device_memory::{DeviceMemory, DeviceMemoryProbe};
use crate::memory::{self, PeakScope};
use crate::report::{ModelBench, ModelInfo, ModelSettings};
use crate::timing::{Clock, millis};
use crate::{BenchError, Percentiles, stats};

/// Something that generates tokens the way `ember generate` does, one phase at a time, so each phase can be timed.
///
/// Both methods must block until their sampled token ids are on the host: on asynchronous backends that read-back
/// is what makes the wall time cover the work.
pub trait GenerationWorkload {
    /// Starts a new generation from scratch (fresh KV cache): runs the prefill of every prompt of the batch and
    /// samples the first generated token of each.
    fn prefill(&mut self) -> Result<(), BenchError>;
    /// Runs one decode step: one new token for every sequence of the batch, attending to the cache.
    fn decode_step(&mut self) -> Result<(), BenchError>;

    /// Bytes of KV-cache storage the current generation holds, where the workload knows it.
    fn kv_cache_bytes(&self) -> Option<u64> {
        None
    }
}

/// Timings of the measured runs, before they are reduced to figures.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationTimings {
    /// Prefill plus first-token sampling, one per run.
    pub prefill: Vec<Duration>,
    /// Every decode step of every run, in order.
    pub decode_steps: Vec<Duration>,
    /// Whole run (prefill and all decode steps), one per run.
    pub total: Vec<Duration>,
    /// Largest device-memory reading, taken after each prefill and at the end of each run (outside the timed
    /// phases); `None` where the probe reports nothing.
    pub device_memory: Option<DeviceMemory>,
    /// Largest KV-cache size at the end of a run (the cache only grows within a run).
    pub kv_cache_bytes: Option<u64>,
}

/// Runs `settings.warmup` discarded and `settings.runs` measured generations of `settings.gen_len` tokens each:
/// one prefill (which yields the first token) then `gen_len - 1` decode steps. `device` is read after each
/// prefill and at the end of each run, between timed phases.
pub fn time_generation(
    workload: &mut dyn GenerationWorkload,
    settings: &ModelSettings,
    clock: &dyn Clock,
    device: &dyn DeviceMemoryProbe,
) -> Result<GenerationTimings, BenchError> {
    check_settings(settings)?;
    let mut timings = GenerationTimings {
        prefill: Vec::new(),
        decode_steps: Vec::new(),
        total: Vec::new(),
        device_memory: None,
        kv_cache_bytes: None,
    };
    for run in 0..settings.warmup + settings.runs {
        let measured = run >= settings.warmup;
        let start = clock.now();
        workload.prefill()?;
        let prefill = clock.now().saturating_sub(start);
        timings.device_memory = DeviceMemory::max_of(timings.device_memory, device.read());
        let mut run_time = prefill;
        let mut step_start = clock.now();
        for _ in 1..settings.gen_len {
            workload.decode_step()?;
            let step_end = clock.now();
            let step = step_end.saturating_sub(step_start);
            run_time += step;
            if measured {
                timings.decode_steps.push(step);
            }
            step_start = step_end;
        }
        timings.device_memory = DeviceMemory::max_of(timings.device_memory, device.read());
        timings.kv_cache_bytes = timings.kv_cache_bytes.max(workload.kv_cache_bytes());
        if measured {
            timings.prefill.push(prefill);
            timings.total.push(run_time);
        }
    }
    Ok(timings)
}

fn check_settings(s: &ModelSettings) -> Result<(), BenchError> {
    let fail = |what: &str| Err(BenchError::InvalidSettings(what.to_string()));
    if s.runs == 0 {
        return fail("runs must be at least 1");
    }
    if s.batch == 0 || s.prompt_len == 0 {
        return fail("batch and prompt length must be at least 1");
    }
    if s.gen_len < 2 {
        return fail(
            "gen-len must be at least 2: the first token comes from the prefill, decode needs one more",
        );
    }
    Ok(())
}

/// Throughput in items per second; errors on a zero duration rather than reporting infinity.
fn per_second(items: f64, time: f64, what: &str) -> Result<f64, BenchError> {
    if time > 0.0 {
        Ok(items / time)
    } else {
        Err(BenchError::InvalidSamples(format!(
            "{what} took no measurable time; increase the workload"
        )))
    }
}

/// Measures `workload` and assembles the model report body. The peak-memory counter is reset first (where the
/// kernel allows), so the peak covers generation with the model already loaded; `device` reads the device's
/// memory on GPU backends.
pub fn bench_generation(
    workload: &mut dyn GenerationWorkload,
    model: ModelInfo,
    settings: ModelSettings,
    clock: &dyn Clock,
    device: &dyn DeviceMemoryProbe,
) -> Result<ModelBench, BenchError> {
    let scope = memory::reset_peak_rss();
    let t = time_generation(workload, &settings, clock, device)?;
    let peak = memory::peak_rss_bytes()?;
    let secs = |d: &[Duration]| d.iter().map(Duration::as_secs_f64).collect::<Vec<_>>();
    let prefill_s = stats::median(&secs(&t.prefill))?;
    let total_s = stats::median(&secs(&t.total))?;
    let decode_total_s: f64 = t.decode_steps.iter().map(Duration::as_secs_f64).sum();
    let latencies: Vec<f64> = t.decode_steps.iter().copied().map(millis).collect();
    let batch = settings.batch as f64;
    Ok(ModelBench {
        ttft_ms: prefill_s * 1e3,
        prefill_tokens_per_s: per_second(batch * settings.prompt_len as f64, prefill_s, "prefill")?,
        decode_tokens_per_s: per_second(
            batch * t.decode_steps.len() as f64,
            decode_total_s,
            "decode",
        )?,
        decode_latency_ms: Percentiles::from_samples(&latencies)?,
        end_to_end_tokens_per_s: per_second(
            batch * settings.gen_len as f64,
            total_s,
            "generation",
        )?,
        peak_memory_bytes: peak,
        peak_memory_scope: if peak.is_some() {
            scope
        } else {
            PeakScope::Process
        },
        device_memory: t.device_memory,
        kv_cache_bytes: t.kv_cache_bytes,
        model,
        settings,
    })
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;
    use crate::NoDeviceMemory;

    #[derive(Clone)]
    struct FakeClock(Rc<Cell<Duration>>);

    impl Clock for FakeClock {
        fn now(&self) -> Duration {
            self.0.get()
        }
    }

    /// Prefill takes 40 ms; decode step `i` of a run takes `1 + i` ms, so each run's steps are 1, 2, ..., n ms.
    struct FakeWorkload {
        clock: FakeClock,
        step: u64,
        prefills: usize,
    }

    impl GenerationWorkload for FakeWorkload {
        fn prefill(&mut self) -> Result<(), BenchError> {
            self.prefills += 1;
            self.step = 0;
            self.clock
                .0
                .set(self.clock.0.get() + Duration::from_millis(40));
            Ok(())
        }
        fn decode_step(&mut self) -> Result<(), BenchError> {
            self.step += 1;
            self.clock
                .0
                .set(self.clock.0.get() + Duration::from_millis(self.step));
            Ok(())
        }
    }

    fn settings(gen_len: usize) -> ModelSettings {
        ModelSettings {
            batch: 2,
            prompt_len: 8,
            gen_len,
            runs: 3,
            warmup: 1,
            attention: "manual".into(),
            quantize: None,
            kv_cache: "contiguous".into(),
        }
    }

    fn model() -> ModelInfo {
        ModelInfo {
            name: "fake".into(),
            architecture: "llama".into(),
            parameters: 1,
            dtype: "f32".into(),
            weight_bytes: 4,
        }
    }

    #[test]
    fn figures_follow_from_the_phase_timings() {
        let clock = FakeClock(Rc::new(Cell::new(Duration::ZERO)));
        let mut w = FakeWorkload {
            clock: clock.clone(),
            step: 0,
            prefills: 0,
        };
        // Device memory grows by 100 bytes per reading: the report keeps the largest.
        let readings = Cell::new(0u64);
        let probe = || {
            readings.set(readings.get() + 100);
            Some(DeviceMemory {
                in_use_bytes: readings.get(),
                reserved_bytes: 2 * readings.get(),
            })
        };
        let b = bench_generation(&mut w, model(), settings(5), &clock, &probe).unwrap();
        // Two readings (after the prefill, at the end) in each of the 4 runs.
        assert_eq!(
            b.device_memory,
            Some(DeviceMemory {
                in_use_bytes: 800,
                reserved_bytes: 1600
            })
        );
        assert_eq!(b.kv_cache_bytes, None, "the fake workload has no cache");
        assert_eq!(w.prefills, 4, "one warm-up run and three measured runs");
        // Exact arithmetic on millisecond durations; 1e-9 only absorbs f64 rounding.
        let close = |got: f64, want: f64| {
            assert!((got - want).abs() < 1e-9 * want.max(1.0), "{got} != {want}")
        };
        close(b.ttft_ms, 40.0);
        // 2 sequences x 8 prompt tokens in 40 ms.
        close(b.prefill_tokens_per_s, 16.0 / 0.040);
        // Per run: 4 steps of 1+2+3+4 = 10 ms producing 2 tokens each.
        close(b.decode_tokens_per_s, 8.0 / 0.010);
        // Pooled steps over 3 runs: [1,1,1,2,2,2,3,3,3,4,4,4]; numpy.percentile gives p50 2.5, p90 4, max 4.
        close(b.decode_latency_ms.p50, 2.5);
        close(b.decode_latency_ms.p90, 4.0);
        close(b.decode_latency_ms.max, 4.0);
        // 2 x 5 generated tokens in 50 ms.
        close(b.end_to_end_tokens_per_s, 10.0 / 0.050);
    }

    #[test]
    fn a_single_generated_token_has_no_decode_phase_and_is_refused() {
        let clock = FakeClock(Rc::new(Cell::new(Duration::ZERO)));
        let mut w = FakeWorkload {
            clock: clock.clone(),
            step: 0,
            prefills: 0,
        };
        let err =
            bench_generation(&mut w, model(), settings(1), &clock, &NoDeviceMemory).unwrap_err();
        assert!(err.to_string().contains("gen-len"), "{err}");
        assert_eq!(w.prefills, 0, "settings are checked before any work");
    }
}
