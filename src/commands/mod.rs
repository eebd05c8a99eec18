//! One module per subcommand. Each defines its `Args` (clap) and a `run` function; this module only routes.

use clap::Subcommand;

use crate::Context;

pub mod bench;
pub mod chat_data;
pub mod eval;
pub mod export;
pub mod generate;
pub mod info;
pub mod logits;
pub mod model_args;
pub mod orchestrator;
pub mod plot;
pub mod prepare;
pub mod quantize;
pub mod serve;
pub mod tokenize;
pub mod train;
pub mod train_tokenizer;

/// Writing to stdout failed. Every command writes its stdout through this type (see [`print`]), so that `main`
/// can tell a reader that went away (`ember info --json | head`, EPIPE) from a real failure: the former ends the
/// command quietly, like any Unix filter, instead of panicking as `println!` does.
#[derive(Debug, thiserror::Error)]
#[error("writing to stdout: {0}")]
pub struct StdoutError(#[source] pub std::io::Error);

impl StdoutError {
    /// Whether the reader closed the pipe.
    pub fn is_closed_pipe(&self) -> bool {
        self.0.kind() == std::io::ErrorKind::BrokenPipe
    }
}

/// Writes `text` to stdout and flushes it; errors are [`StdoutError`]s.
pub fn print(text: &str) -> Result<(), StdoutError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(StdoutError)
}

/// Writes `text` and a newline to stdout, as [`print`] does.
pub fn println(text: &str) -> Result<(), StdoutError> {
    print(&format!("{text}\n"))
}

/// A progress bar on stderr drawn with `template` (indicatif's syntax), of `len` steps (`None`: unknown until
/// set), or a hidden one under `--quiet`.
pub fn progress_bar(quiet: bool, len: Option<u64>, template: &str) -> indicatif::ProgressBar {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// The subcommands of `ember`.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a model from a YAML config (tokenizer, dataset and model are prepared as needed).
    Train(train::Args),
    /// Generate text from a model directory, checkpoint or GGUF file.
    Generate(generate::Args),
    /// Measure latency, throughput and memory, or compare two reports.
    Bench(bench::Args),
    /// Encode stdin to token ids, or decode ids back to text.
    Tokenize(tokenize::Args),
    /// Learn a byte-level BPE tokenizer from text files and write a Hugging Face tokenizer.json.
    TrainTokenizer(train_tokenizer::Args),
    /// Tokenize documents into memory-mapped shards with a train/validation split.
    Prepare(prepare::Args),
    /// Perplexity and bits per byte of a model on held-out text (f32 or quantized).
    Eval(eval::Args),
    /// Write a model directory with its weights quantized (int8 / int4), or a GGUF file in one of llama.cpp's
    /// types (q4_k_m, q8_0, ...), loadable by every command and by llama.cpp.
    Quantize(quantize::Args),
    /// Write a model as a GGUF file (f32, f16 or bf16 weights) that llama.cpp runs.
    Export(export::Args),
    /// Run a forward pass and write the logits to a safetensors file.
    Logits(logits::Args),
    /// Print a model's spec, parameter count and memory by dtype.
    Info(info::Args),
    /// Draw the loss curves of a training run to a PNG.
    Plot(plot::Args),
    /// Run the rendezvous of a multi-machine data-parallel run (`training.nodes`).
    Orchestrator(orchestrator::Args),
    /// Serve a model over an OpenAI-compatible HTTP API with continuous batching.
    Serve(serve::Args),
}

/// What `main` asks of a command before running it: whether it trains, and the log level it shows by default.
impl Command {
    /// Whether the command runs training steps (`train`, `bench --suite train`), for which the allocator keeps
    /// freed buffers ([`crate::allocator`]).
    pub fn trains(&self) -> bool {
        match self {
            Command::Train(_) => true,
            Command::Bench(args) => matches!(args.suite, Some(bench::Suite::Train)),
            _ => false,
        }
    }

    /// Log records shown unless `RUST_LOG` says otherwise: the orchestrator reports its connections; every other
    /// command shows warnings only (a training node's libraries log each tensor transfer at `info`).
    pub fn default_log_level(&self, ctx: &Context) -> &'static str {
        match self {
            Command::Orchestrator(_) if !ctx.quiet => "info",
            _ => "warn",
        }
    }
}

/// Runs the chosen subcommand.
pub fn run(command: Command, ctx: &Context) -> anyhow::Result<()> {
    match command {
        Command::Train(args) => train::run(args, ctx),
        Command::Generate(args) => generate::run(args, ctx),
        Command::Bench(args) => bench::run(args, ctx),
        Command::Tokenize(args) => tokenize::run(args, ctx),
        Command::TrainTokenizer(args) => train_tokenizer::run(args, ctx),
        Command::Prepare(args) => prepare::run(args, ctx),
        Command::Eval(args) => eval::run(args, ctx),
        Command::Quantize(args) => quantize::run(args, ctx),
        Command::Export(args) => export::run(args, ctx),
        Command::Logits(args) => logits::run(args, ctx),
        Command::Info(args) => info::run(args, ctx),
        Command::Plot(args) => plot::run(args, ctx),
        Command::Orchestrator(args) => orchestrator::run(args, ctx),
        Command::Serve(args) => serve::run(args, ctx),
    }
}
