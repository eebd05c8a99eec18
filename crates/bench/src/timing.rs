//! Timing closures: warm-up runs that are discarded, then measured runs.

use std::time::{Duration, Instant};

use crate::BenchError;

/// A monotonic source of time. The real one wraps [`Instant`]; tests drive a fake one so that derived figures
/// (tokens/s, percentiles) can be checked exactly.
pub trait Clock {
    /// Time elapsed since an arbitrary fixed origin.
    fn now(&self) -> Duration;
}

/// The system's monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// How many times to run a closure: `warmup` discarded runs (caches, lazy allocation, kernel compilation on GPU
/// backends), then `runs` measured ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repetitions {
    /// Discarded runs.
    pub warmup: usize,
    /// Measured runs; at least 1.
    pub runs: usize,
}

/// Runs `f` `reps.warmup + reps.runs` times and returns the wall time of each measured run.
///
/// `f` must block until its work is finished (on asynchronous backends: call `B::sync` or read a result back),
/// otherwise only the time to enqueue is measured.
pub fn time_runs<T>(
    clock: &dyn Clock,
    reps: Repetitions,
    mut f: impl FnMut() -> Result<T, BenchError>,
) -> Result<Vec<Duration>, BenchError> {
    if reps.runs == 0 {
        return Err(BenchError::InvalidSettings(
            "runs must be at least 1".into(),
        ));
    }
    for _ in 0..reps.warmup {
        std::hint::black_box(f()?);
    }
    let mut times = Vec::with_capacity(reps.runs);
    for _ in 0..reps.runs {
        let start = clock.now();
        std::hint::black_box(f()?);
        times.push(clock.now().saturating_sub(start));
    }
    Ok(times)
}

/// Milliseconds as `f64`, the unit of every latency in the reports.
pub fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    struct FakeClock(Cell<Duration>);

    impl Clock for FakeClock {
        fn now(&self) -> Duration {
            self.0.get()
        }
    }

    #[test]
    fn warmup_runs_are_executed_but_not_timed() {
        let clock = FakeClock(Cell::new(Duration::ZERO));
        let mut call = 0u64;
        let times = time_runs(&clock, Repetitions { warmup: 2, runs: 3 }, || {
            call += 1;
            // Each call "takes" `call` milliseconds, so the measured runs are calls 3, 4 and 5.
            clock.0.set(clock.0.get() + Duration::from_millis(call));
            Ok(())
        })
        .unwrap();
        assert_eq!(call, 5);
        assert_eq!(
            times,
            vec![
                Duration::from_millis(3),
                Duration::from_millis(4),
                Duration::from_millis(5)
            ]
        );
    }

    #[test]
    fn zero_runs_is_refused_and_workload_errors_propagate() {
        let clock = MonotonicClock::new();
        assert!(time_runs(&clock, Repetitions { warmup: 0, runs: 0 }, || Ok(())).is_err());
        let err = time_runs::<()>(&clock, Repetitions { warmup: 0, runs: 1 }, || {
            Err(BenchError::Workload("out of memory".into()))
        })
        .unwrap_err();
        assert!(err.to_string().contains("out of memory"), "{err}");
    }

    #[test]
    fn millis_converts_durations() {
        assert_eq!(millis(Duration::from_micros(1500)), 1.5);
    }
}
