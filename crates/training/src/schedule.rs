//! Learning-rate schedule: linear warm-up, then cosine decay to a floor.

/// `lr(step)` for optimiser steps counted from 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CosineSchedule {
    /// Learning rate at the end of warm-up.
    pub peak: f64,
    /// Learning rate at and after `total_steps`.
    pub floor: f64,
    /// Steps of linear warm-up.
    pub warmup_steps: usize,
    /// Step at which the cosine reaches the floor.
    pub total_steps: usize,
}

/// The largest peak learning rate [`CosineSchedule::validate`] accepts. AdamW moves every weight by about the
/// learning rate per step whatever the gradient's scale, so a rate above 1 moves weights initialised near 0.02
/// by 50x their size each step: the loss is NaN within a few steps.
pub const MAX_LEARNING_RATE: f64 = 1.0;

impl CosineSchedule {
    /// Checks the rates and steps: `peak` in (0, 1] (AdamW moves every weight by about the rate per step, so a
    /// rate above 1 moves weights initialised near 0.02 by 50x their size), `floor` in [0, peak], warm-up no
    /// longer than the schedule. The error names the field (`peak`, `floor`, `warmup_steps`) and the range.
    pub fn validate(&self) -> Result<(), crate::TrainError> {
        let refuse = |key: &str, message: String| {
            Err(crate::TrainError::Unsupported {
                key: key.to_string(),
                message,
            })
        };
        // Written so that NaN fails: every comparison with NaN is false.
        if !(self.peak > 0.0 && self.peak <= MAX_LEARNING_RATE) {
            return refuse(
                "peak",
                format!(
                    "expected a learning rate in (0, {MAX_LEARNING_RATE}], found {:?}",
                    self.peak
                ),
            );
        }
        if !(self.floor >= 0.0 && self.floor <= self.peak) {
            return refuse(
                "floor",
                format!(
                    "expected a learning rate in [0, peak = {:?}], found {:?}",
                    self.peak, self.floor
                ),
            );
        }
        if self.warmup_steps > self.total_steps {
            return refuse(
                "warmup_steps",
                format!(
                    "expected at most total_steps ({}), found {}",
                    self.total_steps, self.warmup_steps
                ),
            );
        }
        Ok(())
    }

    /// The learning rate for step `step` (0-based). Warm-up rises linearly from `peak / warmup` at step 0 to `peak`
    /// at step `warmup - 1` (so the first step is never taken with a zero rate); the cosine then falls from `peak`
    /// at `warmup` to `floor` at `total_steps`, and stays there.
    pub fn lr(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        if step >= self.total_steps {
            return self.floor;
        }
        let span = (self.total_steps - self.warmup_steps).max(1) as f64;
        let progress = (step - self.warmup_steps) as f64 / span;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.floor + (self.peak - self.floor) * cosine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule() -> CosineSchedule {
        CosineSchedule {
            peak: 1e-3,
            floor: 1e-4,
            warmup_steps: 10,
            total_steps: 110,
        }
    }

    #[test]
    fn warmup_is_linear_and_reaches_the_peak() {
        let s = schedule();
        // Exact arithmetic on small integers scaled by 1e-3: only rounding of one multiply and divide, < 1e-18.
        assert!((s.lr(0) - 1e-4).abs() < 1e-18);
        assert!((s.lr(4) - 5e-4).abs() < 1e-18);
        assert!((s.lr(9) - 1e-3).abs() < 1e-18);
    }

    #[test]
    fn cosine_passes_the_midpoint_and_ends_on_the_floor() {
        let s = schedule();
        assert_eq!(s.lr(10), 1e-3);
        // Halfway through the decay cos(pi/2) = 0, so lr = (peak + floor) / 2; cos(pi/2) is 6e-17, not 0, hence 1e-15.
        assert!((s.lr(60) - 5.5e-4).abs() < 1e-15);
        assert_eq!(s.lr(110), 1e-4);
        assert_eq!(s.lr(10_000), 1e-4);
    }

    #[test]
    fn validate_refuses_rates_that_cannot_train() {
        assert!(schedule().validate().is_ok());
        let key_of = |s: CosineSchedule| match s.validate() {
            Err(crate::TrainError::Unsupported { key, .. }) => key,
            other => panic!("{s:?}: expected a refusal, got {other:?}"),
        };
        for (peak, floor, key) in [
            (f64::NAN, 0.0, "peak"),
            (f64::INFINITY, 0.0, "peak"),
            (0.0, 0.0, "peak"),
            (-1e-3, 0.0, "peak"),
            (1e6, 0.0, "peak"),
            (1e-3, f64::NAN, "floor"),
            (1e-3, 2e-3, "floor"),
            (1e-3, -1e-4, "floor"),
        ] {
            assert_eq!(
                key_of(CosineSchedule {
                    peak,
                    floor,
                    ..schedule()
                }),
                key
            );
        }
        let long_warmup = CosineSchedule {
            warmup_steps: 200,
            ..schedule()
        };
        assert_eq!(key_of(long_warmup), "warmup_steps");
        // The edges are accepted.
        let edges = CosineSchedule {
            peak: MAX_LEARNING_RATE,
            floor: MAX_LEARNING_RATE,
            warmup_steps: 110,
            ..schedule()
        };
        assert!(edges.validate().is_ok());
    }

    #[test]
    fn decay_is_monotonic() {
        let s = schedule();
        for step in 10..110 {
            assert!(s.lr(step + 1) <= s.lr(step), "lr rose at step {step}");
        }
    }
}
