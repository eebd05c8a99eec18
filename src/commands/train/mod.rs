//! `ember train`: train a model from a YAML config.
//!
//! Prepares what the config needs (a byte-level BPE trained on the corpus, or the tokenizer of `model.from`, and
//! the tokenized shards, cached under `data.cache_dir`), builds a LLaMA-style model or loads `model.from` (every
//! weight trained, or LoRA adapters on the frozen weights with `training.lora`), and runs ember-training's loop
//! with a progress bar.
//!
//! The config is read in one place, `settings`, before a backend is chosen; the backend job gets resolved
//! settings and decides only what depends on the backend. One concept per module: the tokenizer, the data, the
//! model (and LoRA), the memory checks of the CPU backends, the replicas' devices and precision, the progress
//! bar.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use ember_inference::ModelAssets;
use ember_model::lora::LoraSettings;
use ember_model::{AttentionKernel, EmberBackend, ModelSpec};
use ember_tokenizer::Tokenizer;
use ember_training::{
    AdamWConfig, CosineSchedule, DataParallelSettings, DecayPolicy, TrainSettings, TrainSummary,
};

use crate::Context;
use crate::backend::BackendJob;
use crate::config::{Devices, RunConfig};
use crate::flags::MINUTES_RANGE;

mod data;
mod devices;
mod memory;
mod model;
mod progress;
mod tokenizer;

pub(crate) use devices::{replica_devices, training_precision};

use data::JobData;
use memory::ScratchNeed;
use model::ModelPlan;

/// Flags of `ember train`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// YAML run configuration (see configs/default.yaml for every key and its default).
    #[arg(long)]
    pub config: PathBuf,
    /// Output directory [default: runs/<name> from the config].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Stop after this many optimiser steps, an integer >= 1 [default: the config's training.max_steps]; the
    /// schedule is unchanged.
    #[arg(long, value_parser = crate::flags::positive)]
    pub max_steps: Option<usize>,
    /// Stop after this many minutes of wall time, in (0, 525600] (at most a year) [default: the config's
    /// training.time_limit_min, else none].
    #[arg(long, value_parser = crate::flags::minutes)]
    pub time_limit: Option<f64>,
    /// Continue the run in the output directory from its last/ checkpoint [default: start afresh].
    #[arg(long)]
    pub resume: bool,
}

/// Runs `ember train`.
pub fn run(args: Args, ctx: &Context) -> anyhow::Result<()> {
    let config = RunConfig::load(&args.config)
        .with_context(|| format!("loading {}", args.config.display()))?;
    let run_dir = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("runs").join(&config.name));
    if !args.resume && run_dir.join("last").exists() {
        bail!(
            "{} already holds a run; pass --resume to continue it or --out to train into another directory",
            run_dir.display()
        );
    }
    let base = config
        .model
        .from
        .as_deref()
        .map(model::open_base)
        .transpose()?;
    let (tokenizer, tokenizer_path) = tokenizer::resolve(&config, base.as_ref(), ctx)?;
    let (data, tokenizer) =
        JobData::prepare(&config, base.as_ref(), tokenizer, &tokenizer_path, ctx)?;
    let settings = settings(
        &config,
        &args,
        run_dir.clone(),
        base,
        tokenizer.vocab_size(),
        tokenizer_path,
    )?;
    let job = TrainJob {
        settings,
        tokenizer,
        data,
        quiet: ctx.quiet,
    };
    let summary = ctx.dispatch(config.backend, job)??;
    if !ctx.quiet {
        let best = match (summary.best_val_loss, summary.best_val_bpb) {
            (Some(loss), Some(bpb)) => format!("best val loss {loss:.4} ({bpb:.4} bits/byte)"),
            _ => "no validation pass".into(),
        };
        let peak = summary
            .peak_rss_bytes
            .map(|b| format!("; peak memory {:.0} MiB", b as f64 / (1 << 20) as f64))
            .unwrap_or_default();
        stderr!(
            "{:?} after {} steps; {best}; {:.0} tokens/s{peak}; model in {}",
            summary.stop_reason,
            summary.steps,
            summary.tokens_per_sec,
            run_dir.join("best").display()
        );
    }
    Ok(())
}

/// The config with paths made printable, recorded in every checkpoint.
fn config_summary(config: &RunConfig) -> serde_json::Value {
    serde_json::json!({
        "name": config.name,
        "seed": config.seed,
        "data": { "inputs": config.data.inputs, "val_fraction": config.data.val_fraction },
        "tokenizer": { "path": config.tokenizer.path, "vocab_size": config.tokenizer.vocab_size },
        "model": format!("{:?}", config.model),
        "training": format!("{:?}", config.training),
    })
}

/// Everything the backend job needs from the config and the flags. [`settings`] is the one place that reads
/// them, so what a run does is decided before a backend is chosen; only what depends on the backend (the
/// replicas' devices, whether bf16 is native, whether memory is this machine's) is left for the job.
struct JobSettings {
    /// The training loop's settings; its devices and precision are final only on the backend.
    train: TrainSettings,
    /// `training.devices`: the data-parallel replicas on this machine.
    devices: Devices,
    /// Where the weights come from.
    model: ModelPlan,
    /// `model.attention`.
    kernel: AttentionKernel,
    /// `seed`: a new model's weights or the adapters' initial values, and the order training windows are drawn
    /// in.
    seed: u64,
    /// `training.eval_batches`.
    eval_batches: usize,
}

/// Resolves `config` and the flags into the job's settings: `base` is the opened `model.from`, `vocab` and
/// `tokenizer_path` the run's tokenizer.
fn settings(
    config: &RunConfig,
    args: &Args,
    run_dir: PathBuf,
    base: Option<ModelAssets>,
    vocab: usize,
    tokenizer_path: PathBuf,
) -> anyhow::Result<JobSettings> {
    let t = &config.training;
    // Both sources are range-checked where they are parsed (`flags::minutes`, `RunConfig::validate`); the
    // conversion is still the fallible one, so a future caller that skips them gets an error, not a panic.
    let time_limit = match args.time_limit.or(t.time_limit_min) {
        Some(minutes) => Some(Duration::try_from_secs_f64(minutes * 60.0).map_err(|_| {
            anyhow::anyhow!(
                "--time-limit / training.time_limit_min: expected {MINUTES_RANGE}, found {minutes}"
            )
        })?),
        None => None,
    };
    let train = TrainSettings {
        batch_size: t.batch_size,
        block_size: config.model.block_size,
        grad_accum_steps: t.grad_accum_steps,
        max_steps: args.max_steps.unwrap_or(t.max_steps),
        time_limit,
        schedule: CosineSchedule {
            peak: t.learning_rate,
            floor: t.min_learning_rate,
            warmup_steps: t.warmup_steps,
            total_steps: t.max_steps,
        },
        optimizer: AdamWConfig {
            beta1: t.beta1,
            beta2: t.beta2,
            eps: t.eps,
            weight_decay: t.weight_decay,
            decay_policy: DecayPolicy::MatricesExceptEmbeddings,
        },
        grad_clip: t.grad_clip,
        log_interval: t.log_interval,
        eval_interval: t.eval_interval,
        checkpoint_interval: t.checkpoint_interval,
        patience: t.patience,
        precision: t.precision,
        checkpoint_activations: t.checkpoint_activations,
        run_dir,
        resume: args.resume,
        config: config_summary(config),
        // Device indices; the backend job turns them into its devices.
        data_parallel: DataParallelSettings {
            devices: Vec::new(),
            nodes: t.nodes.clone(),
        },
    };
    let model = match base {
        Some(base) => ModelPlan::Pretrained {
            base,
            lora: t.lora.clone(),
        },
        None => ModelPlan::Scratch {
            spec: config
                .model
                .spec(vocab)
                .map_err(|e| anyhow::anyhow!("{e}"))?,
            tokenizer_path,
            memory: ScratchNeed::new(&args.config, config, vocab),
        },
    };
    Ok(JobSettings {
        train,
        devices: t.devices.clone(),
        model,
        kernel: config.model.attention,
        seed: config.seed,
        eval_batches: t.eval_batches,
    })
}

/// The monomorphised part of `ember train`.
struct TrainJob {
    settings: JobSettings,
    tokenizer: Tokenizer,
    data: JobData,
    quiet: bool,
}

impl BackendJob for TrainJob {
    type Output = anyhow::Result<TrainSummary>;

    fn run<B: EmberBackend>(self, device: B::Device) -> anyhow::Result<TrainSummary> {
        let TrainJob {
            mut settings,
            tokenizer,
            data,
            quiet,
        } = self;
        let (device, devices) = devices::devices_of::<B>(
            &settings.devices,
            settings.train.batch_size,
            settings.train.data_parallel.nodes.is_some(),
            device,
        );
        let replicas = devices.len();
        settings.train.data_parallel.devices = devices;
        settings.train.precision = training_precision::<B>(settings.train.precision, quiet);
        let (model, store) = model::build::<B>(&settings, replicas, &device, quiet)?;
        let train = &settings.train;
        let mut data = data.into_train_data(
            &tokenizer,
            train.batch_size,
            train.block_size,
            settings.eval_batches,
            settings.seed,
        )?;
        if !quiet {
            stderr!(
                "model: {}, {} tokens per step, {:.2} bytes per token",
                describe(model.spec(), settings.model.lora())?,
                train.batch_size * train.block_size * train.grad_accum_steps,
                data.bytes_per_token()
            );
        }
        let stop = ember_training::interrupt_flag()?;
        let mut observer = progress::Bar::new(train.max_steps, quiet);
        let summary =
            ember_training::train(model, data.as_mut(), &store, train, &mut observer, &stop);
        observer.bar.finish_and_clear();
        Ok(summary?)
    }
}

/// The model in words: its size, the part of it LoRA adapters hold, and its shape.
fn describe(spec: &ModelSpec, lora: Option<&LoraSettings>) -> anyhow::Result<String> {
    let trainable = match lora {
        Some(settings) => format!(
            ", {:.3}M of them in LoRA adapters (rank {}) on {}",
            model::lora_parameters(spec, settings)? as f64 / 1e6,
            settings.rank,
            settings.targets.join(", ")
        ),
        None => String::new(),
    };
    Ok(format!(
        "{:.2}M parameters{trainable} ({} layers, hidden {})",
        spec.parameter_count() as f64 / 1e6,
        spec.num_layers,
        spec.hidden_size
    ))
}
