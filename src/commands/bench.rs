//! `ember bench`: latency, throughput and memory reports, suites, and comparisons of two reports.
//!
//! Every mode measures through ember-bench and prints its [`Report`] as a table or JSON; `--output` also writes
//! the JSON to a file so that later runs can be compared with `--compare OLD.json NEW.json`.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};
use burn::backend::Autodiff;
use ember_bench::suites::{kernels, tokenizer, train};
use ember_bench::{
    DeviceMemory, EMBER_VERSION, KernelSuite, Machine, ModelSettings, MonotonicClock, Pass,
    Repetitions, Report, ReportBody, SCHEMA_VERSION, TrainSettings, bench_model, compare,
    now_rfc3339, render_comparison, render_report, synthetic_prompt,
};
use ember_inference::{KvCacheKind, ModelAssets, WeightFormat};
use ember_model::{AttentionKernel, EmberBackend, Transformer};
use ember_training::{DataParallelSettings, HfModelStore, InMemoryData};

use crate::Context;
use crate::backend::{BackendJob, BackendKind, SystemProbe, run_on, select};
use crate::commands::model_args::LoadArgs;
use crate::commands::train::{replica_devices, training_precision};
use crate::config::RunConfig;

/// Which suite `--suite` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Suite {
    /// Each attention kernel, forward and forward+backward, across `--seq-lens`.
    Kernels,
    /// Tokenizer encode throughput of `--tokenizer` on `--corpus`.
    Tokenizer,
    /// Training step time and tokens/s of the model in `--config`.
    Train,
}

/// How reports are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A readable table.
    Table,
    /// The JSON report (the format `--compare` reads).
    Json,
}

/// Flags of `ember bench`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["model", "compare", "suite"])))]
pub struct Args {
    /// Model directory (Hugging Face layout) whose generation to measure.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Compare two JSON reports written by `--format json` or `--output`: the change of each figure and a verdict.
    #[arg(long, num_args = 2, value_names = ["OLD", "NEW"])]
    pub compare: Option<Vec<PathBuf>>,
    /// Run a suite instead of a model bench.
    #[arg(long, value_enum)]
    pub suite: Option<Suite>,
    /// How --model is loaded (--attention also applies to --suite train).
    #[command(flatten)]
    pub load: LoadArgs,
    /// KV cache of --model: contiguous, paged (16-position blocks) or paged-N [default: contiguous].
    #[arg(long, default_value = "contiguous")]
    pub kv_cache: KvCacheKind,
    /// Sequences per batch, 1..=1024 [default: 1 for --model, the config's training.batch_size for --suite
    /// train].
    #[arg(long, value_parser = crate::flags::batch)]
    pub batch: Option<usize>,
    /// Prompt tokens per sequence for --model (a fixed synthetic prompt spread over the vocabulary),
    /// 1..=1048576 [default: 128].
    #[arg(long, default_value_t = 128, value_parser = crate::flags::token_count)]
    pub prompt_len: usize,
    /// Tokens generated per sequence for --model, the first by the prefill, 2..=1048576 [default: 64].
    #[arg(long, default_value_t = 64, value_parser = crate::flags::two_or_more_tokens)]
    pub gen_len: usize,
    /// Measured runs (training steps for --suite train), 1..=10000 [default: 5].
    #[arg(long, default_value_t = 5, value_parser = crate::flags::runs)]
    pub runs: usize,
    /// Discarded warm-up runs before measuring (at least 1 for --suite train), 0..=10000 [default: 1].
    #[arg(long, default_value_t = 1, value_parser = crate::flags::warmup)]
    pub warmup: usize,
    /// Output format [default: table].
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also write the JSON report to this file [default: none].
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Relative change that --compare counts as noise, a fraction in [0, 1] [default: 0.05, i.e. 5%].
    #[arg(long, default_value_t = 0.05, value_parser = crate::flags::noise)]
    pub noise: f64,
    /// Sequence lengths of --suite kernels, comma-separated, each 1..=1048576 [default: 128,256,512,1024].
    #[arg(long, value_delimiter = ',', value_parser = crate::flags::token_count)]
    pub seq_lens: Vec<usize>,
    /// Kernels of --suite kernels, comma-separated [default: manual,fused,flash].
    #[arg(long, value_delimiter = ',')]
    pub kernels: Vec<String>,
    /// Tokenizer file for --suite tokenizer (tokenizer.json, tiktoken ranks, ...) [default: none, required].
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// UTF-8 text file that --suite tokenizer encodes [default: none, required].
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Run config whose model --suite train trains on synthetic tokens [default: configs/default.yaml].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Tokens per training sequence for --suite train, 1..=1048576 and at most the config's model.block_size
    /// [default: the config's model.block_size].
    #[arg(long, value_parser = crate::flags::token_count)]
    pub seq_len: Option<usize>,
}

/// Runs `ember bench`.
pub fn run(args: Args, ctx: &Context) -> anyhow::Result<()> {
    if let Some(paths) = &args.compare {
        return run_compare(&paths[0], &paths[1], args.noise);
    }
    let request = ctx.backend_or(None);
    let selection = select(request, &SystemProbe)?;
    if !ctx.quiet {
        stderr!("{}", selection.describe());
    }
    let (format, output) = (args.format, args.output.clone());
    let job = BenchJob {
        args,
        quiet: ctx.quiet,
        kind: selection.kind,
    };
    let body = run_on(selection.kind, job)?;
    let report = Report {
        schema_version: SCHEMA_VERSION,
        ember_version: EMBER_VERSION.to_string(),
        timestamp: now_rfc3339(),
        machine: Machine::detect(),
        backend: selection.kind.to_string(),
        threads: rayon::current_num_threads(),
        body,
    };
    emit(&report, format, output.as_deref())
}

/// Prints `report` in `format` and writes its JSON to `output` when given.
fn emit(report: &Report, format: Format, output: Option<&Path>) -> anyhow::Result<()> {
    let json = report.to_json().context("serialising the report")?;
    if let Some(path) = output {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    match format {
        Format::Json => super::println(&json)?,
        Format::Table => super::print(&render_report(report))?,
    }
    Ok(())
}

fn run_compare(old: &Path, new: &Path, noise: f64) -> anyhow::Result<()> {
    let old_report = Report::read(old)?;
    let new_report = Report::read(new)?;
    let comparison = compare(&old_report, &new_report, noise)?;
    super::print(&format!(
        "comparing {} (old) with {} (new)\n{}",
        old.display(),
        new.display(),
        render_comparison(&comparison)
    ))?;
    Ok(())
}

/// Largest attention score matrix the kernel suite builds, in bytes: the manual kernel (and autodiff's saved
/// activations for the others) holds `[batch, heads, seq, seq]` f32 scores, which grow with the square of the
/// sequence length; 8 GiB is what a 16 GB device or machine can hold next to the inputs and gradients.
const MAX_SCORE_BYTES: u128 = 8 << 30;

/// Refuses `--seq-lens` / `--batch` whose score matrix would pass [`MAX_SCORE_BYTES`], saying how much it would
/// take, before anything is allocated.
fn check_score_memory(batch: usize, heads: usize, seq_lens: &[usize]) -> anyhow::Result<()> {
    for &seq in seq_lens {
        // u128: batch, heads and seq are each below 2^21, so the product cannot overflow.
        let bytes = batch as u128 * heads as u128 * seq as u128 * seq as u128 * 4;
        if bytes > MAX_SCORE_BYTES {
            bail!(
                "--seq-lens {seq} with --batch {batch}: the [batch, {heads} heads, seq, seq] f32 attention scores \
                 would take {:.1} GiB, above the suite's limit of {} GiB; lower --seq-lens or --batch",
                bytes as f64 / (1u64 << 30) as f64,
                MAX_SCORE_BYTES >> 30
            );
        }
    }
    Ok(())
}

/// The monomorphised part of `ember bench`.
struct BenchJob {
    args: Args,
    quiet: bool,
    kind: BackendKind,
}

/// What the device allocator of `kind` holds (wgpu and CUDA keep tensors in device memory pools); `None` for
/// backends whose memory is the process's resident set.
fn device_memory(kind: BackendKind) -> Option<DeviceMemory> {
    match kind {
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => {
            ember_bench::cube_memory::<burn::cubecl::wgpu::WgpuRuntime>(&Default::default())
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            ember_bench::cube_memory::<burn::cubecl::cuda::CudaRuntime>(&Default::default())
        }
        _ => None,
    }
}

impl BackendJob for BenchJob {
    type Output = anyhow::Result<ReportBody>;

    fn run<B: EmberBackend>(self, device: B::Device) -> Self::Output {
        let args = &self.args;
        if args.model.is_some() {
            return self.model_bench::<B>(&device);
        }
        match args.suite {
            Some(Suite::Kernels) => self.kernel_suite::<B>(&device),
            Some(Suite::Tokenizer) => self.tokenizer_suite(),
            Some(Suite::Train) => self.train_suite::<B>(&device),
            None => bail!("nothing to do: pass --model, --suite or --compare"),
        }
    }
}

impl BenchJob {
    fn model_bench<B: EmberBackend>(&self, device: &B::Device) -> anyhow::Result<ReportBody> {
        let args = &self.args;
        let path = args
            .model
            .as_deref()
            .ok_or_else(|| anyhow!("--model is required"))?;
        let precision = args.load.quantize.weight_format()?;
        let kernel = args.load.attention;
        let assets =
            ModelAssets::open(path).with_context(|| format!("opening {}", path.display()))?;
        let model = assets
            .load_as::<B>(device, None, &precision)
            .with_context(|| format!("loading {}", path.display()))?;
        let settings = ModelSettings {
            batch: args.batch.unwrap_or(1),
            prompt_len: args.prompt_len,
            gen_len: args.gen_len,
            runs: args.runs,
            warmup: args.warmup,
            attention: kernel.name().to_string(),
            quantize: args.load.quantize.quantize.clone(),
            kv_cache: args.kv_cache.to_string(),
        };
        let name = path.display().to_string();
        let clock = MonotonicClock::new();
        let kind = self.kind;
        let dtype = if assets.stores_quantized() && precision == WeightFormat::F32 {
            "stored".to_string()
        } else {
            precision.label()
        };
        let bench = bench_model(
            model.with_kernel(kernel),
            device.clone(),
            name,
            dtype,
            settings,
            &clock,
            &move || device_memory(kind),
        )?;
        Ok(ReportBody::Model(bench))
    }

    fn kernel_suite<B: EmberBackend>(&self, device: &B::Device) -> anyhow::Result<ReportBody> {
        let args = &self.args;
        let mut settings = kernels::default_settings();
        if !args.seq_lens.is_empty() {
            settings.seq_lens = args.seq_lens.clone();
        }
        settings.batch = args.batch.unwrap_or(settings.batch);
        check_score_memory(settings.batch, settings.heads, &settings.seq_lens)?;
        settings.runs = args.runs;
        settings.warmup = args.warmup;
        let kernel_list = if args.kernels.is_empty() {
            AttentionKernel::ALL.to_vec()
        } else {
            args.kernels
                .iter()
                .map(|k| k.parse::<AttentionKernel>())
                .collect::<Result<Vec<_>, _>>()?
        };
        let quiet = self.quiet;
        let results = kernels::run_kernel_suite::<B>(
            &settings,
            &kernel_list,
            &[Pass::Forward, Pass::ForwardBackward],
            device,
            &MonotonicClock::new(),
            |r| {
                if !quiet {
                    stderr!(
                        "  {:>6} {:<16} seq {:>5}: {:9.3} ms",
                        r.kernel,
                        r.pass.name(),
                        r.seq_len,
                        r.time_ms
                    );
                }
            },
        )?;
        Ok(ReportBody::Kernels(KernelSuite { settings, results }))
    }

    fn tokenizer_suite(&self) -> anyhow::Result<ReportBody> {
        let args = &self.args;
        let tokenizer_path = args
            .tokenizer
            .as_deref()
            .ok_or_else(|| anyhow!("--suite tokenizer needs --tokenizer FILE"))?;
        let corpus = args
            .corpus
            .as_deref()
            .ok_or_else(|| anyhow!("--suite tokenizer needs --corpus FILE"))?;
        let reps = Repetitions {
            warmup: args.warmup,
            runs: args.runs,
        };
        let suite =
            tokenizer::run_tokenizer_suite(tokenizer_path, corpus, reps, &MonotonicClock::new())?;
        Ok(ReportBody::Tokenizer(suite))
    }

    fn train_suite<B: EmberBackend>(&self, device: &B::Device) -> anyhow::Result<ReportBody> {
        let args = &self.args;
        let config_path = args
            .config
            .clone()
            .unwrap_or_else(|| PathBuf::from("configs/default.yaml"));
        let config = RunConfig::load(&config_path)
            .with_context(|| format!("loading {}", config_path.display()))?;
        let m = &config.model;
        let vocab = config.tokenizer.vocab_size;
        let spec = m
            .spec(vocab)
            .map_err(|e| anyhow::anyhow!("{}: {e}", config_path.display()))?;
        let kernel = args.load.attention;
        let settings = TrainSettings {
            config: config_path.display().to_string(),
            batch: args.batch.unwrap_or(config.training.batch_size),
            seq_len: args.seq_len.unwrap_or(m.block_size),
            steps: args.runs,
            warmup: args.warmup,
            replicas: 1,
            precision: training_precision::<B>(config.training.precision, self.quiet),
        };
        if settings.seq_len > m.block_size {
            bail!(
                "--seq-len {} exceeds the config's model.block_size {}",
                settings.seq_len,
                m.block_size
            );
        }
        let (device, devices) = replica_devices::<B>(&config.training, device.clone());
        let device = &device;
        let model = Transformer::<Autodiff<B>>::init(&spec, config.seed, device)
            .context("building the model")?
            .with_kernel(kernel);
        // Synthetic tokens: step time does not depend on what the ids are, only on their count.
        let window = settings.seq_len + 1;
        let tokens = synthetic_prompt(window * settings.batch * 4, vocab);
        let mut data = InMemoryData::new(
            tokens.clone(),
            tokens,
            settings.batch,
            settings.seq_len,
            1,
            1.0,
            config.seed,
        )
        .map_err(|e| anyhow!("building the synthetic training data: {e}"))?;
        let run_dir =
            std::env::temp_dir().join(format!("ember-bench-train-{}", std::process::id()));
        let outcome = train::run_train_suite::<Autodiff<B>, _>(
            model,
            spec.parameter_count(),
            &mut data,
            &HfModelStore::default(),
            settings,
            DataParallelSettings {
                devices,
                nodes: None,
            },
            &run_dir,
            &MonotonicClock::new(),
        );
        // The loop's closing checkpoint is a by-product of using the real trainer; it is not kept.
        let _ = std::fs::remove_dir_all(&run_dir);
        Ok(ReportBody::Train(outcome?))
    }
}
