//! `ember train`: train a model from a YAML config.
//!
//! Prepares what the config needs (a byte-level BPE trained on the corpus, or the tokenizer of `model.from`, and
//! the tokenized shards, cached under `data.cache_dir`), builds a LLaMA-style model or loads `model.from` (every
//! weight trained, or LoRA adapters on the frozen weights with `training.lora`), and runs ember-training's loop
//! with a progress bar.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use burn::backend::Autodiff;
use burn::tensor::backend::{Device as _, DeviceId};
use ember_dataset::{DocumentEncoder, PrepareOptions, Split, TokenDataset, stable_hash};
use ember_inference::{ModelAssets, WeightFormat};
use ember_model::{EmberBackend, Transformer};
use ember_tokenizer::{NoProgress, Tokenizer};
use ember_training::{
    AdamWConfig, ChatData, CosineSchedule, DataParallelSettings, DecayPolicy, HfModelStore,
    MetricsRecord, NodeSettings, Observer, ShardData, StepReport, TrainData, TrainSettings,
    TrainSummary,
};
use indicatif::ProgressBar;

use crate::Context;
use crate::backend::{BackendJob, computes_bf16, is_cpu};
use crate::config::{DataFormat, Precision, RunConfig, TrainingConfig, limits};
use crate::flags::MINUTES_RANGE;

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
    let base = config.model.from.as_deref().map(open_base).transpose()?;
    let (tokenizer, tokenizer_path) = match &base {
        Some(base) => base_tokenizer(base, &config)?,
        None => {
            let path = ensure_tokenizer(&config, ctx)?;
            let tokenizer = super::tokenize::open_tokenizer(&path)
                .with_context(|| format!("loading tokenizer {}", path.display()))?;
            (tokenizer, path)
        }
    };
    let data = match (config.data.format, &base) {
        (DataFormat::Chat, Some(base)) => {
            let prepared = super::chat_data::prepared_rows(
                &config.data.inputs,
                &base.path,
                tokenizer.vocab_size(),
                config.model.block_size,
            )?;
            let (train, val) = match prepared {
                Some(rows) => rows,
                None => {
                    let template =
                        super::chat_data::base_template(base.chat_template.as_ref(), &base.path)?;
                    super::chat_data::chat_rows(
                        &text_files(&config.data.inputs)?,
                        template,
                        &tokenizer,
                        config.model.block_size,
                        config.data.val_fraction,
                    )?
                }
            };
            JobData::Chat { train, val }
        }
        // `RunConfig::validate` refuses chat data without model.from.
        (DataFormat::Chat, None) => bail!("data.format chat needs model.from"),
        (DataFormat::Text, _) => {
            JobData::Shards(ensure_dataset(&config, &tokenizer, &tokenizer_path, ctx)?)
        }
    };
    let config_json = serde_json::to_value(config_summary(&config))?;
    let settings = settings(&config, &args, run_dir.clone(), config_json)?;
    let job = TrainJob {
        config_path: args.config.clone(),
        base,
        config,
        settings,
        tokenizer,
        tokenizer_path,
        data,
        quiet: ctx.quiet,
    };
    let backend = job.config.backend;
    let summary = ctx.dispatch(backend, job)??;
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

fn settings(
    config: &RunConfig,
    args: &Args,
    run_dir: PathBuf,
    config_json: serde_json::Value,
) -> anyhow::Result<TrainSettings> {
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
    Ok(TrainSettings {
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
        config: config_json,
        // Device indices; the backend job turns them into its devices.
        data_parallel: DataParallelSettings {
            devices: Vec::new(),
            nodes: t.nodes.as_ref().map(|n| NodeSettings {
                count: n.count,
                orchestrator: n.orchestrator.clone(),
                address: n.address.clone(),
                data_port: n.data_port,
                rank: n.rank,
            }),
        },
    })
}

/// The tokenizer the config names, or one trained on the corpus and cached under `data.cache_dir`, keyed by the
/// input files (names and sizes), the vocabulary size and the special tokens.
fn ensure_tokenizer(config: &RunConfig, ctx: &Context) -> anyhow::Result<PathBuf> {
    if let Some(path) = &config.tokenizer.path {
        return Ok(path.clone());
    }
    let files = text_files(&config.data.inputs)?;
    let mut key = format!(
        "{}|{:?}",
        config.tokenizer.vocab_size, config.tokenizer.special_tokens
    );
    for file in &files {
        let size = std::fs::metadata(file)
            .with_context(|| format!("reading {}", file.display()))?
            .len();
        key.push_str(&format!("|{}:{size}", file.display()));
    }
    let dir = config
        .data
        .cache_dir
        .join(format!("tokenizer-{:016x}", stable_hash(key.as_bytes())));
    let path = dir.join("tokenizer.json");
    if path.is_file() {
        if !ctx.quiet {
            stderr!("reusing tokenizer {}", path.display());
        }
        return Ok(path);
    }
    if !ctx.quiet {
        stderr!(
            "training a {}-token BPE tokenizer on {} file(s)",
            config.tokenizer.vocab_size,
            files.len()
        );
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    ember_tokenizer::train_tokenizer_files(
        &files,
        config.tokenizer.vocab_size,
        &config.tokenizer.special_tokens,
        &dir,
        &mut NoProgress,
    )
    .with_context(|| format!("training the tokenizer into {}", dir.display()))?;
    Ok(path)
}

/// Every regular file of `inputs`, directories walked in sorted order.
fn text_files(inputs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for input in inputs {
        if input.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(input)
                .with_context(|| format!("listing {}", input.display()))?
                .map(|e| e.map(|e| e.path()))
                .collect::<Result<_, _>>()
                .with_context(|| format!("listing {}", input.display()))?;
            entries.sort();
            files.extend(text_files(&entries)?);
        } else if input.is_file() {
            files.push(input.clone());
        } else {
            bail!("data.inputs: {} does not exist", input.display());
        }
    }
    if files.is_empty() {
        bail!("data.inputs: no input files");
    }
    Ok(files)
}

/// Encodes documents with the run's tokenizer for ember-dataset.
struct Encoder<'a> {
    tokenizer: &'a Tokenizer,
    fingerprint: String,
}

impl DocumentEncoder for Encoder<'_> {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode_ordinary(text)
            .map_err(|e| e.to_string())
    }

    fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }

    fn eos_id(&self) -> Option<u32> {
        self.tokenizer.eos_id()
    }

    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }
}

/// Opens `model.from` (spec, tokenizer and chat template; the weights are read on the backend).
fn open_base(from: &Path) -> anyhow::Result<ModelAssets> {
    if !from.exists() {
        bail!("model.from: {} does not exist", from.display());
    }
    ModelAssets::open(from).with_context(|| {
        format!(
            "model.from: {} is not a model ember loads (a Hugging Face directory with config.json, a GGUF file, \
             or an ember run's best/)",
            from.display()
        )
    })
}

/// The tokenizer of `model.from`, and the path that identifies it for the prepared-data cache; `model.block_size`
/// must fit the model's context.
fn base_tokenizer(base: &ModelAssets, config: &RunConfig) -> anyhow::Result<(Tokenizer, PathBuf)> {
    let Some(tokenizer) = base.tokenizer.clone() else {
        bail!(
            "model.from: {} has no tokenizer (a model directory needs tokenizer.json)",
            base.path.display()
        );
    };
    let context = base.spec.context_length;
    if config.model.block_size > context {
        bail!(
            "model.block_size: expected at most the context length of {} ({context}), found {}",
            base.path.display(),
            config.model.block_size
        );
    }
    Ok((tokenizer, base.path.clone()))
}

/// The files of `model.from` each checkpoint copies so that it loads on its own with its tokenizer and chat
/// template (a model directory's tokenizer files; a GGUF file has none, which is said once).
fn base_files(base: &ModelAssets, quiet: bool) -> Vec<PathBuf> {
    if !base.path.is_dir() {
        if !quiet {
            stderr!(
                "note: checkpoints will hold no tokenizer: {} keeps its vocabulary in GGUF metadata; run a \
                 LoRA checkpoint as `--model {} --adapter <checkpoint>/adapter`",
                base.path.display(),
                base.path.display()
            );
        }
        return Vec::new();
    }
    [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ]
    .iter()
    .map(|name| base.path.join(name))
    .filter(|p| p.is_file())
    .collect()
}

/// The `tokenizer.json` to copy into every checkpoint: the file itself, or a model directory's. A tokenizer of
/// another format (a GGUF vocabulary, tiktoken ranks) is not copied (a checkpoint's tokenizer must be
/// `tokenizer.json`), which is said once.
fn checkpoint_tokenizer(path: &Path, quiet: bool) -> Option<PathBuf> {
    let json = if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    };
    if json.is_file() && json.extension().is_some_and(|e| e == "json") {
        return Some(json);
    }
    if !quiet {
        stderr!(
            "note: checkpoints will hold no tokenizer: {} is not a tokenizer.json",
            path.display()
        );
    }
    None
}

/// The prepared corpus directory for this tokenizer, preparing it when missing or stale.
fn ensure_dataset(
    config: &RunConfig,
    tokenizer: &Tokenizer,
    tokenizer_path: &Path,
    ctx: &Context,
) -> anyhow::Result<PathBuf> {
    let fingerprint = ember_dataset::fingerprint_path(tokenizer_path)?;
    let dir = config.data.cache_dir.join(format!("data-{fingerprint}"));
    if TokenDataset::open_for_tokenizer(&dir, Split::Train, &fingerprint).is_ok() {
        if !ctx.quiet {
            stderr!("reusing prepared data {}", dir.display());
        }
        return Ok(dir);
    }
    if !ctx.quiet {
        stderr!("tokenizing the corpus into {}", dir.display());
    }
    let encoder = Encoder {
        tokenizer,
        fingerprint,
    };
    let mut options = PrepareOptions::new(config.data.inputs.clone(), dir.clone());
    options.val_fraction = config.data.val_fraction;
    options.text_field = config.data.text_field.clone();
    let report = ember_dataset::prepare(&encoder, &options, &|_| {})
        .with_context(|| format!("preparing the corpus into {}", dir.display()))?;
    if !ctx.quiet {
        for warning in report.warnings {
            stderr!("warning: {warning}");
        }
    }
    Ok(dir)
}

/// The model's device and the data-parallel replicas' devices (empty for one replica) from `training.devices`:
/// index `i` is device `i` of the kind the backend selected (CUDA ordinal, wgpu adapter); the CPU backends have
/// one device, which every replica shares (the replicas are threads; `auto` gives one per `--threads`).
pub(crate) fn replica_devices<B: EmberBackend>(
    training: &TrainingConfig,
    selected: B::Device,
) -> (B::Device, Vec<DeviceId>) {
    let cpu_threads = is_cpu::<B>().then(rayon::current_num_threads);
    let indices = training.devices.indices(training.batch_size, cpu_threads);
    if indices.len() <= 1 && training.nodes.is_none() {
        return (selected, Vec::new());
    }
    let kind = selected.to_id().type_id;
    let ids: Vec<DeviceId> = indices
        .iter()
        .map(|&index_id| DeviceId {
            type_id: kind,
            index_id,
        })
        .collect();
    (B::Device::from_id(ids[0]), ids)
}

/// The precision a training run computes in on `B`: the config's `training.precision`, except that bf16 falls
/// back to f32 (with a note unless `quiet`) on backends that would only emulate it.
pub(crate) fn training_precision<B: EmberBackend>(configured: Precision, quiet: bool) -> Precision {
    if configured == Precision::Bf16 && !computes_bf16::<B>() {
        if !quiet {
            stderr!(
                "note: training.precision is bf16, which only the cuda backend computes natively; training in f32"
            );
        }
        return Precision::F32;
    }
    configured
}

/// On the CPU backends the model, its optimiser state and its activations live in this machine's memory: a
/// configuration that would need more than all of it is refused before the first tensor is allocated (where it
/// would abort, or be killed by the OOM killer minutes later). `replicas` is 0 or 1 for one replica. The config
/// itself was already bounded by [`limits::MAX_TRAINING_BYTES`]; GPU backends report their own out-of-memory.
fn check_host_memory(
    path: &Path,
    config: &RunConfig,
    vocab: usize,
    replicas: usize,
) -> anyhow::Result<()> {
    let estimate = limits::estimate(config, vocab, replicas);
    let Some(memory) = ember_bench::Machine::detect().memory_bytes else {
        return Ok(());
    };
    if estimate.total() > u128::from(memory) {
        bail!(
            "{}: keys `model.*` and `training.batch_size`: training this would need {}, but this machine has {} \
             of memory; shrink the model or the batch",
            path.display(),
            estimate.describe(),
            limits::gib(u128::from(memory))
        );
    }
    Ok(())
}

/// On the CPU backends, [`check_host_memory`] for a model loaded with `model.from`, of which `trainable`
/// parameters train.
fn check_host_memory_loaded(
    config: &RunConfig,
    spec: &ember_model::ModelSpec,
    replicas: usize,
    trainable: u128,
) -> anyhow::Result<()> {
    let estimate = limits::estimate_loaded(
        spec,
        config.training.batch_size,
        config.model.block_size,
        config.model.attention,
        replicas,
        trainable,
    );
    let Some(memory) = ember_bench::Machine::detect().memory_bytes else {
        return Ok(());
    };
    if estimate.total() > u128::from(memory) {
        bail!(
            "model.from and training.batch_size: fine-tuning {} would need {}, but this machine has {} of memory; \
             shrink the batch or model.block_size, or train LoRA adapters (training.lora)",
            config
                .model
                .from
                .as_deref()
                .unwrap_or(Path::new("?"))
                .display(),
            estimate.describe(),
            limits::gib(u128::from(memory))
        );
    }
    Ok(())
}

/// The monomorphised part of `ember train`.
struct TrainJob {
    config_path: PathBuf,
    /// `model.from`, opened.
    base: Option<ModelAssets>,
    config: RunConfig,
    settings: TrainSettings,
    tokenizer: Tokenizer,
    tokenizer_path: PathBuf,
    data: JobData,
    quiet: bool,
}

/// The prepared training data: shards of a text corpus, or chat rows (small enough to hold in memory: a row
/// per conversation).
enum JobData {
    Shards(PathBuf),
    Chat {
        train: Vec<Vec<u32>>,
        val: Vec<Vec<u32>>,
    },
}

impl BackendJob for TrainJob {
    type Output = anyhow::Result<TrainSummary>;

    fn run<B: EmberBackend>(mut self, device: B::Device) -> anyhow::Result<TrainSummary> {
        let (device, devices) = replica_devices::<B>(&self.config.training, device);
        let replicas = devices.len();
        self.settings.data_parallel.devices = devices;
        self.settings.precision =
            training_precision::<B>(self.config.training.precision, self.quiet);
        let kernel = self.config.model.attention;
        let lora = self.config.training.lora.as_ref().map(|l| l.settings());
        let (model, store) = match &self.base {
            Some(base) => {
                if is_cpu::<B>() {
                    let trainable = match &lora {
                        Some(settings) => lora_parameters(&base.spec, settings)?,
                        None => u128::from(base.spec.parameter_count()),
                    };
                    check_host_memory_loaded(&self.config, &base.spec, replicas, trainable)?;
                }
                let model = super::model_args::load_with_progress::<Autodiff<B>>(
                    base,
                    &device,
                    &WeightFormat::F32,
                    self.quiet,
                )?;
                let mut store = HfModelStore::with_files(base_files(base, self.quiet));
                let model = match &lora {
                    Some(settings) => {
                        store = store
                            .with_lora(settings.clone(), Some(base.path.display().to_string()));
                        model
                            .with_lora(settings, self.config.seed)
                            .map_err(|e| anyhow::anyhow!("training.lora: {e}"))?
                    }
                    None => model,
                };
                (model.with_kernel(kernel), store)
            }
            None => {
                if is_cpu::<B>() {
                    check_host_memory(
                        &self.config_path,
                        &self.config,
                        self.tokenizer.vocab_size(),
                        replicas,
                    )?;
                }
                let spec = self
                    .config
                    .model
                    .spec(self.tokenizer.vocab_size())
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                let model = Transformer::<Autodiff<B>>::init(&spec, self.config.seed, &device)
                    .context("building the model")?
                    .with_kernel(kernel);
                let store = HfModelStore::with_tokenizer(checkpoint_tokenizer(
                    &self.tokenizer_path,
                    self.quiet,
                ));
                (model, store)
            }
        };
        let spec = model.spec().clone();
        let tokenizer = &self.tokenizer;
        let bytes_of = |ids: &[u32]| tokenizer.decode_bytes(ids).map_or(0, |b| b.len());
        let (batch_size, block_size) = (self.settings.batch_size, self.settings.block_size);
        let eval_batches = self.config.training.eval_batches;
        let mut data: Box<dyn TrainData> = match self.data {
            JobData::Shards(dir) => {
                let train_set = Arc::new(TokenDataset::open(&dir, Split::Train)?);
                let val_set = Arc::new(TokenDataset::open(&dir, Split::Val)?);
                // The same seed on every machine of a multi-machine run: each draws the same global batches
                // and trains on its rank's share of them.
                let data = ShardData::new(
                    train_set,
                    val_set,
                    batch_size,
                    block_size,
                    eval_batches,
                    self.config.seed,
                )
                .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
                Box::new(data.bytes_per_token_of(bytes_of))
            }
            JobData::Chat { train, val } => {
                let data = ChatData::new(
                    train,
                    val,
                    batch_size,
                    block_size,
                    eval_batches,
                    self.config.seed,
                )
                .map_err(|e| anyhow::anyhow!("data.inputs: {e}"))?;
                Box::new(data.bytes_per_token_of(bytes_of))
            }
        };
        if !self.quiet {
            let trainable = match &lora {
                Some(settings) => format!(
                    ", {:.3}M of them in LoRA adapters (rank {}) on {}",
                    lora_parameters(&spec, settings)? as f64 / 1e6,
                    settings.rank,
                    settings.targets.join(", ")
                ),
                None => String::new(),
            };
            stderr!(
                "model: {:.2}M parameters{trainable} ({} layers, hidden {}), {} tokens per step, {:.2} bytes per token",
                spec.parameter_count() as f64 / 1e6,
                spec.num_layers,
                spec.hidden_size,
                self.settings.batch_size
                    * self.settings.block_size
                    * self.settings.grad_accum_steps,
                data.bytes_per_token()
            );
        }
        let stop = ember_training::interrupt_flag()?;
        let mut observer = Bar::new(self.settings.max_steps, self.quiet);
        let summary = ember_training::train(
            model,
            data.as_mut(),
            &store,
            &self.settings,
            &mut observer,
            &stop,
        );
        observer.bar.finish_and_clear();
        Ok(summary?)
    }
}

/// Parameters of the LoRA adapters `settings` put on a model of `spec`: `rank × (in + out)` per adapted module.
fn lora_parameters(
    spec: &ember_model::ModelSpec,
    settings: &ember_model::lora::LoraSettings,
) -> anyhow::Result<u128> {
    let modules = ember_model::lora::select_modules(spec, &settings.targets)
        .map_err(|e| anyhow::anyhow!("training.lora.targets: {e}"))?;
    Ok(modules
        .iter()
        .map(|m| (settings.rank * (m.inputs + m.outputs)) as u128)
        .sum())
}

/// The indicatif progress bar: step, loss, lr, tokens/s and ETA; validation and notices printed above it.
struct Bar {
    bar: ProgressBar,
    quiet: bool,
}

impl Bar {
    fn new(max_steps: usize, quiet: bool) -> Self {
        let bar = super::progress_bar(
            quiet,
            Some(max_steps as u64),
            "{bar:30} step {pos}/{len} {msg} ETA {eta}",
        );
        Bar { bar, quiet }
    }
}

impl Observer for Bar {
    fn on_step(&mut self, r: &StepReport) {
        self.bar.set_position(r.step as u64);
        self.bar.set_message(format!(
            "loss {:.4} lr {:.2e} {:.0} tok/s",
            r.loss, r.lr, r.tokens_per_sec
        ));
    }

    fn on_eval(&mut self, r: &MetricsRecord) {
        if !self.quiet {
            self.bar.println(format!(
                "step {}: val loss {:.4}, {:.4} bits/byte, perplexity {:.2}",
                r.step,
                r.val_loss.unwrap_or(f64::NAN),
                r.val_bpb.unwrap_or(f64::NAN),
                r.val_ppl.unwrap_or(f64::NAN)
            ));
        }
    }

    fn on_message(&mut self, message: &str) {
        if !self.quiet {
            self.bar.println(message);
        }
    }
}
