//! The bookkeeping of one invocation of [`crate::train`]: the persisted state, the clock, the losses and the
//! throughput between log lines.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::TrainError;
use crate::checkpoint::TrainerState;
use crate::metrics::{MetricsLog, MetricsRecord};
use crate::trainer::{Observer, StepReport, StopReason, TrainSettings, TrainSummary};

/// The persisted [`TrainerState`] plus what this invocation of [`crate::train`] measures: its clock, losses and the
/// throughput since the last log line.
pub(crate) struct RunProgress {
    pub(crate) state: TrainerState,
    pub(crate) started: Instant,
    pub(crate) elapsed_before: f64,
    pub(crate) tokens_before: u64,
    pub(crate) interval_start: (Instant, u64),
    pub(crate) losses: Vec<f64>,
    pub(crate) best_val_bpb: Option<f64>,
    pub(crate) last_eval_step: Option<usize>,
}

impl RunProgress {
    pub(crate) fn new(state: TrainerState) -> Self {
        RunProgress {
            started: Instant::now(),
            elapsed_before: state.elapsed_s,
            tokens_before: state.tokens_seen,
            interval_start: (Instant::now(), state.tokens_seen),
            losses: Vec::new(),
            best_val_bpb: None,
            last_eval_step: None,
            state,
        }
    }

    /// Training seconds over every invocation of the run.
    pub(crate) fn elapsed_s(&self) -> f64 {
        self.elapsed_before + self.started.elapsed().as_secs_f64()
    }

    /// Tokens per second of this invocation.
    pub(crate) fn tokens_per_sec(&self) -> f64 {
        (self.state.tokens_seen - self.tokens_before) as f64
            / self.started.elapsed().as_secs_f64().max(1e-9)
    }

    /// A stop asked for on this machine: Ctrl-C (the `stop` flag) or the time limit.
    pub(crate) fn requested_stop(
        &self,
        settings: &TrainSettings,
        stop: &AtomicBool,
    ) -> Option<StopReason> {
        if stop.load(Ordering::SeqCst) {
            Some(StopReason::Interrupted)
        } else if settings
            .time_limit
            .is_some_and(|limit| self.started.elapsed() >= limit)
        {
            Some(StopReason::TimeLimit)
        } else {
            None
        }
    }

    /// Counts a finished optimiser step, reports it, and appends a metrics line every `log_interval` steps. A
    /// loss that is not finite ends the run.
    pub(crate) fn record_step(
        &mut self,
        loss: f64,
        lr: f64,
        grad_norm: f64,
        settings: &TrainSettings,
        metrics: &mut MetricsLog,
        observer: &mut dyn Observer,
    ) -> Result<(), TrainError> {
        let tokens_per_step =
            (settings.batch_size * settings.block_size * settings.grad_accum_steps) as u64;
        self.state.step += 1;
        self.state.tokens_seen += tokens_per_step;
        self.state.elapsed_s = self.elapsed_s();
        if !loss.is_finite() {
            return Err(TrainError::Diverged {
                step: self.state.step,
                loss: loss as f32,
            });
        }
        self.losses.push(loss);
        observer.on_step(&StepReport {
            step: self.state.step,
            max_steps: settings.max_steps,
            loss,
            lr,
            grad_norm,
            tokens_per_sec: self.tokens_per_sec(),
        });
        if self.state.step.is_multiple_of(settings.log_interval) {
            let (since, tokens_then) = self.interval_start;
            let rate = (self.state.tokens_seen - tokens_then) as f64
                / since.elapsed().as_secs_f64().max(1e-9);
            metrics.append(&MetricsRecord {
                step: self.state.step,
                loss: Some(loss),
                lr: Some(lr),
                grad_norm: Some(grad_norm),
                tokens_per_sec: Some(rate),
                elapsed_s: Some(self.state.elapsed_s),
                peak_rss_mib: crate::peak_rss_bytes().map(|b| b as f64 / (1 << 20) as f64),
                ..Default::default()
            })?;
            self.interval_start = (Instant::now(), self.state.tokens_seen);
        }
        Ok(())
    }

    pub(crate) fn summary(self, stop_reason: StopReason) -> TrainSummary {
        TrainSummary {
            steps: self.state.step,
            stop_reason,
            tokens_per_sec: self.tokens_per_sec(),
            losses: self.losses,
            best_val_loss: self.state.best_val_loss,
            best_val_bpb: self.best_val_bpb,
            peak_rss_bytes: crate::peak_rss_bytes(),
        }
    }
}
