//! The training loop: micro-batches, accumulation, clipping, AdamW, validation, checkpoints, early stopping.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, FloatDType};

use crate::adamw::{AdamW, AdamWConfig};
use crate::backprop::{Backprop, micro_batch_gradients};
use crate::checkpoint::{OPTIMIZER_FILE, TrainerState, resolve_checkpoint, write_atomically};
use crate::data_parallel::{DataParallel, DataParallelSettings};
use crate::loss::{counted_targets, inputs_and_targets, target_weights};
use crate::metrics::{MetricsLog, MetricsRecord};
use crate::model_io::{ModelStore, TrainData, TrainableModel};
use crate::params::Gradients;
use crate::run_progress::RunProgress;
use crate::schedule::CosineSchedule;
use crate::{TrainError, plot};

/// Numeric precision of the forward and backward passes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32.
    #[default]
    F32,
    /// bf16 activations and matmuls with f32 master weights: parameters, gradients and optimizer state stay f32,
    /// each matmul casts its weight to bf16, norms and the loss compute in f32.
    Bf16,
}

/// Everything the loop needs to know, independent of the CLI's config format.
#[derive(Debug, Clone)]
pub struct TrainSettings {
    /// Sequences per micro-batch (must match the data source's batches).
    pub batch_size: usize,
    /// Tokens per sequence (the data source yields `block_size + 1` per row).
    pub block_size: usize,
    /// Micro-batches per optimiser step; their gradients are averaged.
    pub grad_accum_steps: usize,
    /// Last optimiser step (exclusive).
    pub max_steps: usize,
    /// Stop after this much wall time in this invocation (a checkpoint is written).
    pub time_limit: Option<Duration>,
    /// Learning-rate schedule.
    pub schedule: CosineSchedule,
    /// AdamW hyper-parameters.
    pub optimizer: AdamWConfig,
    /// Global gradient-norm clip; 0 disables.
    pub grad_clip: f64,
    /// Steps between training log lines.
    pub log_interval: usize,
    /// Steps between validation passes.
    pub eval_interval: usize,
    /// Steps between `last/` checkpoints.
    pub checkpoint_interval: usize,
    /// Validation passes without improvement before stopping; `None` never stops early.
    pub patience: Option<usize>,
    /// Compute precision.
    pub precision: Precision,
    /// Recompute each block's activations in the backward pass instead of keeping them (less memory, about a
    /// third more compute); see [`TrainableModel::checkpointed_gradients`].
    pub checkpoint_activations: bool,
    /// Data-parallel replicas (devices, and machines); the default trains on the model's device alone.
    pub data_parallel: DataParallelSettings,
    /// Output directory: `metrics.jsonl`, `loss.png`, `best/`, `last/`.
    pub run_dir: PathBuf,
    /// Continue from `run_dir/last` instead of starting afresh.
    pub resume: bool,
    /// The run configuration, recorded in every checkpoint.
    pub config: serde_json::Value,
}

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `max_steps` reached.
    MaxSteps,
    /// The wall-time limit was reached.
    TimeLimit,
    /// Validation stopped improving for `patience` passes.
    EarlyStopping,
    /// The stop flag was raised (Ctrl-C).
    Interrupted,
}

/// What a finished (or stopped) run reports.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSummary {
    /// Optimiser steps completed, including those before a resume.
    pub steps: usize,
    /// Why the loop ended.
    pub stop_reason: StopReason,
    /// Training loss of every step run in this invocation, in order.
    pub losses: Vec<f64>,
    /// Best validation loss (nats per token), if a validation pass ran.
    pub best_val_loss: Option<f64>,
    /// Bits per byte of the best validation pass.
    pub best_val_bpb: Option<f64>,
    /// Mean training throughput of this invocation.
    pub tokens_per_sec: f64,
    /// Peak resident memory of the process at the end, in bytes (`None` where the system does not report it).
    pub peak_rss_bytes: Option<u64>,
}

/// One optimiser step, for progress display.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Steps completed.
    pub step: usize,
    /// The last step of the run.
    pub max_steps: usize,
    /// Mean loss of the step's micro-batches.
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Throughput of this invocation so far.
    pub tokens_per_sec: f64,
}

/// Receives progress; every method does nothing by default.
pub trait Observer {
    /// After every optimiser step.
    fn on_step(&mut self, _report: &StepReport) {}
    /// After every validation pass.
    fn on_eval(&mut self, _record: &MetricsRecord) {}
    /// A one-line notice (checkpoint written, resumed, plot failed).
    fn on_message(&mut self, _message: &str) {}
}

/// An observer that ignores everything.
impl Observer for () {}

/// Trains `model` on `data`, writing metrics, checkpoints and the loss plot under `settings.run_dir`.
///
/// With `settings.resume`, the model, optimizer, schedule step, data position and early-stopping state are
/// restored from `run_dir/last`, so the run continues exactly as if it had not stopped. Raising `stop` makes the
/// loop write a checkpoint and return after the current step.
pub fn train<AB, M>(
    model: M,
    data: &mut dyn TrainData,
    store: &dyn ModelStore<M>,
    settings: &TrainSettings,
    observer: &mut dyn Observer,
    stop: &AtomicBool,
) -> Result<TrainSummary, TrainError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB> + TrainableModel<AB> + Send + 'static,
    M::InnerModule: TrainableModel<AB::InnerBackend>,
{
    std::fs::create_dir_all(&settings.run_dir).map_err(|e| TrainError::io(&settings.run_dir, e))?;
    let device = model.devices().into_iter().next().unwrap_or_default();
    let mut optimizer = AdamW::<AB::InnerBackend>::new(settings.optimizer);
    let (model, state) = restore(model, data, store, &mut optimizer, settings, observer)?;
    let mut parallel = start_data_parallel::<AB, M>(settings, observer)?;
    let mut model = with_precision(model, settings.precision)?;
    let mut metrics = MetricsLog::open(&settings.run_dir.join("metrics.jsonl"), state.step)?;
    let mut run = RunProgress::new(state);
    let last_dir = settings.run_dir.join("last");
    // The machines of a multi-machine run must stop at the same step (a machine that stopped alone would leave the
    // others waiting in their next all-reduce), so there a Ctrl-C or time limit on any machine is a request, sent
    // with the step's all-reduce, that every machine acts on once the step is done.
    let mut agreed_stop = None;
    let stop_reason = loop {
        if run.state.step >= settings.max_steps {
            break StopReason::MaxSteps;
        }
        let requested = run.requested_stop(settings, stop);
        let across_machines = settings.data_parallel.nodes.is_some();
        if let Some(reason) = if across_machines {
            agreed_stop
        } else {
            requested
        } {
            break reason;
        }
        let lr = settings.schedule.lr(run.state.step);
        let parallel = parallel.as_mut().map(|p| (p, requested));
        let (loss, grad_norm, next, agreed) =
            train_step(model, data, &mut optimizer, settings, lr, &device, parallel)?;
        model = next;
        agreed_stop = agreed;
        run.record_step(loss, lr, grad_norm, settings, &mut metrics, observer)?;
        if run.state.step.is_multiple_of(settings.eval_interval)
            && evaluate_and_track(
                &model,
                data,
                store,
                &optimizer,
                &mut run,
                settings,
                &mut metrics,
                observer,
            )?
        {
            break StopReason::EarlyStopping;
        }
        if run.state.step.is_multiple_of(settings.checkpoint_interval) {
            save_checkpoint(&last_dir, &model, store, &optimizer, &run.state, data)?;
        }
    };
    if run.last_eval_step != Some(run.state.step)
        && run.state.step > 0
        && stop_reason != StopReason::Interrupted
    {
        evaluate_and_track(
            &model,
            data,
            store,
            &optimizer,
            &mut run,
            settings,
            &mut metrics,
            observer,
        )?;
    }
    run.state.elapsed_s = run.elapsed_s();
    save_checkpoint(&last_dir, &model, store, &optimizer, &run.state, data)?;
    observer.on_message(&format!(
        "checkpoint written to {} (step {})",
        last_dir.display(),
        run.state.step
    ));
    match plot::plot_run(&settings.run_dir) {
        Ok(path) => observer.on_message(&format!("loss curves drawn to {}", path.display())),
        Err(e) => observer.on_message(&format!("warning: {e}")),
    }
    Ok(run.summary(stop_reason))
}

/// A fresh [`TrainerState`], or with `settings.resume` the model, optimizer, state and data position of
/// `run_dir/last`.
fn restore<AB, M>(
    model: M,
    data: &mut dyn TrainData,
    store: &dyn ModelStore<M>,
    optimizer: &mut AdamW<AB::InnerBackend>,
    settings: &TrainSettings,
    observer: &mut dyn Observer,
) -> Result<(M, TrainerState), TrainError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
{
    let state = TrainerState {
        step: 0,
        tokens_seen: 0,
        best_val_loss: None,
        evals_since_best: 0,
        elapsed_s: 0.0,
        data: serde_json::Value::Null,
        config: settings.config.clone(),
    };
    if !settings.resume {
        return Ok((model, state));
    }
    let last_dir = settings.run_dir.join("last");
    let dir = resolve_checkpoint(&last_dir).ok_or_else(|| TrainError::External {
        context: format!("--resume: {}", last_dir.display()),
        source: "no checkpoint to resume from (trainer_state.json missing)".into(),
    })?;
    let state = TrainerState::load(&dir)?;
    let model = store
        .load(model, &dir)
        .map_err(|e| external(format!("loading the model from {}", dir.display()), e))?;
    let device = model.devices().into_iter().next().unwrap_or_default();
    let optimizer_file = dir.join(OPTIMIZER_FILE);
    optimizer.load(&optimizer_file, &device)?;
    optimizer.check_fits(&crate::params::parameters(&model), &optimizer_file)?;
    data.restore(&state.data)
        .map_err(|e| external("restoring the data position".into(), e))?;
    observer.on_message(&format!(
        "resumed from {} at step {}",
        dir.display(),
        state.step
    ));
    Ok((model, state))
}

/// The data-parallel replicas `settings` asks for (`None`: train on the model's device alone), announced.
fn start_data_parallel<AB, M>(
    settings: &TrainSettings,
    observer: &mut dyn Observer,
) -> Result<Option<DataParallel<AB, M>>, TrainError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB> + TrainableModel<AB> + Send + 'static,
{
    let nodes = settings.data_parallel.nodes.as_ref();
    if let Some(nodes) = nodes {
        observer.on_message(&format!(
            "machine {} of {}: registering with the orchestrator at {} (waits for every machine)",
            nodes.rank, nodes.count, nodes.orchestrator
        ));
    }
    let parallel = DataParallel::<AB, M>::start(&settings.data_parallel)?;
    if let Some(parallel) = &parallel {
        observer.on_message(&format!(
            "data-parallel: {} replicas on this machine{}",
            parallel.replicas(),
            nodes
                .map(|n| format!(", {} machines", n.count))
                .unwrap_or_default()
        ));
    }
    Ok(parallel)
}

/// The model computing in `precision`: with bf16, activations are bf16 while parameters, gradients and AdamW's
/// moments stay f32 (the master weights).
fn with_precision<AB, M>(model: M, precision: Precision) -> Result<M, TrainError>
where
    AB: AutodiffBackend,
    M: TrainableModel<AB>,
{
    if precision != Precision::Bf16 {
        return Ok(model);
    }
    model
        .with_compute_dtype(FloatDType::BF16)
        .map_err(|e| TrainError::Unsupported {
            key: "training.precision".into(),
            message: format!("bf16 mixed precision: {e}"),
        })
}

/// Runs `grad_accum_steps` micro-batches, clips, and applies one AdamW update. Returns the mean loss, the gradient
/// norm, the model and, data-parallel, the stop every replica agreed on (from `parallel`'s stop request).
fn train_step<AB, M>(
    model: M,
    data: &mut dyn TrainData,
    optimizer: &mut AdamW<AB::InnerBackend>,
    settings: &TrainSettings,
    lr: f64,
    device: &AB::Device,
    parallel: Option<(&mut DataParallel<AB, M>, Option<StopReason>)>,
) -> Result<(f64, f64, M, Option<StopReason>), TrainError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB> + TrainableModel<AB> + Send + 'static,
{
    let backprop = Backprop {
        block_size: settings.block_size,
        checkpoint_activations: settings.checkpoint_activations,
    };
    let rows = (0..settings.grad_accum_steps)
        .map(|_| {
            data.next_batch()
                .map_err(|e| external("reading a training batch".into(), e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some((parallel, requested)) = parallel {
        let step = parallel.gradients(&model, &rows, backprop, requested)?;
        let mut grads = step.gradients;
        let norm = grads.clip_global_norm(settings.grad_clip);
        let model = optimizer.step(lr, model, &grads);
        return Ok((step.loss, norm, model, step.stop));
    }
    let weights = target_weights(&rows, settings.block_size);
    let mut grads: Option<Gradients<AB::InnerBackend>> = None;
    let mut loss_sum = 0.0;
    for (rows, weight) in rows.iter().zip(weights) {
        // Each micro-batch's mean loss is weighed by its share of the step's targets, so the summed gradients
        // are those of the mean over every target of the step: the gradient of one batch N times larger.
        let (loss, micro) = micro_batch_gradients::<AB, M>(&model, rows, weight, backprop, device)
            .map_err(|e| external("forward pass".into(), e))?;
        loss_sum += loss;
        match grads.as_mut() {
            Some(total) => total.accumulate(micro),
            None => grads = Some(micro),
        }
    }
    let Some(mut grads) = grads else {
        return Ok((0.0, 0.0, model, None));
    };
    let norm = grads.clip_global_norm(settings.grad_clip);
    let model = optimizer.step(lr, model, &grads);
    Ok((loss_sum, norm, model, None))
}

/// Mean loss per target token over the fixed validation batches (which may differ in row count and, for chat
/// data, in how many of their positions are targets), on the inner (no-autodiff) model. Returns nats per token.
pub fn validation_loss<AB, M>(
    model: &M,
    data: &mut dyn TrainData,
    block_size: usize,
) -> Result<f64, TrainError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
    M::InnerModule: TrainableModel<AB::InnerBackend>,
{
    let inner = model.valid();
    let device = inner.devices().into_iter().next().unwrap_or_default();
    let batches = data
        .validation_batches()
        .map_err(|e| external("reading validation batches".into(), e))?;
    if batches.is_empty() {
        return Err(TrainError::External {
            context: "validation".into(),
            source: "the validation split yields no windows; lower model.block_size or raise data.val_fraction".into(),
        });
    }
    let (mut total, mut targets_seen) = (0.0, 0usize);
    for rows in &batches {
        // Each batch's loss is its mean over its targets, so it weighs by how many it has.
        let count = counted_targets(rows, block_size);
        let (inputs, targets) = inputs_and_targets::<AB::InnerBackend>(rows, block_size, &device);
        let loss = inner
            .loss(inputs, targets)
            .map_err(|e| external("validation forward pass".into(), e))?;
        total += loss.into_scalar().elem::<f64>() * count as f64;
        targets_seen += count;
    }
    Ok(total / targets_seen.max(1) as f64)
}

/// One validation pass: logs it, saves `best/` on improvement, and says whether patience has run out.
#[allow(clippy::too_many_arguments)]
fn evaluate_and_track<AB, M>(
    model: &M,
    data: &mut dyn TrainData,
    store: &dyn ModelStore<M>,
    optimizer: &AdamW<AB::InnerBackend>,
    run: &mut RunProgress,
    settings: &TrainSettings,
    metrics: &mut MetricsLog,
    observer: &mut dyn Observer,
) -> Result<bool, TrainError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
    M::InnerModule: TrainableModel<AB::InnerBackend>,
{
    run.last_eval_step = Some(run.state.step);
    let val_loss = validation_loss::<AB, M>(model, data, settings.block_size)?;
    // A NaN would compare as "no better" forever but, on the first pass, be saved as the best model.
    if !val_loss.is_finite() {
        return Err(TrainError::Diverged {
            step: run.state.step,
            loss: val_loss as f32,
        });
    }
    let val_bpb = val_loss / std::f64::consts::LN_2 / data.bytes_per_token();
    let record = MetricsRecord {
        step: run.state.step,
        val_loss: Some(val_loss),
        val_bpb: Some(val_bpb),
        val_ppl: Some(val_loss.exp()),
        ..Default::default()
    };
    metrics.append(&record)?;
    observer.on_eval(&record);
    if run.state.best_val_loss.is_none_or(|best| val_loss < best) {
        run.state.best_val_loss = Some(val_loss);
        run.state.evals_since_best = 0;
        run.best_val_bpb = Some(val_bpb);
        save_checkpoint(
            &settings.run_dir.join("best"),
            model,
            store,
            optimizer,
            &run.state,
            data,
        )?;
        Ok(false)
    } else {
        run.state.evals_since_best += 1;
        Ok(settings
            .patience
            .is_some_and(|p| run.state.evals_since_best >= p))
    }
}

fn save_checkpoint<M>(
    dir: &Path,
    model: &M,
    store: &dyn ModelStore<M>,
    optimizer: &AdamW<impl burn::tensor::backend::Backend>,
    state: &TrainerState,
    data: &dyn TrainData,
) -> Result<(), TrainError> {
    let mut state = state.clone();
    state.data = data.state();
    write_atomically(dir, |tmp| {
        store
            .save(model, tmp)
            .map_err(|e| external(format!("saving the model to {}", tmp.display()), e))?;
        optimizer.save(&tmp.join(OPTIMIZER_FILE))?;
        state.save(tmp)
    })
}

fn external(context: String, source: crate::model_io::BoxError) -> TrainError {
    TrainError::External { context, source }
}
