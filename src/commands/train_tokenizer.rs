//! `ember train-tokenizer`: learn a byte-level BPE tokenizer.

use std::time::Instant;

use anyhow::Context as _;
use ember_tokenizer::{BpeTrainer, TrainProgress};
use indicatif::{ProgressBar, ProgressStyle};

use crate::Context;

/// Flags of `ember train-tokenizer`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Text files to learn from (UTF-8; each file is one document).
    #[arg(long, required = true, num_args = 1..)]
    pub input: Vec<std::path::PathBuf>,
    /// Directory to write tokenizer.json into (created if missing).
    #[arg(long)]
    pub output: std::path::PathBuf,
    /// Vocabulary size, special tokens and the 256 byte tokens included, 256..=1048576 [default: 8192].
    #[arg(long, default_value_t = 8192, value_parser = crate::flags::vocab_size)]
    pub vocab_size: usize,
    /// Special tokens, given the first ids in this order [default: <|endoftext|>].
    #[arg(long, num_args = 0.., default_values_t = ["<|endoftext|>".to_string()])]
    pub special_tokens: Vec<String>,
    /// Never merge a pair seen fewer times than this [default: 0].
    #[arg(long, default_value_t = 0)]
    pub min_frequency: u64,
}

/// Draws one progress bar per training phase.
struct Bar {
    bar: Option<ProgressBar>,
    quiet: bool,
}

impl TrainProgress for Bar {
    fn phase(&mut self, name: &str, total: u64) {
        if let Some(old) = self.bar.take() {
            old.finish();
        }
        if self.quiet {
            return;
        }
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("{msg:>16} [{bar:40}] {pos}/{len} ({elapsed})")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar.set_message(name.to_owned());
        self.bar = Some(bar);
    }

    fn advance(&mut self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(done);
        }
    }
}

/// Runs `ember train-tokenizer`.
pub fn run(args: Args, ctx: &Context) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut progress = Bar {
        bar: None,
        quiet: ctx.quiet,
    };
    let trained = BpeTrainer::new(args.vocab_size)
        .special_tokens(args.special_tokens.iter().cloned())
        .min_frequency(args.min_frequency)
        .train_files(&args.input, &mut progress)?;
    if let Some(bar) = progress.bar.take() {
        bar.finish();
    }
    let path = trained
        .save(&args.output)
        .with_context(|| format!("writing into {}", args.output.display()))?;
    if !ctx.quiet {
        stderr!(
            "wrote {} ({} merges, {:.1}s)",
            path.display(),
            trained.num_merges(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
