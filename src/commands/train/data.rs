//! The run's data: a text corpus tokenized into shards (prepared once per tokenizer and cached under
//! `data.cache_dir`), or chat conversations rendered with `model.from`'s chat template into one row each; and the
//! trainer's view of either.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use ember_dataset::{DocumentEncoder as _, PrepareOptions, Split, TokenDataset, TokenizerEncoder};
use ember_inference::ModelAssets;
use ember_tokenizer::Tokenizer;
use ember_training::{ChatData, ShardData, TrainData};

use crate::Context;
use crate::commands::chat_data;
use crate::config::{DataFormat, RunConfig};

/// The prepared training data: shards of a text corpus, or chat rows (small enough to hold in memory: a row
/// per conversation).
pub(super) enum JobData {
    /// The directory of the prepared shards.
    Shards(PathBuf),
    /// Training and validation rows of `model.block_size + 1` ids.
    Chat {
        train: Vec<Vec<u32>>,
        val: Vec<Vec<u32>>,
    },
}

impl JobData {
    /// The data `config` names, prepared for `tokenizer` (loaded from `tokenizer_path`), and the tokenizer back:
    /// shards are encoded by a [`TokenizerEncoder`], which holds it while they are written.
    pub(super) fn prepare(
        config: &RunConfig,
        base: Option<&ModelAssets>,
        tokenizer: Tokenizer,
        tokenizer_path: &Path,
        ctx: &Context,
    ) -> anyhow::Result<(Self, Tokenizer)> {
        match (config.data.format, base) {
            (DataFormat::Chat, Some(base)) => {
                let (train, val) = chat(config, base, &tokenizer)?;
                Ok((JobData::Chat { train, val }, tokenizer))
            }
            // `RunConfig::validate` refuses chat data without model.from.
            (DataFormat::Chat, None) => bail!("data.format chat needs model.from"),
            (DataFormat::Text, _) => {
                let encoder = TokenizerEncoder::new(tokenizer, tokenizer_path)?;
                let dir = ensure_dataset(config, &encoder, ctx)?;
                Ok((JobData::Shards(dir), encoder.into_tokenizer()))
            }
        }
    }

    /// The trainer's reader of this data: micro-batches of `batch_size` windows of `block_size` tokens drawn in
    /// the order `seed` gives, `eval_batches` validation batches, and bits per byte measured with `tokenizer`.
    pub(super) fn into_train_data(
        self,
        tokenizer: &Tokenizer,
        batch_size: usize,
        block_size: usize,
        eval_batches: usize,
        seed: u64,
    ) -> anyhow::Result<Box<dyn TrainData>> {
        let bytes_of = |ids: &[u32]| tokenizer.decode_bytes(ids).map_or(0, |b| b.len());
        Ok(match self {
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
                    seed,
                )
                .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
                Box::new(data.bytes_per_token_of(bytes_of))
            }
            JobData::Chat { train, val } => {
                let data = ChatData::new(train, val, batch_size, block_size, eval_batches, seed)
                    .map_err(|e| anyhow::anyhow!("data.inputs: {e}"))?;
                Box::new(data.bytes_per_token_of(bytes_of))
            }
        })
    }
}

/// Training and validation rows of a chat corpus: the directory `ember prepare --format chat` wrote, or JSONL
/// files rendered here with `base`'s chat template.
fn chat(
    config: &RunConfig,
    base: &ModelAssets,
    tokenizer: &Tokenizer,
) -> anyhow::Result<chat_data::SplitRows> {
    let block_size = config.model.block_size;
    let prepared = chat_data::prepared_rows(
        &config.data.inputs,
        &base.path,
        tokenizer.vocab_size(),
        block_size,
    )?;
    if let Some(rows) = prepared {
        return Ok(rows);
    }
    let template = chat_data::base_template(base.chat_template.as_ref(), &base.path)?;
    chat_data::chat_rows(
        &text_files(&config.data.inputs)?,
        template,
        tokenizer,
        block_size,
        config.data.val_fraction,
    )
}

/// Every regular file of `inputs`, directories walked in sorted order.
pub(super) fn text_files(inputs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
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

/// The prepared corpus directory for `encoder`'s tokenizer, preparing it when missing or stale: the directory is
/// named by the tokenizer's fingerprint, so a run with another tokenizer never reads these shards.
fn ensure_dataset(
    config: &RunConfig,
    encoder: &TokenizerEncoder,
    ctx: &Context,
) -> anyhow::Result<PathBuf> {
    let fingerprint = encoder.fingerprint();
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
    let mut options = PrepareOptions::new(config.data.inputs.clone(), dir.clone());
    options.val_fraction = config.data.val_fraction;
    options.text_field = config.data.text_field.clone();
    let report = ember_dataset::prepare(encoder, &options, &|_| {})
        .with_context(|| format!("preparing the corpus into {}", dir.display()))?;
    if !ctx.quiet {
        for warning in report.warnings {
            stderr!("warning: {warning}");
        }
    }
    Ok(dir)
}
