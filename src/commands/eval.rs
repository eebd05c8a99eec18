//! `ember eval`: perplexity and bits per byte of a model on held-out text, e.g. to measure what quantization
//! costs.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, bail};
use ember_inference::{ModelAssets, WeightFormat, perplexity};
use ember_model::EmberBackend;

use crate::Context;
use crate::backend::BackendJob;
use crate::commands::model_args::{ModelArgs, load_with_progress};

/// Flags of `ember eval`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// UTF-8 text to score [default: data/tinyshakespeare.txt].
    #[arg(long, default_value = "data/tinyshakespeare.txt")]
    pub text: PathBuf,
    /// Score only this last fraction of the text, from the first line start inside it: the text analogue of
    /// `ember prepare`'s contiguous-tail validation split, comparable across tokenizers; 1 scores everything
    /// A fraction in (0, 1] [default: 0.1].
    #[arg(long, default_value_t = 0.1, value_parser = crate::flags::fraction_up_to_one)]
    pub tail: f64,
    /// Tokens per scoring window (each window's first token is context only), 2..=1048576; a window longer
    /// than the model's context length is cut to it [default: 256].
    #[arg(long, default_value_t = 256, value_parser = crate::flags::two_or_more_tokens)]
    pub window: usize,
    /// Windows per forward pass, 1..=1024 [default: 4].
    #[arg(long, default_value_t = 4, value_parser = crate::flags::batch)]
    pub batch: usize,
    /// Score at most this many tokens from the start of the tail, an integer >= 1 [default: all].
    #[arg(long, value_parser = crate::flags::positive)]
    pub max_tokens: Option<usize>,
    /// With --quantize: also score the f32 model and report the fraction of positions where both predict the
    /// same next token (`top1_agreement`), the closest measure of what quantization changes in greedy output;
    /// scores the text twice [default: off].
    #[arg(long, requires = "quantize")]
    pub compare_f32: bool,
    /// Print one JSON object instead of text [default: off].
    #[arg(long)]
    pub json: bool,
}

/// The part of `text` that `tail` selects: from the first line start at or after byte `len * (1 - tail)`.
fn tail_of(text: &str, tail: f64) -> &str {
    if tail >= 1.0 {
        return text;
    }
    let cut = ((text.len() as f64) * (1.0 - tail)) as usize;
    let start = text
        .char_indices()
        .map(|(i, _)| i)
        .find(|&i| i >= cut && (i == 0 || text.as_bytes()[i - 1] == b'\n'))
        .unwrap_or(text.len());
    &text[start..]
}

/// Largest logits tensor one scoring pass may produce: `[batch, window, vocab]` f32. 8 GiB is what a 16 GB machine
/// or device holds next to the model; past it the allocation aborts the process instead of failing.
const MAX_LOGITS_BYTES: u128 = 8 << 30;

/// Refuses `--batch` × `--window` whose logits would pass [`MAX_LOGITS_BYTES`], saying how much they would take.
fn check_logits_memory(batch: usize, window: usize, vocab: usize) -> anyhow::Result<()> {
    let bytes = batch as u128 * window as u128 * vocab as u128 * 4;
    if bytes > MAX_LOGITS_BYTES {
        bail!(
            "--batch {batch} × --window {window}: the [batch, window, {vocab}] f32 logits of one pass would take \
             {:.1} GiB, above the limit of {} GiB; lower --batch or --window",
            bytes as f64 / (1u64 << 30) as f64,
            MAX_LOGITS_BYTES >> 30
        );
    }
    Ok(())
}

struct EvalJob {
    assets: ModelAssets,
    ids: Vec<u32>,
    bytes: usize,
    args: Args,
    precision: WeightFormat,
    quiet: bool,
}

impl BackendJob for EvalJob {
    type Output = anyhow::Result<serde_json::Value>;

    fn run<B: EmberBackend>(self, device: B::Device) -> Self::Output {
        let model = self
            .args
            .model
            .load::<B>(&self.assets, &device, self.quiet)?;
        let window = self.args.window.min(model.spec().context_length);
        check_logits_memory(self.args.batch, window, model.spec().vocab_size)?;
        let bar = super::progress_bar(
            self.quiet,
            Some(0),
            "scoring {bar:30} {pos}/{len} windows {elapsed}",
        );
        let start = Instant::now();
        let weight_bytes = model.weight_memory_bytes();
        let compare = self.args.compare_f32;
        let score = |model: &ember_model::Transformer<B>| {
            perplexity(
                model,
                &self.ids,
                window,
                self.args.batch,
                compare,
                |done, total| {
                    bar.set_length(total as u64);
                    bar.set_position(done as u64);
                },
            )
        };
        let result = score(&model)?;
        // The f32 model is loaded only once the quantized one is gone, so the two are never resident together.
        let reference = if self.args.compare_f32 {
            drop(model);
            let f32_model =
                load_with_progress::<B>(&self.assets, &device, &WeightFormat::F32, self.quiet)?;
            Some(score(&f32_model)?)
        } else {
            None
        };
        bar.finish_and_clear();
        Ok(serde_json::json!({
            "model": self.args.model.model.display().to_string(),
            "text": self.args.text.display().to_string(),
            "tail": self.args.tail,
            "precision": self.precision.label(),
            "weight_bytes": weight_bytes,
            "window": window,
            "tokens": self.ids.len(),
            "scored_tokens": result.tokens,
            "bytes": self.bytes,
            "loss": result.mean_nll(),
            "perplexity": result.perplexity(),
            "bits_per_byte": result.bits_per_byte(self.bytes),
            "seconds": start.elapsed().as_secs_f64(),
            "f32_perplexity": reference.as_ref().map(|r| r.perplexity()),
            "top1_agreement": reference.as_ref().and_then(|r| result.top1_agreement(r)),
        }))
    }
}

/// Runs `ember eval`.
pub fn run(args: Args, ctx: &Context) -> anyhow::Result<()> {
    let precision = args.model.load.quantize.weight_format()?;
    let assets = args.model.open()?;
    let tokenizer = assets.tokenizer.as_ref().with_context(|| {
        format!(
            "{}: eval needs the model's tokenizer",
            args.model.model.display()
        )
    })?;
    let text = std::fs::read_to_string(&args.text)
        .with_context(|| format!("reading --text {}", args.text.display()))?;
    let text = tail_of(&text, args.tail);
    let mut ids = tokenizer.encode(text)?;
    if let Some(max) = args.max_tokens {
        ids.truncate(max);
    }
    if ids.len() < 2 {
        bail!(
            "{}: the selected text has fewer than 2 tokens",
            args.text.display()
        );
    }
    // Bits per byte count the bytes the scored ids cover, so --max-tokens keeps the figure honest.
    let bytes = if args.max_tokens.is_some() {
        tokenizer.decode(&ids)?.len()
    } else {
        text.len()
    };
    let json = args.json;
    let job = EvalJob {
        assets,
        ids,
        bytes,
        args,
        precision,
        quiet: ctx.quiet,
    };
    let report = ctx.dispatch(None, job)??;
    if json {
        super::println(&report.to_string())?;
    } else {
        super::println(&format!(
            "{} ({}, weights {:.1} MiB): {} tokens in windows of {}, loss {:.4} nats, perplexity {:.3}, \
             {:.4} bits/byte ({:.1} s)",
            report["model"].as_str().unwrap_or_default(),
            report["precision"].as_str().unwrap_or_default(),
            report["weight_bytes"].as_f64().unwrap_or_default() / (1024.0 * 1024.0),
            report["scored_tokens"],
            report["window"],
            report["loss"].as_f64().unwrap_or_default(),
            report["perplexity"].as_f64().unwrap_or_default(),
            report["bits_per_byte"].as_f64().unwrap_or_default(),
            report["seconds"].as_f64().unwrap_or_default(),
        ))?;
        if let Some(agreement) = report["top1_agreement"].as_f64() {
            super::println(&format!(
                "f32: perplexity {:.3}; the same top-1 prediction at {:.1}% of the positions",
                report["f32_perplexity"].as_f64().unwrap_or_default(),
                100.0 * agreement
            ))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::tail_of;

    #[test]
    fn logits_past_the_memory_limit_are_refused_naming_both_flags() {
        assert!(super::check_logits_memory(4, 2048, 49_152).is_ok());
        let err = super::check_logits_memory(1024, 2048, 49_152).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("--batch 1024") && text.contains("--window 2048"),
            "{text}"
        );
    }

    #[test]
    fn tail_starts_at_a_line() {
        let text = "first line\nsecond line\nthird\n";
        assert_eq!(tail_of(text, 1.0), text);
        assert_eq!(tail_of(text, 0.5), "third\n");
        assert_eq!(tail_of(text, 0.01), "");
        // The cut lands inside the first line (byte 2 of 6); scoring starts at the next line.
        assert_eq!(tail_of("é\né\n", 0.6), "é\n");
    }
}
