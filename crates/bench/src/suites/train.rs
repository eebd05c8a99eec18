//! Training step time and tokens/s, measured on ember-training's own loop ([`ember_training::train`]), so the
//! figure includes everything a real step does: forward, cross-entropy, backward, gradient clipping and AdamW.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use ember_training::{
    AdamWConfig, CosineSchedule, DataParallelSettings, ModelStore, Observer, StepReport, TrainData,
    TrainSettings, TrainableModel, train,
};

use crate::memory::{self, PeakScope};
use crate::report::{TrainSettings as BenchTrainSettings, TrainSuite};
use crate::timing::{Clock, millis};
use crate::{BenchError, Percentiles};

/// Records the clock at every completed optimizer step.
struct StepClock<'c> {
    clock: &'c dyn Clock,
    marks: Vec<Duration>,
}

impl Observer for StepClock<'_> {
    fn on_step(&mut self, _report: &StepReport) {
        self.marks.push(self.clock.now());
    }
}

/// Loop settings that do nothing but train for `warmup + steps` steps: no logging, validation or checkpoint
/// inside the timed steps (the loop's final validation and checkpoint come after the last mark).
fn loop_settings(
    s: &BenchTrainSettings,
    run_dir: &Path,
    data_parallel: DataParallelSettings,
) -> TrainSettings {
    let total = s.warmup + s.steps;
    let never = total + 1;
    TrainSettings {
        batch_size: s.batch,
        block_size: s.seq_len,
        grad_accum_steps: 1,
        max_steps: total,
        time_limit: None,
        schedule: CosineSchedule {
            peak: 1e-4,
            floor: 1e-5,
            warmup_steps: 0,
            total_steps: total,
        },
        optimizer: AdamWConfig::default(),
        grad_clip: 1.0,
        log_interval: never,
        eval_interval: never,
        checkpoint_interval: never,
        patience: None,
        precision: s.precision,
        checkpoint_activations: false,
        data_parallel,
        run_dir: run_dir.to_path_buf(),
        resume: false,
        config: serde_json::Value::Null,
    }
}

/// Trains `model` on `data` for `settings.warmup + settings.steps` steps with run files under `run_dir` (which
/// should be a scratch directory), and reports the time of each measured step.
///
/// Step `i` is timed from the end of step `i - 1` to the end of step `i`, so at least one warm-up step is
/// required; `data` must yield batches of `settings.batch` rows of `settings.seq_len + 1` tokens. With several
/// `data_parallel` replicas each batch is split across them (the report's `settings.replicas`).
// Each argument is a separate input of the measurement (model, data, store, workload, replicas, scratch dir,
// clock); bundling them into a struct would only rename them.
#[allow(clippy::too_many_arguments)]
pub fn run_train_suite<AB, M>(
    model: M,
    parameters: u64,
    data: &mut dyn TrainData,
    store: &dyn ModelStore<M>,
    settings: BenchTrainSettings,
    data_parallel: DataParallelSettings,
    run_dir: &Path,
    clock: &dyn Clock,
) -> Result<TrainSuite, BenchError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB> + TrainableModel<AB> + Send + 'static,
    M::InnerModule: TrainableModel<AB::InnerBackend>,
{
    if settings.warmup == 0 || settings.steps == 0 || settings.batch == 0 || settings.seq_len == 0 {
        return Err(BenchError::InvalidSettings(
            "the train suite needs at least 1 warm-up step (it times each step from the end of the previous one), \
             1 measured step, and a non-empty batch"
                .into(),
        ));
    }
    let mut settings = settings;
    settings.replicas = data_parallel.replicas();
    let loop_settings = loop_settings(&settings, run_dir, data_parallel);
    let mut observer = StepClock {
        clock,
        marks: Vec::new(),
    };
    let scope = memory::reset_peak_rss();
    train::<AB, M>(
        model,
        data,
        store,
        &loop_settings,
        &mut observer,
        &AtomicBool::new(false),
    )
    .map_err(|e| BenchError::Workload(format!("training: {e}")))?;
    let peak = memory::peak_rss_bytes()?;
    let marks = &observer.marks[settings.warmup - 1..];
    if marks.len() != settings.steps + 1 {
        return Err(BenchError::Workload(format!(
            "the training loop stopped after {} of {} steps",
            observer.marks.len(),
            settings.warmup + settings.steps
        )));
    }
    let step_ms: Vec<f64> = marks
        .windows(2)
        .map(|w| millis(w[1].saturating_sub(w[0])))
        .collect();
    let step_time_ms = Percentiles::from_samples(&step_ms)?;
    if step_time_ms.p50 <= 0.0 {
        return Err(BenchError::InvalidSamples(
            "training steps took no measurable time".into(),
        ));
    }
    Ok(TrainSuite {
        parameters,
        tokens_per_s: (settings.batch * settings.seq_len) as f64 / (step_time_ms.p50 / 1e3),
        step_time_ms,
        peak_memory_bytes: peak,
        peak_memory_scope: if peak.is_some() {
            scope
        } else {
            PeakScope::Process
        },
        settings,
    })
}
