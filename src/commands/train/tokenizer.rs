//! The run's tokenizer: `model.from`'s own, the file `tokenizer.path` names, or a byte-level BPE trained on the
//! corpus and cached under `data.cache_dir`; and the `tokenizer.json` each checkpoint of a new model copies.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use ember_dataset::stable_hash;
use ember_inference::ModelAssets;
use ember_tokenizer::{NoProgress, Tokenizer};

use super::data::text_files;
use crate::Context;
use crate::config::RunConfig;

/// The tokenizer the run encodes with, and the path that identifies it for the prepared-data cache.
pub(super) fn resolve(
    config: &RunConfig,
    base: Option<&ModelAssets>,
    ctx: &Context,
) -> anyhow::Result<(Tokenizer, PathBuf)> {
    if let Some(base) = base {
        return base_tokenizer(base, config);
    }
    let path = ensure_tokenizer(config, ctx)?;
    let tokenizer = crate::commands::tokenize::open_tokenizer(&path)
        .with_context(|| format!("loading tokenizer {}", path.display()))?;
    Ok((tokenizer, path))
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

/// The `tokenizer.json` to copy into every checkpoint: the file itself, or a model directory's. A tokenizer of
/// another format (a GGUF vocabulary, tiktoken ranks) is not copied (a checkpoint's tokenizer must be
/// `tokenizer.json`), which is said once.
pub(super) fn checkpoint_tokenizer(path: &Path, quiet: bool) -> Option<PathBuf> {
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
