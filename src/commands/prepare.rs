//! `ember prepare`: tokenize documents into training shards.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use ember_dataset::clean::CleanOptions;
use ember_dataset::{DEFAULT_SHARD_TOKENS, PrepareOptions, Progress, TokenizerEncoder, prepare};

use crate::Context;

/// Flags of `ember prepare`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Tokenizer: a tokenizer.json (or other tokenizer file), a GGUF file (its vocabulary) or a model directory
    /// holding one.
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// Input text files, directories of them (walked recursively, sorted, hidden files skipped) or .jsonl files.
    #[arg(long, required = true, num_args = 1..)]
    pub input: Vec<PathBuf>,
    /// Output directory for the shards and manifest.json (created if missing; an earlier preparation there is
    /// replaced).
    #[arg(long)]
    pub output: PathBuf,
    /// Fraction of the corpus held out for validation, in (0, 1) [default: 0.1].
    #[arg(long, default_value_t = ember_dataset::DEFAULT_VAL_FRACTION, value_parser = crate::flags::open_fraction)]
    pub val_fraction: f64,
    /// JSONL field holding each document's text [default: text].
    #[arg(long, default_value = "text")]
    pub text_field: String,
    /// Maximum number of tokens per shard file, an integer >= 1 [default: 67108864].
    #[arg(long, default_value_t = DEFAULT_SHARD_TOKENS, value_parser = crate::flags::shard_tokens)]
    pub shard_tokens: u64,
    /// What the inputs hold: `text` (documents, tokenized into shards) or `chat` (JSONL conversations rendered
    /// with the chat template of the model given as --tokenizer, one padded row each, trained on the replies; for
    /// `data.format: chat` with the output directory as the only `data.inputs`) [default: text].
    #[arg(long, value_enum, default_value_t = PrepareFormat::Text)]
    pub format: PrepareFormat,
    /// Chat rows' block size: the run's `model.block_size` (rows hold block_size + 1 tokens); required with
    /// `--format chat`.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub block_size: Option<u64>,
    /// Clean chat/e-mail text first: normalise whitespace, strip quoted replies and signatures, redact e-mail
    /// addresses, URLs, phone numbers and long digit runs [default: off].
    #[arg(long)]
    pub clean: bool,
}

/// What `ember prepare` reads.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrepareFormat {
    /// Documents: text files, directories of them, JSONL with a text field.
    Text,
    /// OpenAI-style chat JSONL for fine-tuning.
    Chat,
}

/// Runs `ember prepare`.
pub fn run(args: Args, ctx: &Context) -> anyhow::Result<()> {
    if args.format == PrepareFormat::Chat {
        return prepare_chat(&args, ctx);
    }
    let tokenizer = super::tokenize::open_tokenizer(&args.tokenizer)
        .with_context(|| format!("loading tokenizer {}", args.tokenizer.display()))?;
    let encoder = TokenizerEncoder::new(tokenizer, &args.tokenizer)?;
    let options = PrepareOptions {
        val_fraction: args.val_fraction,
        text_field: args.text_field,
        shard_tokens: args.shard_tokens,
        clean: args.clean.then(CleanOptions::all),
        ..PrepareOptions::new(args.input, args.output.clone())
    };
    let bar = super::progress_bar(
        ctx.quiet,
        None,
        "{spinner} {bytes}/{total_bytes} {wide_bar} {bytes_per_sec} eta {eta}",
    );
    let progress = |p: Progress| {
        bar.set_length(p.bytes_total);
        bar.set_position(p.bytes_done.max(bar.position()));
    };
    let started = Instant::now();
    let report = prepare(&encoder, &options, &progress)
        .with_context(|| format!("preparing {}", args.output.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    for warning in &report.warnings {
        stderr!("warning: {warning}");
    }
    if !ctx.quiet {
        let m = &report.manifest;
        let bytes: u64 = m.inputs.iter().map(|i| i.bytes).sum();
        let tokens = m.train.tokens + m.val.tokens;
        stderr!(
            "prepared {} documents ({} MB) into {} shards in {}: train {} tokens, val {} tokens ({:?}, {:?})",
            m.inputs.iter().map(|i| i.documents).sum::<u64>() - m.skipped_empty_documents,
            bytes as f64 / 1e6,
            m.shards.len(),
            args.output.display(),
            m.train.tokens,
            m.val.tokens,
            m.dtype,
            m.split_method,
        );
        stderr!(
            "{seconds:.2} s: {:.2} MB/s, {:.0} tokens/s",
            bytes as f64 / 1e6 / seconds.max(1e-9),
            tokens as f64 / seconds.max(1e-9)
        );
    }
    Ok(())
}

/// `ember prepare --format chat`: the rows `ember train` would build from these conversations, written once.
fn prepare_chat(args: &Args, ctx: &Context) -> anyhow::Result<()> {
    let Some(block_size) = args.block_size else {
        anyhow::bail!("--block-size: required with --format chat (the run's model.block_size)");
    };
    if args.clean {
        anyhow::bail!("--clean: applies to --format text only");
    }
    let started = Instant::now();
    let assets = ember_inference::ModelAssets::open(&args.tokenizer).with_context(|| {
        format!(
            "--tokenizer {}: --format chat needs a model (a Hugging Face directory or a GGUF file) for its chat \
             template",
            args.tokenizer.display()
        )
    })?;
    let tokenizer = assets.tokenizer.as_ref().with_context(|| {
        format!(
            "--tokenizer {}: the model has no tokenizer",
            args.tokenizer.display()
        )
    })?;
    let template = super::chat_data::base_template(assets.chat_template.as_ref(), &args.tokenizer)?;
    let block_size = block_size as usize;
    let (train, val) = super::chat_data::chat_rows(
        &args.input,
        template,
        tokenizer,
        block_size,
        args.val_fraction,
    )?;
    let rows = ember_dataset::ChatRows {
        width: block_size + 1,
        tokenizer: ember_dataset::fingerprint_path(&args.tokenizer)?,
        train,
        val,
    };
    rows.save(&args.output)
        .with_context(|| format!("writing {}", args.output.display()))?;
    if !ctx.quiet {
        let trained: usize = rows
            .train
            .iter()
            .chain(&rows.val)
            .flatten()
            .filter(|&&id| id & ember_dataset::NO_LOSS == 0)
            .count();
        stderr!(
            "prepared {} training and {} validation conversations into {} (rows of {} tokens, {trained} of them \
             trained on) in {:.2} s",
            rows.train.len(),
            rows.val.len(),
            args.output.display(),
            rows.width,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
