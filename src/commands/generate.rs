//! `ember generate`: generate text from a model directory or GGUF file.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use ember_inference::sampling::SamplingConfig;
use ember_inference::{
    ChatTemplate, Conversation, Generation, GenerationConfig, InferenceError, KvCacheKind, Message,
    ModelAssets, TransformerLm, generate,
};
use ember_model::EmberBackend;
use ember_tokenizer::Tokenizer;

use crate::Context;
use crate::backend::BackendJob;
use crate::commands::model_args::{KvCacheArgs, ModelArgs};

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The generated text, streamed as it is decoded.
    Text,
    /// One JSON object per prompt: prompt_ids, ids, text, finish_reason and timings.
    Json,
}

/// Flags of `ember generate`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("input").args(["prompt", "tokens", "prompt_file"])))]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt text [one of --prompt, --tokens, --prompt-file, unless --interactive].
    #[arg(long)]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids, for models without a tokenizer, e.g. `1,2,3`.
    #[arg(long, value_delimiter = ',')]
    pub tokens: Option<Vec<u32>>,
    /// File with one prompt per line, generated as one left-padded batch.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Sampling temperature: a finite number >= 0 (0 is greedy) [default: 0.8].
    #[arg(long, default_value_t = 0.8, value_parser = crate::flags::temperature)]
    pub temperature: f32,
    /// Sample only from the k most likely tokens: an integer >= 1 [default: off].
    #[arg(long, value_parser = crate::flags::top_k)]
    pub top_k: Option<usize>,
    /// Sample from the smallest set of tokens whose probability reaches p: a number in (0, 1] [default: off].
    #[arg(long, value_parser = crate::flags::top_p)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than this fraction of the most likely one: a number in [0, 1) [default: off].
    #[arg(long, value_parser = crate::flags::min_p)]
    pub min_p: Option<f32>,
    /// Hugging Face repetition penalty, e.g. 1.1: a finite number > 0 (1 is none) [default: off].
    #[arg(long, value_parser = crate::flags::repetition_penalty)]
    pub repetition_penalty: Option<f32>,
    /// Subtracted from a token's logit per earlier occurrence: a finite number (0 is none) [default: off].
    #[arg(long, value_parser = crate::flags::additive_penalty)]
    pub frequency_penalty: Option<f32>,
    /// Subtracted from a token's logit if it occurred before: a finite number (0 is none) [default: off].
    #[arg(long, value_parser = crate::flags::additive_penalty)]
    pub presence_penalty: Option<f32>,
    /// Random seed; prompt `i` of a batch uses seed + i [default: 0].
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Maximum tokens to generate per prompt, 1..=1048576; generation also stops at the context window
    /// [default: 128].
    #[arg(long, default_value_t = 128, value_parser = crate::flags::token_count)]
    pub max_new_tokens: usize,
    /// Stop when the text contains this string (repeatable) [default: none].
    #[arg(long)]
    pub stop: Vec<String>,
    /// Drop the oldest prompt tokens when a prompt exceeds the context window, instead of failing [default: off].
    #[arg(long)]
    pub truncate: bool,
    /// Keep generating past the end-of-sequence token [default: off].
    #[arg(long)]
    pub ignore_eos: bool,
    /// Output format [default: text].
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Wrap the prompt in the model's chat template as a user message [default: off].
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat [default: the template's own, if any].
    #[arg(long)]
    pub system: Option<String>,
    /// Chat turn by turn: read user messages from stdin, one per line, keeping the KV cache between turns
    /// [default: off].
    #[arg(long)]
    pub interactive: bool,
    #[command(flatten)]
    pub kv: KvCacheArgs,
}

/// What to run once the backend is chosen.
enum Work {
    /// One batch of prompts.
    Batch(Vec<Vec<u32>>),
    /// A chat read from stdin.
    Interactive,
}

struct GenerateJob {
    assets: ModelAssets,
    work: Work,
    config: GenerationConfig,
    args: Args,
    kv_cache: KvCacheKind,
    quiet: bool,
}

impl BackendJob for GenerateJob {
    type Output = anyhow::Result<()>;

    fn run<B: EmberBackend>(self, device: B::Device) -> Self::Output {
        let model = self
            .args
            .model
            .load::<B>(&self.assets, &device, self.quiet)?;
        let lm = TransformerLm::new(model, device).with_kv_cache(self.kv_cache);
        let tokenizer = self.assets.tokenizer.as_ref();
        match &self.work {
            Work::Batch(prompts) => {
                run_batch(&lm, tokenizer, prompts, &self.config, self.args.format)
            }
            Work::Interactive => run_interactive(&lm, &self.assets, &self.args, &self.config),
        }
    }
}

fn run_batch<B: EmberBackend>(
    lm: &TransformerLm<B>,
    tokenizer: Option<&Tokenizer>,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
    format: Format,
) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    // A single prompt in text mode streams; a batch prints each row whole once done (rows interleave otherwise).
    let stream = format == Format::Text && prompts.len() == 1;
    let mut on_text = |_: usize, piece: &str| {
        if stream {
            // A closed pipe (e.g. `| head`) only ends the stream early; the generation itself still completes.
            let _ = write!(stdout, "{piece}").and_then(|()| stdout.flush());
        }
    };
    let generations = generate(lm, tokenizer, prompts, config, &mut on_text).map_err(|e| {
        let full = matches!(e, InferenceError::KvCache(_));
        let e = anyhow::Error::from(e);
        if full {
            e.context(
                "the paged KV cache is full: raise --kv-budget-mib or pass fewer prompts at once",
            )
        } else {
            e
        }
    })?;
    let mut stdout = std::io::stdout().lock();
    for g in &generations {
        match format {
            Format::Json => writeln!(stdout, "{}", json_line(g)),
            Format::Text if stream => writeln!(stdout),
            Format::Text if tokenizer.is_some() => writeln!(stdout, "{}", g.text),
            Format::Text => writeln!(stdout, "{}", ids_text(&g.ids)),
        }
        .and_then(|()| stdout.flush())
        .map_err(super::StdoutError)?;
    }
    Ok(())
}

fn ids_text(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn json_line(g: &Generation) -> serde_json::Value {
    serde_json::json!({
        "prompt_ids": g.prompt_ids,
        "ids": g.ids,
        "text": g.text,
        "finish_reason": g.finish_reason.as_str(),
        "ttft_s": g.time_to_first_token.as_secs_f64(),
        "prefill_tokens_per_s": g.prefill_tokens_per_second(),
        "decode_tokens_per_s": g.decode_tokens_per_second(),
        "new_tokens": g.ids.len(),
        "kv_cache_bytes": g.kv_cache_bytes,
    })
}

/// The chat loop: each stdin line is a user message; only the new part of the rendered conversation is run.
fn run_interactive<B: EmberBackend>(
    lm: &TransformerLm<B>,
    assets: &ModelAssets,
    args: &Args,
    config: &GenerationConfig,
) -> anyhow::Result<()> {
    let tokenizer = assets
        .tokenizer
        .as_ref()
        .context("--interactive needs a model with a tokenizer")?;
    let template = assets.chat_template.as_ref();
    let mut chat = Conversation::new(lm, &config.sampling)?;
    let mut messages: Vec<Message> = args
        .system
        .iter()
        .map(|s| Message::new("system", s))
        .collect();
    // The text the cache holds: rendered prompts plus the model's replies, token for token.
    let mut cached_text = String::new();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        messages.push(Message::new("user", &line));
        let rendered = match template {
            Some(t) => t.render(&messages, true)?,
            None => format!("{cached_text}{line}\n"),
        };
        let Some(new_text) = rendered.strip_prefix(cached_text.as_str()) else {
            bail!(
                "the chat template re-renders earlier turns differently; --interactive needs an append-only template"
            );
        };
        let ids = tokenizer.encode(new_text)?;
        let mut stdout = std::io::stdout().lock();
        let reply = chat.turn(lm, &ids, Some(tokenizer), config, &mut |piece| {
            let _ = write!(stdout, "{piece}").and_then(|()| stdout.flush());
        })?;
        writeln!(stdout)
            .and_then(|()| stdout.flush())
            .map_err(super::StdoutError)?;
        cached_text = format!("{rendered}{}", tokenizer.decode(&reply.ids)?);
        messages.push(Message::new("assistant", &reply.text));
    }
    Ok(())
}

/// The prompt ids of each input, templated with --chat.
fn prompt_ids(
    args: &Args,
    tokenizer: Option<&Tokenizer>,
    template: Option<&ChatTemplate>,
) -> anyhow::Result<Vec<Vec<u32>>> {
    if let Some(ids) = &args.tokens {
        return Ok(vec![ids.clone()]);
    }
    let texts: Vec<String> = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => vec![p.clone()],
        (None, Some(file)) => std::fs::read_to_string(file)
            .with_context(|| format!("reading --prompt-file {}", file.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
        (None, None) => bail!("give --prompt, --tokens or --prompt-file (or --interactive)"),
    };
    if texts.is_empty() {
        bail!("--prompt-file has no prompts");
    }
    let tokenizer =
        tokenizer.context("--prompt needs a model with a tokenizer (give --tokens instead)")?;
    texts
        .iter()
        .map(|text| {
            if args.chat {
                let template = template.context("--chat: the model has no chat template")?;
                let mut messages: Vec<Message> = args
                    .system
                    .iter()
                    .map(|s| Message::new("system", s))
                    .collect();
                messages.push(Message::new("user", text));
                // Templates write the BOS themselves (`{{ bos_token }}`), as HF's `apply_chat_template` expects.
                Ok(tokenizer.encode(&template.render(&messages, true)?)?)
            } else {
                // A plain prompt starts as the tokenizer declares (a GGUF file's `add_bos_token`), as HF's
                // `tokenizer(prompt)` and llama.cpp's prompt tokenization do.
                Ok(tokenizer.encode_with_special(text)?)
            }
        })
        .collect()
}

/// Runs `ember generate`.
pub fn run(args: Args, ctx: &Context) -> anyhow::Result<()> {
    let assets = args.model.open()?;
    let work = if args.interactive {
        Work::Interactive
    } else {
        Work::Batch(prompt_ids(
            &args,
            assets.tokenizer.as_ref(),
            assets.chat_template.as_ref(),
        )?)
    };
    let sampling = SamplingConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        frequency_penalty: args.frequency_penalty,
        presence_penalty: args.presence_penalty,
        logit_bias: Vec::new(),
        seed: args.seed,
    };
    let config = GenerationConfig {
        max_new_tokens: args.max_new_tokens,
        sampling,
        stop: args.stop.clone(),
        eos: if args.ignore_eos {
            Vec::new()
        } else {
            assets.eos.clone()
        },
        truncate: args.truncate,
    };
    let kv_cache = args.kv.kind()?;
    let job = GenerateJob {
        assets,
        work,
        config,
        args,
        kv_cache,
        quiet: ctx.quiet,
    };
    ctx.dispatch(None, job)?
}
